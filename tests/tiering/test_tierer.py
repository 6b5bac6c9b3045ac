"""Tiering end to end: a real local log, a real object store (filesystem and SeaweedFS),
a real SQLite MetaStore; crashes at every step of the commit protocol, zombie writers,
delete-and-recreate, and a quiet stream."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.plugins.tiering_world import LOG, SMALL, World
from tierlog.log.config import LogConfig
from tierlog.log.errors import BackPressureError
from tierlog.log.writer import StreamLog
from tierlog.remote.errors import StreamDeletedError
from tierlog.remote.keys import data_prefix
from tierlog.storage.errors import TransientError
from tierlog.storage.meta_store import MetaStore, Versioned
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.cleanup import run_stream_cleanups
from tierlog.tiering.errors import FragmentConflictError
from tierlog.tiering.tierer import StreamTierer


def assert_manifest_matches_log(world: World, tierer: StreamTierer) -> None:
    local = world.local_chunks()
    remote = world.remote_chunks(tierer)
    durable = tierer.durable_next
    expected = {cid: raw for cid, raw in local.items() if cid < durable}
    assert remote == expected
    # Contiguous [first, next) coverage with no gap.
    tree = tierer.committer.tree
    assert tree.first_offset == 0
    assert tree.next_offset == durable


def test_tiers_everything_and_bytes_are_identical(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    world.append(60)
    assert tierer.flush(timeout=30)
    assert tierer.durable_next == world.log.commit_point().next_offset
    assert_manifest_matches_log(world, tierer)
    assert tierer.committer.tree.height >= 2  # small M folds into branches
    # Segments wholly below the durable offset are deletable, the active one never.
    deletable = tierer.deletable_segments()
    segments = world.log.list_segments()
    assert deletable and segments[-1].first_offset not in deletable
    assert all(
        s.next_offset <= tierer.durable_next for s in segments if s.first_offset in deletable
    )


def test_restart_resumes_without_duplicates(world: World) -> None:
    first = world.tierer()
    first.start()
    world.append(20)
    assert first.flush()
    first.stop(flush=False)
    world.append(20)
    second = world.tierer()
    result = second.start()
    assert result.next_offset == first.durable_next
    assert second.flush()
    assert_manifest_matches_log(world, second)


@pytest.mark.parametrize(
    "crash_point",
    ["after-fragment-put", "after-root-put", "pointer-applied-reported-failed", "before-pointer"],
)
def test_crash_at_each_commit_step_then_resolve(world: World, crash_point: str) -> None:
    class CrashingMeta(SqliteMetaStore):
        """Fails the pointer's conditional put, before or after it takes effect."""

        armed = False
        applied = False

        def put_if(self, key: str, value: bytes, expected_version: int, epoch: int) -> Versioned:
            if self.armed and key.startswith("pointer/"):
                CrashingMeta.armed = False
                if crash_point == "pointer-applied-reported-failed":
                    super().put_if(key, value, expected_version, epoch)
                    CrashingMeta.applied = True
                raise TransientError("injected: connection lost during conditional put")
            return super().put_if(key, value, expected_version, epoch)

    db = world.meta  # same database file, through the crashing wrapper
    crashing = CrashingMeta(str(Path(world.data_dir).parent / "meta.db"))
    tierer = world.tierer(meta=crashing)
    tierer.start()
    world.append(10)
    assert tierer.flush()
    before = tierer.durable_next

    meta_prefix = f"stream/{world.record.incarnation}/metadata/"
    if crash_point == "after-fragment-put":
        world.store.fail_nth("put_if_absent", 1, key_prefix=meta_prefix, times=1000)
    elif crash_point == "after-root-put":
        world.store.fail_nth("put_if_absent", 1, key_prefix=meta_prefix, after=True, times=1000)
    else:
        CrashingMeta.armed = True
    world.append(10)
    tierer.flush(timeout=1.0)
    # "Crash": abandon the tierer without flushing; its in-memory state is lost.
    tierer.stop(flush=False)
    world.store.clear_faults()
    if crash_point == "pointer-applied-reported-failed":
        # The ambiguous put was resolved by re-reading the pointer: nothing lost.
        assert CrashingMeta.applied
    live_root = world.catalog.read_pointer(world.record.incarnation)
    assert live_root is not None and live_root.root_uid is not None

    restarted = world.tierer()
    restarted.start()
    assert restarted.durable_next >= before
    assert restarted.flush()
    assert_manifest_matches_log(world, restarted)
    # The live root is never deleted: the pointer still names an existing object.
    world.deletions.run_due(world.store)
    pointer = world.catalog.read_pointer(world.record.incarnation)
    assert pointer is not None and pointer.root_uid is not None
    restarted.committer.load()
    crashing.close()
    del db


