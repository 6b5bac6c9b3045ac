"""Remote retention (by size and age, with and without branch objects, idle streams),
local retention (never frees what is not durable), and stream deletion with a crash."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.plugins.tiering_world import SMALL, World
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.storage.errors import TransientError
from tierlog.tiering import cleanup
from tierlog.tiering.cleanup import run_stream_cleanups
from tierlog.tiering.retention import (
    LocalSegment,
    RetentionPolicy,
    local_segments_to_free,
)
from tierlog.tiering.tierer import StreamTierer


def fill(world: World, tierer: StreamTierer, batches: int) -> None:
    world.append(batches, per_batch=20, size=200)
    assert tierer.flush(timeout=30)


def remote_keys(world: World) -> set[str]:
    return {m.key for m in world.store.list(f"stream/{world.record.incarnation}/data/")}


@pytest.mark.parametrize("m", [4, 1024])
def test_retention_by_size_trims_whole_fragments_and_deletes_after_grace(
    world: World, m: int
) -> None:
    tierer = StreamTierer(world.log, world.store, world.catalog, world.deletions, config=SMALL, m=m)
    world.tierers.append(tierer)
    tierer.start()
    fill(world, tierer, 80)
    tree = tierer.committer.tree
    total = tree.header().total_bytes
    assert m == 1024 or tree.height >= 2  # small M: the trim goes through branch objects
    before = remote_keys(world)
    tierer.set_retention(RetentionPolicy(max_bytes=total // 3))
    first = tierer.apply_retention()
    assert first is not None and first > 0
    tree = tierer.committer.tree
    assert tree.first_offset == first
    assert tree.header().total_bytes <= total // 3
    # Whole fragments only: the first remaining fragment still exceeds the limit if removed.
    # Grace is 0 in these tests: the removed fragments are gone from the store now.
    after = remote_keys(world)
    assert after < before
    assert all(int(k.rsplit("/", 1)[1].split(".")[0]) >= first for k in after)
    # The manifest still reads back exactly (no dangling branch or fragment).
    remote = world.remote_chunks(tierer)
    local = world.local_chunks()
    assert remote == {cid: raw for cid, raw in local.items() if first <= cid < tree.next_offset}
    # A restarted writer sees the trimmed manifest.
    tierer.stop(flush=False)
    again = StreamTierer(world.log, world.store, world.catalog, world.deletions, config=SMALL, m=m)
    world.tierers.append(again)
    again.start()
    assert again.committer.tree.first_offset == first


def test_idle_stream_is_trimmed_by_age_without_new_data(world: World) -> None:
    tierer = StreamTierer(
        world.log,
        world.store,
        world.catalog,
        world.deletions,
        config=SMALL,
        m=4,
        retention_interval=0.05,
    )
    world.tierers.append(tierer)
    tierer.start()
    fill(world, tierer, 30)
    old_next = tierer.durable_next
    time.sleep(0.05)
    # All data is older than 10 ms now; nothing new arrives.
    tierer.set_retention(RetentionPolicy(max_age_seconds=0.01))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        tierer.committer.tree.first_offset < old_next or remote_keys(world)
    ):
        time.sleep(0.02)
    assert tierer.committer.tree.first_offset == old_next
    assert tierer.retention_trims >= 1
    assert not remote_keys(world)


def test_local_retention_frees_only_durable_segments(world: World) -> None:
    tierer = StreamTierer(world.log, world.store, world.catalog, world.deletions, config=SMALL, m=4)
    world.tierers.append(tierer)
    tierer.start()
    world.store.fail_nth("put_if_absent", 1, key_prefix="stream/", times=10**9)
    world.append(40, per_batch=20, size=200)  # several segments, none tiered
    assert len(world.log.list_segments()) >= 3
    assert tierer.apply_local_retention(max_bytes=1, max_age_seconds=None) == []
    world.store.clear_faults()
    assert tierer.flush(timeout=30)
    freed = tierer.apply_local_retention(max_bytes=1, max_age_seconds=None)
    assert freed  # everything sealed is durable now
    segments = world.log.list_segments()
    assert segments[0].first_offset > 0
    assert all(f < segments[0].first_offset for f in freed)
    # What remains locally still reads; what was freed is in the remote tier.
    with LogReader(world.log, OffsetSpec.first()) as reader:
        first_local = next(reader.records())[0]
    assert first_local >= segments[0].first_offset
    assert tierer.committer.tree.next_offset >= segments[0].first_offset


@given(
    sizes=st.lists(st.integers(1, 100), min_size=1, max_size=12),
    durable_frac=st.floats(0, 1),
    remote_frac=st.floats(0, 1),
    max_bytes=st.none() | st.integers(0, 600),
    max_age=st.none() | st.floats(0.001, 100),
)
def test_local_retention_never_frees_early(
    sizes: list[int],
    durable_frac: float,
    remote_frac: float,
    max_bytes: int | None,
    max_age: float | None,
) -> None:
    segments = []
    at = 0
    for i, size in enumerate(sizes):
        segments.append(LocalSegment(at, at + size, size, i < len(sizes) - 1, i * 1000))
        at += size
    durable = int(at * durable_frac)
    remote_first = min(durable, int(at * remote_frac))
    freed = local_segments_to_free(segments, durable, remote_first, max_bytes, max_age, 50_000)
    assert freed == [s.first_offset for s in segments[: len(freed)]]  # oldest first
    for seg in segments[: len(freed)]:
        assert seg.sealed
        assert seg.next_offset <= durable or seg.next_offset <= remote_first


def test_stream_deletion_survives_a_crash_mid_cleanup(
    world: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tierer = StreamTierer(world.log, world.store, world.catalog, world.deletions, config=SMALL, m=4)
    world.tierers.append(tierer)
    tierer.start()
    fill(world, tierer, 40)
    tierer.stop(flush=False)
    world.log.close()
    keys = {m.key for m in world.store.list(f"stream/{world.record.incarnation}/")}
    assert len(keys) > 6
    world.catalog.delete("/", "orders")
    monkeypatch.setattr(cleanup, "DELETE_BATCH", 3)
    world.store.fail_nth("delete_many", 2)  # the worker "crashes" after one batch
    with pytest.raises(TransientError):
        run_stream_cleanups(world.catalog, world.store, "", world.data_dir)
    left = {m.key for m in world.store.list(f"stream/{world.record.incarnation}/")}
    assert left and left < keys
    assert world.catalog.pending_cleanups()  # still queued: nothing forgotten
    # A new worker (after restart) scans the queue and finishes the job.
    assert run_stream_cleanups(world.catalog, world.store, "", world.data_dir) == [
        world.record.incarnation
    ]
    assert not list(world.store.list(f"stream/{world.record.incarnation}/"))
    assert not os.path.exists(os.path.join(world.data_dir, world.record.incarnation))
    assert not world.catalog.pending_cleanups()
    assert world.catalog.read_pointer(world.record.incarnation) is None
    assert run_stream_cleanups(world.catalog, world.store, "", world.data_dir) == []


def test_grace_period_then_overtaken_reader_gets_the_signal(world: World) -> None:
    from tierlog.read.manifest_source import ManifestSource
    from tierlog.read.strategies import ReadStrategy
    from tierlog.read.tiered_reader import TieredReader
    from tierlog.remote.errors import OffsetOvertakenError
    from tierlog.tiering.deletion import DeletionQueue

    world.deletions = DeletionQueue(world.meta, grace_seconds=0.5)
    tierer = StreamTierer(world.log, world.store, world.catalog, world.deletions, config=SMALL, m=4)
    world.tierers.append(tierer)
    tierer.start()
    fill(world, tierer, 60)
    # A slow consumer reads the oldest data from the remote tier.
    reader = TieredReader(
        world.log, ManifestSource(tierer), OffsetSpec.first(), strategy=ReadStrategy.FORCE
    )
    first_chunk = reader.read_chunk()
    assert first_chunk is not None and first_chunk.header.chunk_id == 0
    before = remote_keys(world)
    tierer.set_retention(RetentionPolicy(max_bytes=tierer.committer.tree.header().total_bytes // 2))
    new_first = tierer.apply_retention()
    assert new_first is not None and new_first > reader.next_offset
    # Within the grace period the removed fragments still exist (readers holding them finish).
    assert remote_keys(world) == before
    time.sleep(0.6)
    world.deletions.run_due(world.store)
    gone = before - remote_keys(world)
    assert gone and all(int(k.rsplit("/", 1)[1].split(".")[0]) < new_first for k in gone)
    # The overtaken reader is told where the stream starts now; it never skips silently.
    with pytest.raises(OffsetOvertakenError) as info:
        for _ in range(10_000):
            if reader.read_chunk() is None:
                break
    assert info.value.first_available == new_first
    reader.close()


def test_deleted_incarnation_gets_its_tombstone_even_if_the_deleting_node_died(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tombstone (the positive "deleted" answer members act on) is written once the
    catalog key is gone; a deleting node that died before writing it is made up for by
    the cleanup worker, before the cleanup item completes. A live stream has none."""
    from tierlog.remote.catalog import Catalog
    from tierlog.storage.errors import TransientError as Transient

    incarnation = world.record.incarnation
    world.log.close()
    assert not world.catalog.is_deleted(incarnation)
    real = Catalog.mark_deleted

    def dies(self: Catalog, inc: str) -> None:
        raise Transient("the node died before the tombstone")

    monkeypatch.setattr(Catalog, "mark_deleted", dies)
    world.catalog.delete("/", "orders")  # the deletion itself stands
    assert world.catalog.get("/", "orders") is None
    assert not world.catalog.is_deleted(incarnation)
    monkeypatch.setattr(Catalog, "mark_deleted", real)
    assert run_stream_cleanups(world.catalog, world.store, "", world.data_dir) == [incarnation]
    assert world.catalog.is_deleted(incarnation)
    again = world.catalog.create("/", "orders")  # a new incarnation is not deleted
    assert again.incarnation != incarnation
    assert not world.catalog.is_deleted(again.incarnation)
