"""Segment-mode tiering of one stream in process: real log, real committer and manifest,
filesystem store and SeaweedFS. Triggers, reading across tiers after local deletion (every
offset spec against the records the log held), a crash between every commit step then
recovery by a new service, the deletion lag and the disk floor, remote retention."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tierlog.formats.manifest import ENTRY_SEGMENT
from tierlog.log.config import LogConfig
from tierlog.log.errors import TruncateBelowTieredError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.offload.errors import OffloadRunningError
from tierlog.offload.offloader import ObjectStoreOffloader
from tierlog.offload.service import SegmentOffloadService
from tierlog.read.errors import RemoteDataCorruptError
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import PrefetchConfig, Prefetcher
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog
from tierlog.remote.committed import CatalogCommittedManifest
from tierlog.remote.encryption import Keyring, reset_process_keyring, set_process_keyring
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.keys import segments_prefix, stream_prefix
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.sealing import is_sealed
from tierlog.remote.settings import StreamSettings
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.retention import RetentionPolicy, remote_trim_offset

MiB = 1 << 20
Records = list[tuple[int, bytes]]


class SimulatedCrash(BaseException):
    """A process kill: no ``except Exception`` cleanup runs."""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Stream:
    """One segment-mode stream: local log, offloader, committer, service."""

    def __init__(
        self, root: str, store: ObjectStore, settings: StreamSettings, segment_bytes: int
    ) -> None:
        self.root = root
        self.store = store
        self.settings = settings
        self.meta = SqliteMetaStore(os.path.join(root, "meta.db"))
        self.catalog = Catalog(self.meta)
        self.deletions = DeletionQueue(self.meta, grace_seconds=0.0)
        record = self.catalog.create("/", "s", settings)
        self.log = StreamLog.create(
            os.path.join(root, "data"),
            "/",
            "s",
            LogConfig(max_segment_bytes=segment_bytes, fsync="never"),
            created_ns=record.created_ns,
        )
        self.dir = os.path.basename(self.log.stream_dir)
        self.clock = Clock()
        self.prefetcher = Prefetcher(PrefetchConfig(request_bytes=64 * 1024))
        self.service = self.new_service()
        self.service.start()
        self.service.stop()  # the tests drive ``run_once`` themselves

    def new_service(
        self, step_hook: Callable[[str], None] | None = None, epoch: int = 1
    ) -> SegmentOffloadService:
        def hook(name: str) -> None:
            if step_hook is not None:
                step_hook(name)

        offloader = ObjectStoreOffloader(
            self.store,
            self.meta,
            "",
            self.dir,
            block_size=5 * MiB,
            step_hook=hook,
            settings=lambda: self.settings,
        )
        committer = ManifestCommitter(
            RemoteStream(self.store, "", self.dir),
            self.catalog,
            self.deletions,
            epoch,
            m=3,
            settings=lambda: self.settings,
        )

        def trim(tree: ManifestTree) -> int | None:
            policy = RetentionPolicy(self.settings.max_bytes, self.settings.max_age_seconds)
            return remote_trim_offset(tree, self.store.get, policy, int(self.clock() * 1000))

        return SegmentOffloadService(
            self.log,
            offloader,
            committer,
            lambda: self.settings,
            retention_trim=trim,
            clock=self.clock,
            step_hook=hook,
        )

    def append(self, rng: random.Random, batches: int, size: int = 2000) -> None:
        for b in range(batches):
            self.log.append([rng.randbytes(rng.randint(1, size)) for _ in range(4)])
            if b % 23 == 3:
                self.log.store_offset("consumer", b)
        self.log.sync()

    def reader(self, spec: OffsetSpec, local: bool = True) -> TieredReader:
        manifest = ManifestSource(
            CatalogCommittedManifest(self.catalog, self.store, "", self.dir, m=3)
        )
        return TieredReader(self.log if local else None, manifest, spec, prefetcher=self.prefetcher)

    def objects(self) -> list[str]:
        return [m.key for m in self.store.list(stream_prefix("", self.dir))]

    def close(self) -> None:
        self.service.stop()
        self.log.close()
        self.prefetcher.close()
        self.meta.close()


def local_records(log: StreamLog, spec: OffsetSpec) -> Records:
    with LogReader(log, spec) as reader:
        return [(o, bytes(r)) for o, r in reader.records()]


def read_all(reader: TieredReader) -> Records:
    with reader:
        return [(o, bytes(r)) for o, r in reader.records()]


ENCRYPTIONS = ["none", "aes-256-gcm"]
"""Tests parametrized with these run on plaintext (offload format 1) and encrypted (format
2: sealed frames, sealed index, sealed manifest) segment streams."""


@pytest.fixture
def make_stream(tmp_path: Path, object_store: ObjectStore) -> Iterator[Callable[..., Stream]]:
    set_process_keyring(Keyring([("k1", bytes(range(32)))]))  # for the encrypted variants
    made: list[Stream] = []

    def make(segment_bytes: int = 200_000, **settings: object) -> Stream:
        s = Stream(
            str(tmp_path),
            object_store,
            StreamSettings(tier_mode="segments", **settings),  # type: ignore[arg-type]
            segment_bytes,
        )
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
    reset_process_keyring()


@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_size_trigger_then_read_every_spec_after_local_deletion(
    make_stream: Callable[..., Stream], encryption: str
) -> None:
    s = make_stream(
        offload_threshold_bytes=300_000,
        offload_deletion_lag_seconds=60.0,
        encryption=encryption,
    )
    rng = random.Random(1)
    s.append(rng, 400)
    sealed = [x for x in s.log.list_segments() if x.sealed]
    assert len(sealed) >= 4
    everything = local_records(s.log, OffsetSpec.first())
    due = s.service.due_by_triggers()
    assert due and s.service.lag_bytes == sum(x.size for x in due)  # back-pressure's lag
    done = s.service.run_once()
    assert s.service.lag_bytes == 0
    assert done == len(due)
    tree = s.service.committed_tree()
    pending = sum(x.size for x in s.log.list_segments() if x.next_offset > tree.next_offset)
    assert done >= 1 and pending <= 300_000  # offloaded oldest first down to the threshold
    assert pending + sealed[done].size > 300_000 if done < len(sealed) else True
    entries = list(tree.iter_fragments(s.store.get))
    assert all(e.entry.entry_kind == ENTRY_SEGMENT for e in entries)
    sealed_format = encryption != "none"
    for e in entries:  # offload format 2 for an encrypted stream, format 1 otherwise
        assert (s.store.get(e.entry.key, 0, 4) == b"TLSD") == sealed_format
        assert is_sealed(s.store.get(e.entry.index_key)) == sealed_format
    assert len(s.objects()) >= 2 * done  # data + index per segment (+ manifest root)
    # the lag holds local copies back; once it passed they go, oldest first
    assert s.service.apply_local_deletion() == []
    s.clock.now += 61
    freed = s.service.apply_local_deletion()
    assert freed == [x.first_offset for x in sealed[:done]]
    assert s.log.segment_refs()[0].first_offset == tree.next_offset
    # consume everything from ``first`` across tiers, local log present or not
    assert read_all(s.reader(OffsetSpec.first())) == everything
    remote_only = [r for r in everything if r[0] < tree.next_offset]
    got = read_all(s.reader(OffsetSpec.first(), local=False))
    assert got == everything[: len(got)] and got[: len(remote_only)] == remote_only
    # every offset spec lands where a local reader of the whole log would have
    offsets = [o for o, _ in everything]
    for n in (offsets[0], offsets[1], offsets[len(remote_only) // 2], tree.next_offset - 1):
        want = [r for r in everything if r[0] >= n]
        assert read_all(s.reader(OffsetSpec.offset(n))) == want
    with s.reader(OffsetSpec.last()) as r:
        assert r.next_offset > 0
    assert read_all(s.reader(OffsetSpec.timestamp(0))) == everything


@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_multi_block_segment_reads_across_blocks(
    make_stream: Callable[..., Stream], encryption: str
) -> None:
    s = make_stream(segment_bytes=12 * MiB, offload_deletion_lag_seconds=0.0, encryption=encryption)
    rng = random.Random(2)
    s.append(rng, 1700, size=4000)  # one ~13.6 MB segment: 3 blocks of 5 MiB
    everything = local_records(s.log, OffsetSpec.first())
    sealed = [x for x in s.log.list_segments() if x.sealed]
    s.service.request_offload(sealed[-1].next_offset)
    with pytest.raises(OffloadRunningError):
        s.service.request_offload(1)
    assert s.service.status().state == "running"
    assert s.service.run_once() == len(sealed)
    status = s.service.status().to_dict()
    assert status["status"] == "success" and status["error"] is None
    assert status["first_unoffloaded_offset"] == sealed[-1].next_offset
    assert s.service.apply_local_deletion() == [x.first_offset for x in sealed]
    got = read_all(s.reader(OffsetSpec.first()))
    assert got == everything


@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_corrupt_offloaded_chunk_is_refused(
    make_stream: Callable[..., Stream], encryption: str
) -> None:
    s = make_stream(
        offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0, encryption=encryption
    )
    s.append(random.Random(3), 200)
    assert s.service.run_once() >= 1
    s.service.apply_local_deletion()
    tree = s.service.committed_tree()
    entry = next(tree.iter_fragments(s.store.get)).entry
    data = bytearray(s.store.get(entry.key))
    data[128 + 12 + 200] ^= 0xFF  # inside the first chunk of the first block
    s.store.put(entry.key, bytes(data))
    with pytest.raises(RemoteDataCorruptError):
        read_all(s.reader(OffsetSpec.first()))


STEPS = [
    "recorded",
    "initiated",
    "upload-id-recorded",
    "part-1",
    "completed",
    "index-written",
    "offloaded",
    "committed",
    "finished",
]


@pytest.mark.parametrize("step", STEPS)
def test_crash_between_commit_steps_then_recovery(
    make_stream: Callable[..., Stream], step: str
) -> None:
    s = make_stream(offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0)
    rng = random.Random(4)
    s.append(rng, 120)
    everything = local_records(s.log, OffsetSpec.first())

    def crash(name: str) -> None:
        if name == step:
            raise SimulatedCrash(name)

    doomed = s.new_service(crash)
    doomed.committer.load()
    with pytest.raises(SimulatedCrash):
        doomed.run_once()
    # a new process: recovery settles the attempt either way
    s.service = s.new_service(epoch=2)
    report = s.service.start()
    s.service.stop()
    expected = {"committed": (1, 0), "finished": (0, 0)}.get(step, (0, 1))
    assert (len(report.kept), len(report.cleaned)) == expected
    tree = s.service.committed_tree()
    keys = {k for e in tree.iter_fragments(s.store.get) for k in e.entry.object_keys}
    assert {m.key for m in s.store.list(segments_prefix("", s.dir))} == keys
    assert list(s.store.list_multipart_uploads(segments_prefix("", s.dir))) == []
    assert s.service.offloader.attempts.list() == []
    # and it goes on: everything offloaded, local copies freed, read back exactly once
    s.service.run_once()
    s.service.apply_local_deletion()
    assert read_all(s.reader(OffsetSpec.first())) == everything


def test_disk_floor_waives_the_lag_and_counts(make_stream: Callable[..., Stream]) -> None:
    s = make_stream(offload_threshold_bytes=0)
    s.append(random.Random(5), 120)
    assert s.service.run_once() >= 1
    assert s.service.apply_local_deletion() == []  # 4 h default lag
    s.service.min_free_disk_bytes = 1 << 62  # every disk is under this floor
    freed = s.service.apply_local_deletion()
    assert freed and s.service.early_deletions == len(freed)


def test_remote_retention_deletes_segments_whole(make_stream: Callable[..., Stream]) -> None:
    s = make_stream(offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0, max_bytes=450_000)
    s.append(random.Random(6), 400)
    assert s.service.run_once() >= 3
    tree = s.service.committed_tree()
    assert tree.header().total_bytes <= 450_000
    s.deletions.run_due(s.store)
    keys = {k for e in tree.iter_fragments(s.store.get) for k in e.entry.object_keys}
    assert {m.key for m in s.store.list(segments_prefix("", s.dir))} == keys
    s.service.apply_local_deletion()
    assert s.log.segment_refs()[0].first_offset >= tree.first_offset
    got = read_all(s.reader(OffsetSpec.first()))
    assert got and got[0][0] >= tree.first_offset


def test_offload_settings_are_checked() -> None:
    from tierlog.errors import ConfigError

    with pytest.raises(ConfigError, match="lower than the retention limit"):
        StreamSettings(tier_mode="segments", max_bytes=100, offload_threshold_bytes=100)
    with pytest.raises(ConfigError, match="lower than the retention limit"):
        StreamSettings(tier_mode="segments", max_age_seconds=60, offload_threshold_age_seconds=60)
    with pytest.raises(ConfigError, match="segments' only"):
        StreamSettings(offload_threshold_bytes=10)
    with pytest.raises(ConfigError, match="5 MiB"):
        StreamSettings(tier_mode="segments", offload_block_size=MiB)


@pytest.mark.parametrize("object_store", ["fs"], indirect=True)  # the executor opens it by URI
@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_spark_plans_a_task_per_segment_and_reads_block_by_block(
    make_stream: Callable[..., Stream], tmp_path: Path, encryption: str
) -> None:
    """The Spark source's executor side on a segment-mode stream: every row, once, in order,
    a block at a time; bounds prune whole blocks."""
    from tierlog.remote.manifest_walk import Bounds
    from tierlog.spark.planning import coalesce, plan_stream
    from tierlog.spark.reading import ReadSettings, read_task

    s = make_stream(segment_bytes=12 * MiB, offload_deletion_lag_seconds=0.0, encryption=encryption)
    rng = random.Random(7)
    s.append(rng, 1700, size=4000)
    s.append(rng, 30)  # more records in the active segment: never offloaded, never read here
    everything = local_records(s.log, OffsetSpec.first())
    sealed = [x for x in s.log.list_segments() if x.sealed]
    s.service.request_offload(sealed[-1].next_offset)
    s.service.run_once()
    tree = s.service.committed_tree()
    settings = ReadSettings(f"file://{tmp_path / 'objects'}", (), False, False, True, str(tmp_path))
    plan = plan_stream("s", tree, s.store.get, Bounds())
    tasks = coalesce(plan, Bounds(), 1 << 40)
    assert [len(t.fragments) for t in tasks] == [1] * len(sealed)  # one task per segment
    rows = []
    for task in tasks:
        for batch in read_task(task, settings):
            offsets, bodies = batch.column("offset").to_pylist(), batch.column("body").to_pylist()
            rows.extend(zip(offsets, bodies, strict=True))
    remote = [r for r in everything if r[0] < tree.next_offset]
    assert rows == remote
    # a bounded read fetches only the blocks that may hold the rows
    mid = remote[len(remote) // 2][0]
    bounds = Bounds(min_offset=mid, max_offset=mid + 10)
    task = coalesce(plan_stream("s", tree, s.store.get, bounds), bounds, 0)[0]
    got = [o for b in read_task(task, settings) for o in b.column("offset").to_pylist()]
    assert got == list(range(mid, mid + 11))


@pytest.mark.parametrize("object_store", ["fs"], indirect=True)  # the CLI opens it by URI
@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_dump_and_scrub_read_offloaded_segments(
    make_stream: Callable[..., Stream], tmp_path: Path, encryption: str
) -> None:
    """``tierlog dump --object-store --meta-store`` prints every record across both tiers
    after local deletion; the scrub job validates segments and reports a damaged one."""
    import base64
    import io
    import json

    from tierlog.cli import dump_tiered
    from tierlog.spark.jobs.scrub import check_fragment

    s = make_stream(
        offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0, encryption=encryption
    )
    s.append(random.Random(8), 300)
    everything = local_records(s.log, OffsetSpec.first())
    assert s.service.run_once() >= 2
    assert s.service.apply_local_deletion()
    out = io.StringIO()
    count = dump_tiered(
        s.log.stream_dir,
        f"file://{tmp_path / 'objects'}",
        f"sqlite://{tmp_path / 'meta.db'}",
        "",
        out,
    )
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert count == len(everything)
    assert [(x["offset"], base64.b64decode(x["body"])) for x in lines] == everything
    entries = [loc.entry for loc in s.service.committed_tree().iter_fragments(s.store.get)]
    assert [check_fragment(s.store, e) for e in entries] == [None] * len(entries)
    data = bytearray(s.store.get(entries[0].key))
    data[-5] ^= 0x01  # the last chunk's trailer bytes
    s.store.put(entries[0].key, bytes(data))
    problem = check_fragment(s.store, entries[0])
    assert problem is not None and problem["kind"] == "corrupt-fragment"


@pytest.mark.spark
@pytest.mark.parametrize("object_store", ["fs"], indirect=True)  # Spark opens it by URI
@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_spark_source_reads_a_segment_mode_stream(
    make_stream: Callable[..., Stream], tmp_path: Path, spark: Any, encryption: str
) -> None:
    """``spark.read.format("tierlog")`` on real Spark: one partition per offloaded segment,
    every offloaded row once, in order (sealed segments opened on the executors with the
    keys of their environment)."""
    s = make_stream(
        offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0, encryption=encryption
    )
    s.append(random.Random(9), 300)
    everything = local_records(s.log, OffsetSpec.first())
    assert s.service.run_once() >= 2
    s.service.apply_local_deletion()
    tree = s.service.committed_tree()
    df = (
        spark.read.format("tierlog")
        .options(
            streams="s",
            objectStore=f"file://{tmp_path / 'objects'}",
            metaStore=f"sqlite://{tmp_path / 'meta.db'}",
            targetPartitionBytes=str(1 << 40),
        )
        .load()
    )
    assert df.rdd.getNumPartitions() == len(list(tree.iter_fragments(s.store.get)))
    rows = [(r["offset"], bytes(r["body"])) for r in df.orderBy("offset").collect()]
    assert rows == [r for r in everything if r[0] < tree.next_offset]


def test_stream_retention_applies_to_segments_never_offloaded(
    make_stream: Callable[..., Stream],
) -> None:
    """No trigger, no operator call: the stream's retention still bounds the local tier
    (the remote tier holds nothing older), and a later offload continues after the gap."""
    s = make_stream(max_bytes=500_000)
    s.append(random.Random(10), 500)
    before = s.log.list_segments()
    assert sum(x.size for x in before) > 500_000
    with s.service._offload_lock:  # an offload in flight: its segment must not go under it
        assert s.service.apply_local_deletion() == []
    freed = s.service.apply_local_deletion()
    assert freed and freed == [x.first_offset for x in before[: len(freed)]]
    assert sum(x.size for x in s.log.list_segments()) <= 500_000
    first = s.log.segment_refs()[0].first_offset
    sealed = [x for x in s.log.list_segments() if x.sealed]
    s.service.request_offload(sealed[0].next_offset)
    assert s.service.run_once() == 1
    tree = s.service.committed_tree()
    assert (tree.first_offset, tree.next_offset) == (first, sealed[0].next_offset)
    got = read_all(s.reader(OffsetSpec.first()))
    assert got[0][0] >= first and got == local_records(s.log, OffsetSpec.first())


@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_lost_local_log_restarts_past_the_offloaded_segments(
    make_stream: Callable[..., Stream], encryption: str
) -> None:
    """The local directory is lost after offloading: the next start continues the log past
    the remote tier (no offset handed out twice, higher epoch, consumer offsets replayed from
    the last offloaded segment) and reads go on across the gap-free stream."""
    import shutil

    s = make_stream(
        offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0, encryption=encryption
    )
    s.append(random.Random(11), 300)
    before = local_records(s.log, OffsetSpec.first())
    sealed = [x for x in s.log.list_segments() if x.sealed]
    s.service.request_offload(sealed[-1].next_offset)
    s.service.run_once()
    tree = s.service.committed_tree()
    stored = s.log.query_offset("consumer")
    assert stored is not None and stored < tree.next_offset
    remote = [r for r in before if r[0] < tree.next_offset]
    path, epoch = s.log.stream_dir, s.log.max_epoch
    s.log.close()
    shutil.rmtree(path)
    s.log = StreamLog.create(
        os.path.join(s.root, "data"),
        "/",
        "s",
        LogConfig(max_segment_bytes=200_000, fsync="never"),
        created_ns=s.catalog.require("/", "s").created_ns,
    )
    assert s.log.stream_dir == path and s.log.next_offset == 0
    s.service = s.new_service()
    s.service.start()
    s.service.stop()
    # the new segment starts right at the remote tail (with a tracking snapshot chunk)
    assert s.log.segment_refs()[-1].first_offset == tree.next_offset
    assert s.log.max_epoch > epoch
    assert s.log.query_offset("consumer") == stored
    s.log.append([b"after"])
    s.log.sync()
    got = read_all(s.reader(OffsetSpec.first()))
    assert got[: len(remote)] == remote and got[-1][1] == b"after"
    assert got[-1][0] >= tree.next_offset


@pytest.mark.parametrize("object_store", ["fs"], indirect=True)
def test_plaintext_segment_in_place_of_a_sealed_one_is_refused(
    make_stream: Callable[..., Stream], tmp_path: Path
) -> None:
    """An encrypted stream's manifest is sealed since its creation (its pointer says so):
    a plaintext (format 1) index and data object of the same segment and attempt, put
    in the place of the sealed ones by someone with bucket access, are refused by the
    cross-tier reader, scrub and the offloader, never served."""
    from tierlog.offload.errors import OffloadedDataCorruptError
    from tierlog.spark.jobs.scrub import check_fragment
    from tierlog.storage.fs_object_store import FsObjectStore

    s = make_stream(offload_threshold_bytes=0, encryption="aes-256-gcm")
    s.append(random.Random(12), 200)
    assert s.service.run_once() >= 1
    tree = s.service.committed_tree()
    assert tree.sealed
    entry = next(tree.iter_fragments(s.store.get)).entry
    ref = next(r for r in s.log.segment_refs() if r.first_offset == entry.first_offset)
    forger = FsObjectStore(tmp_path / "forged")
    plain = ObjectStoreOffloader(forger, s.meta, "", s.dir, block_size=5 * MiB)
    plain.offload(ref, entry.uuid, {})
    plain.finish(ref.first_offset, entry.uuid)
    for key in (entry.key, entry.index_key):
        s.store.put(key, forger.get(key))
    with pytest.raises(RemoteDataCorruptError, match="expected a sealed index"):
        read_all(s.reader(OffsetSpec.first(), local=False))
    problem = check_fragment(s.store, entry, sealed=True)
    assert problem is not None and problem["kind"] == "corrupt-fragment"
    fresh = ObjectStoreOffloader(s.store, s.meta, "", s.dir, block_size=5 * MiB)
    with pytest.raises(OffloadedDataCorruptError):
        fresh.read_offloaded(entry.first_offset, entry.uuid, require_sealed=True)
    # the Spark source's executor side
    from tierlog.remote.errors import CorruptFragmentError
    from tierlog.remote.manifest_walk import Bounds
    from tierlog.spark.planning import coalesce, plan_stream
    from tierlog.spark.reading import ReadSettings, read_task

    task = coalesce(plan_stream("s", tree, s.store.get, Bounds()), Bounds(), 0)[0]
    assert task.sealed and task.fragments[0] == entry
    where = ReadSettings(f"file://{tmp_path / 'objects'}", (), False, False, True, None)
    with pytest.raises(CorruptFragmentError, match="expected a sealed index"):
        list(read_task(task, where))


def test_the_log_learns_the_offloaded_position_for_members_and_truncation(
    make_stream: Callable[..., Stream],
) -> None:
    """A cluster leader sends ``log.remote_position()`` to its members (``TIERED``), which
    free what the bucket holds; truncation refuses to cut below it. Segment mode tells
    the log after every commit, as the fragment tierer does."""
    s = make_stream(offload_threshold_bytes=0, offload_deletion_lag_seconds=0.0, max_bytes=450_000)
    assert s.log.remote_position() == (0, 0)  # started: the (empty) manifest is known
    s.append(random.Random(7), 400)
    assert s.service.run_once() >= 3
    tree = s.service.committed_tree()
    assert tree.first_offset > 0  # remote retention trimmed the oldest segments
    assert s.log.remote_position() == (tree.first_offset, tree.next_offset)
    with pytest.raises(TruncateBelowTieredError):
        s.log.truncate_after(-1)