def test_fragment_put_that_succeeded_but_reported_failure_is_adopted(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    data = data_prefix("", world.record.incarnation)
    world.store.fail_nth("put_if_absent", 1, key_prefix=data, after=True)
    world.append(30)
    assert tierer.flush()
    assert_manifest_matches_log(world, tierer)
    assert world.store.count("put_if_absent", "injected-after") == 1
    assert world.store.count("put_if_absent", "error:AlreadyExistsError") >= 1


def test_failed_uploads_are_retried_and_never_block(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    data = data_prefix("", world.record.incarnation)
    world.store.fail_nth("put_if_absent", 2, key_prefix=data, times=3)
    world.append(40)
    assert tierer.flush(timeout=30)
    assert_manifest_matches_log(world, tierer)


def test_zombie_writer_cannot_overwrite_newer_commit(world: World) -> None:
    old = world.tierer(epoch=1)
    old.start()
    world.append(10)
    assert old.flush()
    new = world.tierer(epoch=2)
    new.start()  # fencing commit with epoch 2
    world.append(10)
    old.flush(timeout=2)
    assert old.halted is not None and "deposed" in old.halted
    assert new.flush()
    pointer = world.catalog.read_pointer(world.record.incarnation)
    assert pointer is not None and pointer.epoch == 2
    assert_manifest_matches_log(world, new)


def test_newer_epoch_fragment_is_not_adopted(world: World) -> None:
    # A newer owner (epoch 5) writes chunks and uploads fragments but crashes before
    # committing them; an old writer (epoch 1) resolving the stream must not adopt them.
    world.log.close()
    world.log = StreamLog.open(world.log.stream_dir, LogConfig(max_segment_bytes=40_000, epoch=5))
    newer = world.tierer(epoch=5)
    newer.start()
    meta_prefix = f"stream/{world.record.incarnation}/metadata/"
    world.store.fail_nth("put_if_absent", 1, key_prefix=meta_prefix, times=10_000)
    world.append(10)
    newer.flush(timeout=1.0)
    newer.stop(flush=False)
    world.store.clear_faults()
    assert world.store.count("put_if_absent", "ok") >= 1  # fragments are there
    old = world.tierer(epoch=1)
    with pytest.raises(FragmentConflictError, match="epoch 5"):
        old.start()
    pointer = world.catalog.read_pointer(world.record.incarnation)
    assert pointer is not None and pointer.epoch == 5


def test_delete_and_recreate_never_sees_old_data(
    tmp_path: Path, object_store: ObjectStore, meta: MetaStore
) -> None:
    world = World(tmp_path, object_store, meta)
    try:
        old = world.tierer()
        old.start()
        world.append(10)
        assert old.flush()
        old.stop(flush=False)
        world.catalog.delete("/", "orders")
        assert world.catalog.pending_cleanups()  # cleanup still pending
        again = world.catalog.create("/", "orders", created_ns=world.record.created_ns + 1)
        assert again.incarnation != world.record.incarnation
        log2 = StreamLog.create(world.data_dir, "/", "orders", LOG, created_ns=again.created_ns)
        try:
            t2 = StreamTierer(log2, world.store, world.catalog, world.deletions, config=SMALL, m=4)
            result = t2.start()
            assert result.next_offset == 0 and result.adopted == 0
            assert t2.committer.tree.is_empty
            log2.append([b"fresh"])
            assert t2.flush()
            assert t2.durable_next == log2.commit_point().next_offset
            t2.stop(flush=False)
        finally:
            log2.close()
        # Cleanup removes the old incarnation only; its writer is told the stream is gone.
        new_keys = {m.key for m in world.store.list(f"stream/{again.incarnation}/")}
        assert new_keys
        assert run_stream_cleanups(world.catalog, world.store, "", world.data_dir) == [
            world.record.incarnation
        ]
        assert not list(world.store.list(f"stream/{world.record.incarnation}/"))
        assert {m.key for m in world.store.list(f"stream/{again.incarnation}/")} == new_keys
        assert not os.path.exists(os.path.join(world.data_dir, world.record.incarnation))
        assert not world.catalog.pending_cleanups()
        zombie = world.tierer()
        with pytest.raises(StreamDeletedError):
            zombie.start()
    finally:
        world.close()


def test_quiet_stream_reaches_remote_within_age_plus_debounce(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    deadline = SMALL.max_fragment_age + SMALL.debounce_seconds + 1.0  # + scheduling slack
    for _ in range(3):
        world.log.append([b"tick"])
        target = world.log.commit_point().next_offset
        start = time.monotonic()
        while tierer.durable_next < target and time.monotonic() - start < 10:
            time.sleep(0.02)
        assert tierer.durable_next >= target
        assert time.monotonic() - start <= deadline


def test_remote_ahead_of_local_restarts_local_log(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    world.append(10)
    world.log.store_offset("reporting", 42)
    world.log.append([b"after-offset"], producer="p1", publishing_ids=[7])
    assert tierer.flush()
    tierer.stop(flush=False)
    remote_next = tierer.durable_next
    # Lose the local disk: a fresh, empty log directory for the same incarnation.
    stream_dir = world.log.stream_dir
    world.log.close()
    for name in os.listdir(stream_dir):
        os.unlink(os.path.join(stream_dir, name))
    os.rmdir(stream_dir)
    world.log = StreamLog.create(
        world.data_dir, "/", "orders", LOG, created_ns=world.record.created_ns
    )
    fresh = world.tierer(epoch=1)
    result = fresh.start()
    assert result.restarted_local
    assert world.log.next_offset >= remote_next  # no tiered offset is reused
    assert world.log.max_epoch >= 2
    assert world.log.query_offset("reporting") == 42
    assert world.log.producer_sequence("p1") == 7
    world.append(5)
    assert fresh.flush()


def test_backpressure_refuses_appends_until_tiering_catches_up(
    tmp_path: Path, fs_store: ObjectStore, meta: MetaStore
) -> None:
    world = World(tmp_path, fs_store, meta)
    try:
        tierer = StreamTierer(
            world.log,
            world.store,
            world.catalog,
            world.deletions,
            config=SMALL,
            m=4,
            max_lag_bytes=20_000,
        )
        world.tierers.append(tierer)
        tierer.start()
        # The remote tier stops accepting fragments: lag builds up.
        world.store.fail_nth("put_if_absent", 1, key_prefix="stream/", times=10**9)
        refused = None
        deadline = time.monotonic() + 30  # the tierer thread must see the chunks first
        while refused is None and time.monotonic() < deadline:
            try:
                world.log.append([os.urandom(1000) for _ in range(5)])
            except BackPressureError as exc:
                refused = exc
            time.sleep(0.005)
        assert refused is not None and refused.retry_after > 0
        assert tierer.backpressure_active and tierer.status()["backpressure_active"]
        before = world.log.next_offset
        with pytest.raises(BackPressureError):
            world.log.append([b"x"])
        assert world.log.next_offset == before  # nothing written while refused
        # The store recovers; tiering catches up and appends are accepted again.
        world.store.clear_faults()
        assert tierer.flush(timeout=30)
        world.log.append([b"accepted again"])
        assert not tierer.backpressure_active
    finally:
        world.close()
