"""The cross-tier reader against a real local log, a real tierer and a real object store:
equivalence with a pure local log (property), read strategies counted by requests, readers
whose local segment is freed under them, overtaken readers and expired fragments."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.faults.object_store import FaultyObjectStore
from tierlog.formats.chunk import SubBatch
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.read.errors import (
    FragmentExpiredError,
    NotHeldLocallyError,
    OffsetUnavailableError,
    RemoteDataCorruptError,
)
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import PrefetchConfig, Prefetcher
from tierlog.read.remote_cursor import aligned_spans
from tierlog.read.strategies import ReadStrategy, TierView, choose_tier
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog
from tierlog.remote.committed import CatalogCommittedManifest
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

Records = list[tuple[int, bytes]]


class Stream:
    """One stream: local log, tierer on a (fault-counting) object store, catalog."""

    def __init__(
        self,
        root: str,
        store: ObjectStore,
        *,
        segment_bytes: int = 20_000,
        fragment_bytes: int = 4_000,
        m: int = 3,
    ) -> None:
        self.meta = SqliteMetaStore(os.path.join(root, "meta.db"))
        self.catalog = Catalog(self.meta)
        self.deletions = DeletionQueue(self.meta, grace_seconds=0.0)
        record = self.catalog.create("/", "s")
        self.log = StreamLog.create(
            os.path.join(root, "data"),
            "/",
            "s",
            LogConfig(max_segment_bytes=segment_bytes, fsync="never"),
            created_ns=record.created_ns,
        )
        self.store = FaultyObjectStore(store)
        config = TieringConfig(
            fragment_bytes=fragment_bytes,
            max_fragment_age=0.1,
            debounce_count=3,
            debounce_seconds=0.01,
            retry_base=0.01,
            retry_max=0.05,
        )
        self.tierer = StreamTierer(
            self.log, self.store, self.catalog, self.deletions, config=config, m=m
        )
        self.tierer.start()
        self.manifest = ManifestSource(self.tierer)
        self.prefetcher = Prefetcher(PrefetchConfig(request_bytes=2048, max_window_bytes=16384))

    def append(self, rng: random.Random, batches: int, max_size: int = 120) -> None:
        for b in range(batches):
            entries: list[bytes | SubBatch] = [
                rng.randbytes(rng.randint(0, max_size)) for _ in range(rng.randint(1, 6))
            ]
            self.log.append(entries)
            if b % 17 == 5:
                self.log.store_offset("consumer", b)  # a tracking chunk between user chunks
        self.log.sync()

    def tier_all(self) -> None:
        assert self.tierer.flush(30)
        assert self.tierer.durable_next == self.log.commit_point().next_offset

    def free(self, count: int | None = None) -> list[int]:
        deletable = self.tierer.deletable_segments()
        chosen = deletable if count is None else deletable[:count]
        for first in chosen:
            self.log.delete_segment(first)
        return chosen

    def reader(self, spec: OffsetSpec, **kw: object) -> TieredReader:
        kw.setdefault("prefetcher", self.prefetcher)
        return TieredReader(self.log, self.manifest, spec, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        self.tierer.stop(flush=False, timeout=5)
        self.log.close()
        self.prefetcher.close()
        self.meta.close()


def local_records(log: StreamLog, spec: OffsetSpec) -> Records:
    with LogReader(log, spec) as reader:
        return [(o, bytes(r)) for o, r in reader.records()]


def tiered_records(reader: TieredReader) -> Records:
    with reader:
        return [(o, bytes(r)) for o, r in reader.records()]


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[Stream]:
    s = Stream(str(tmp_path), FsObjectStore(str(tmp_path / "objects")))
    yield s
    s.close()


def specs_for(log: StreamLog, rng: random.Random) -> list[OffsetSpec]:
    end = log.commit_point().next_offset
    stamps = [
        c.timestamp for seg in log.list_segments() for c in log.segment_chunks(seg.first_offset)
    ]
    specs = [OffsetSpec.first(), OffsetSpec.last(), OffsetSpec.next(), OffsetSpec.offset(end + 3)]
    specs += [OffsetSpec.offset(rng.randrange(0, max(end, 1))) for _ in range(6)]
    specs += [OffsetSpec.offset(0), OffsetSpec.offset(max(end - 1, 0))]
    if stamps:
        specs += [OffsetSpec.timestamp(stamps[0] - 1), OffsetSpec.timestamp(stamps[-1] + 1)]
        specs += [OffsetSpec.timestamp(rng.choice(stamps)) for _ in range(3)]
    return specs


# -- equivalence --------------------------------------------------------------------------


@given(
    seed=st.integers(0, 2**32 - 1),
    batches=st.integers(0, 160),
    max_size=st.sampled_from([0, 40, 300, 2000]),
    segment_bytes=st.integers(1_500, 30_000),
    fragment_bytes=st.integers(200, 12_000),
    m=st.integers(2, 5),
    freed=st.floats(0.0, 1.0),
    strategy=st.sampled_from(list(ReadStrategy)[1:]),
)
def test_tiered_reader_equals_a_pure_local_log(
    seed: int,
    batches: int,
    max_size: int,
    segment_bytes: int,
    fragment_bytes: int,
    m: int,
    freed: float,
    strategy: ReadStrategy,
) -> None:
    rng = random.Random(seed)
    root = tempfile.mkdtemp(prefix="tierlog-read-eq-")
    s = Stream(
        root,
        FsObjectStore(os.path.join(root, "objects")),
        segment_bytes=segment_bytes,
        fragment_bytes=fragment_bytes,
        m=m,
    )
    try:
        s.append(rng, batches, max_size)
        s.tier_all()
        specs = specs_for(s.log, rng)
        expected = {spec: local_records(s.log, spec) for spec in specs}  # before freeing
        deletable = s.tierer.deletable_segments()
        s.free(int(len(deletable) * freed))
        for spec in specs:
            got = tiered_records(
                s.reader(spec, strategy=strategy, hot_bytes=rng.randint(0, 30_000))
            )
            assert got == expected[spec], (spec, s.log.first_offset, strategy)
    finally:
        s.close()
        shutil.rmtree(root, ignore_errors=True)


def test_remote_then_local_on_object_store(tmp_path: Path, object_store: ObjectStore) -> None:
    """Integration on the filesystem store and SeaweedFS: freed prefix read remotely, the
    rest locally, bytes and chunk boundaries identical to the local log's."""
    s = Stream(str(tmp_path), object_store, fragment_bytes=6_000, m=3)
    try:
        rng = random.Random(7)
        s.append(rng, 200)
        s.tier_all()
        with LogReader(s.log, OffsetSpec.first()) as r:
            expected_chunks = [(c.header.chunk_id, bytes(c.raw or b"")) for c in r.chunks()]
        expected = local_records(s.log, OffsetSpec.first())
        assert s.free()
        with s.reader(OffsetSpec.first()) as reader:
            chunks = list(reader.chunks())
            assert [(c.header.chunk_id, bytes(c.raw or b"")) for c in chunks] == expected_chunks
            tiers = [c.tier for c in chunks]
            assert tiers[0] == "remote" and tiers[-1] == "local"
            switch = tiers.index("local")
            assert set(tiers[switch:]) == {"local"}  # one switch, remote -> local
            first = s.log.first_offset
            assert chunks[switch - 1].header.chunk_id < first <= chunks[switch].header.chunk_id
        assert tiered_records(s.reader(OffsetSpec.first())) == expected
    finally:
        s.close()


# -- strategies ---------------------------------------------------------------------------


def test_not_in_disk_makes_no_gets_for_local_offsets(stream: Stream) -> None:
    rng = random.Random(1)
    stream.append(rng, 150)
    stream.tier_all()
    stream.free(2)
    local_first = stream.log.first_offset
    end = stream.log.commit_point().next_offset
    stream.store.reset_log()
    specs = [OffsetSpec.next(), OffsetSpec.last(), OffsetSpec.offset(local_first)]
    specs += [OffsetSpec.offset(rng.randrange(local_first, end)) for _ in range(10)]
    for spec in specs:
        with stream.reader(spec) as reader:
            got = [(o, bytes(r)) for o, r in reader.records()]
            assert reader.remote_chunks == 0
        assert got == local_records(stream.log, spec)
    assert stream.store.count() == 0  # not one request


def test_force_reads_tiered_offsets_remotely(stream: Stream) -> None:
    rng = random.Random(2)
    stream.append(rng, 150)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    durable = stream.tierer.durable_next
    stream.append(rng, 10, max_size=20)  # a local-only tail past the tiered offsets
    tail = local_records(stream.log, OffsetSpec.offset(durable))
    # Scribble over every sealed, tiered local segment: a single local read of a tiered
    # offset would now show up as different bytes (the writer's CRCs are trusted).
    for seg in stream.log.list_segments():
        if seg.sealed and seg.next_offset <= durable:
            with open(seg.segment_path, "r+b") as f:
                for c in stream.log.segment_chunks(seg.first_offset):
                    f.seek(c.position + 48)
                    f.write(b"\xee" * (c.size - 48))
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.FORCE) as reader:
        got = [(o, bytes(r)) for o, r in reader.records()]
        assert got == expected + tail
        remote = reader.remote_chunks
        local = reader.local_chunks
    tiered_chunks = sum(
        1
        for seg in stream.log.list_segments()
        for c in stream.log.segment_chunks(seg.first_offset)
        if c.chunk_id < durable
    )
    assert remote == tiered_chunks and local >= 1  # the untiered tail came from disk


def test_disable_raises_for_offsets_not_held_locally(stream: Stream) -> None:
    rng = random.Random(3)
    stream.append(rng, 120)
    stream.tier_all()
    freed = stream.free(2)
    assert freed
    local_first = stream.log.first_offset
    stream.store.reset_log()
    with pytest.raises(NotHeldLocallyError) as info:
        stream.reader(OffsetSpec.offset(local_first - 1), strategy=ReadStrategy.DISABLE)
    assert info.value.local_first == local_first
    # "first" under DISABLE is the local tier's first; reading it never touches the store.
    got = tiered_records(stream.reader(OffsetSpec.first(), strategy=ReadStrategy.DISABLE))
    assert got == local_records(stream.log, OffsetSpec.first())
    assert got[0][0] >= local_first
    # A local reader whose segment is freed under it may not go remote: it raises.
    stream.append(rng, 150)
    stream.tier_all()
    reader = stream.reader(OffsetSpec.first(), strategy=ReadStrategy.DISABLE)
    assert reader.read_chunk() is not None
    stream.free()
    with pytest.raises(NotHeldLocallyError):
        list(reader.chunks())
    reader.close()
    assert stream.store.count("get") + stream.store.count("get_suffix") == 0


def test_not_in_mem_reads_only_the_hot_tail_locally(stream: Stream) -> None:
    rng = random.Random(4)
    stream.append(rng, 200)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    stream.store.reset_log()
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.NOT_IN_MEM, hot_bytes=10**12) as r:
        assert [(o, bytes(x)) for o, x in r.records()] == expected
        assert r.remote_chunks == 0
    assert stream.store.count("get") == 0
    hot = 8_000
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.NOT_IN_MEM, hot_bytes=hot) as r:
        chunks = list(r.chunks())
    assert chunks[0].tier == "remote" and chunks[-1].tier == "local"
    local_bytes = sum(c.size for c in chunks if c.tier == "local")
    assert 0 < local_bytes <= hot
    assert [(c.header.chunk_id) for c in chunks] == sorted(
        {o for o, _ in expected} & {c.header.chunk_id for c in chunks}
    )


def test_choose_tier_rules() -> None:
    view = TierView(local_first=100, local_next=200, remote_first=10, remote_next=150, hot_from=180)
    nid, mem, force, off = (
        ReadStrategy.NOT_IN_DISK,
        ReadStrategy.NOT_IN_MEM,
        ReadStrategy.FORCE,
        ReadStrategy.DISABLE,
    )
    assert choose_tier(nid, 50, view).tier == "remote"
    assert choose_tier(nid, 50, view).remote_until == 100
    assert choose_tier(nid, 120, view).tier == "local"
    assert choose_tier(nid, 200, view).tier == "end"
    assert choose_tier(mem, 120, view).tier == "remote"
    assert choose_tier(mem, 120, view).remote_until == 150
    assert choose_tier(mem, 160, view).tier == "local"  # not tiered: only the disk has it
    assert choose_tier(mem, 190, view).tier == "local"
    assert choose_tier(force, 120, view).tier == "remote"
    assert choose_tier(force, 160, view).tier == "local"
    assert choose_tier(off, 120, view).tier == "local"
    with pytest.raises(NotHeldLocallyError):
        choose_tier(off, 50, view)
    gap = TierView(local_first=100, local_next=200, remote_first=10, remote_next=90)
    with pytest.raises(OffsetUnavailableError):
        choose_tier(nid, 95, gap)
    assert ReadStrategy.parse("Not-In-Mem") is mem
    with pytest.raises(ValueError):
        ReadStrategy.parse("sometimes")


# -- readers and local retention ----------------------------------------------------------


def test_local_reader_continues_remotely_when_its_segment_is_freed(stream: Stream) -> None:
    rng = random.Random(5)
    stream.append(rng, 200)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    with stream.reader(OffsetSpec.first()) as reader:
        it = reader.records()
        got = [(o, bytes(r)) for o, r in (next(it) for _ in range(10))]
        assert reader.tier == "local"
        freed = stream.free()
        assert len(freed) >= 2
        got += [(o, bytes(r)) for o, r in it]
        assert reader.remote_chunks > 0  # the freed rest of its segment came from remote
    assert got == expected


def test_tail_reader_follows_new_data_across_tiers(stream: Stream) -> None:
    rng = random.Random(6)
    stream.append(rng, 50)
    stream.tier_all()
    with stream.reader(OffsetSpec.first()) as reader:
        got = [(o, bytes(r)) for o, r in reader.records()]
        for _ in range(3):
            stream.append(rng, 40)
            stream.tier_all()
            stream.free()
            got += [(o, bytes(r)) for o, r in reader.records()]
        assert reader.read_chunk() is None
    everything = [(o, bytes(r)) for o, r in tiered_records(stream.reader(OffsetSpec.first()))]
    assert got == everything
    assert [o for o, _ in got] == sorted({o for o, _ in got})


# -- retention: overtaken readers and expired fragments -----------------------------------


def trim(stream: Stream, offset: int) -> list[str]:
    """Trim the committed manifest's front in memory (what remote retention commits) and
    delete the removed objects (what the pending-deletion list does after the grace)."""
    stream.tierer.stop(flush=False)
    tree = stream.tierer.committer.tree
    result = tree.trim_front(offset, stream.tierer.remote.load)
    stream.store.delete_many([k for k in result.deletes if "/data/" in k])
    return result.deletes


def test_overtaken_reader_gets_the_first_available_offset(stream: Stream) -> None:
    rng = random.Random(8)
    stream.append(rng, 200)
    stream.tier_all()
    stream.free()
    reader = stream.reader(OffsetSpec.first())
    assert reader.read_chunk() is not None
    position = reader.next_offset
    trim(stream, stream.log.first_offset - 1)
    first = stream.tierer.committer.tree.first_offset
    assert first > position
    with pytest.raises(OffsetOvertakenError) as info:
        list(reader.chunks())
    assert info.value.first_available == first
    assert info.value.position == position
    reader.close()
    with pytest.raises(OffsetOvertakenError) as again:
        stream.reader(OffsetSpec.offset(first - 1))
    assert again.value.first_available == first
    # Re-attaching at the signalled offset works and starts exactly there.
    got = tiered_records(stream.reader(OffsetSpec.offset(first)))
    assert got[0][0] >= first
    assert tiered_records(stream.reader(OffsetSpec.first()))[0][0] == got[0][0]


def test_fragment_404_is_expired_then_overtaken(stream: Stream) -> None:
    rng = random.Random(9)
    stream.append(rng, 200)
    stream.tier_all()
    stream.free()
    tree = stream.tierer.committer.tree
    locations = list(tree.iter_fragments(stream.tierer.remote.load))
    assert len(locations) >= 4
    # The manifest still names the fragment but the object is gone: typed "expired".
    third = locations[2]
    reader = stream.reader(OffsetSpec.offset(third.entry.first_offset))
    stream.store.delete(third.key)
    with pytest.raises(FragmentExpiredError) as info:
        reader.read_chunk()
    assert info.value.key == third.key
    reader.close()
    # A reader inside the first fragment; retention removes it and two more; the next GET
    # 404s and the reader, re-checking the manifest, reports being overtaken.
    reader = stream.reader(OffsetSpec.first())
    assert reader.read_chunk() is not None
    trim(stream, locations[1].next_offset)
    with pytest.raises(OffsetOvertakenError) as over:
        while reader.read_chunk() is not None:
            pass
    assert over.value.first_available == locations[2].entry.first_offset
    reader.close()


# -- remote-only readers and seeks --------------------------------------------------------


def test_catalog_manifest_reader_without_local_log(stream: Stream) -> None:
    rng = random.Random(10)
    stream.append(rng, 120)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    manifest = ManifestSource(
        CatalogCommittedManifest(
            stream.catalog, stream.store, "", os.path.basename(stream.log.stream_dir), m=3
        )
    )
    with TieredReader(None, manifest, OffsetSpec.first(), prefetcher=stream.prefetcher) as r:
        got = [(o, bytes(x)) for o, x in r.records()]
        assert got == expected
        # growth is followed through the catalog pointer
        stream.append(rng, 40)
        stream.tier_all()
        got += [(o, bytes(x)) for o, x in r.records()]
    assert got == local_records(stream.log, OffsetSpec.first())
    last = TieredReader(None, manifest, OffsetSpec.last(), prefetcher=stream.prefetcher)
    assert tiered_records(last) == local_records(stream.log, OffsetSpec.last())


def test_seek_gets_from_the_cached_root(stream: Stream) -> None:
    rng = random.Random(11)
    stream.append(rng, 400)
    stream.tier_all()
    stream.free()
    tree = stream.tierer.committer.tree
    height = tree.height
    assert height >= 3  # branches of two heights at m=3
    end = stream.log.first_offset
    for _ in range(5):
        target = rng.randrange(0, end)
        manifest = ManifestSource(stream.tierer)  # cold branch and index caches
        stream.store.reset_log()
        with TieredReader(
            stream.log,
            manifest,
            OffsetSpec.offset(target),
            prefetcher=stream.prefetcher,
            user_only=False,
        ) as reader:
            chunk = reader.read_chunk()
            assert chunk is not None and chunk.header.chunk_id <= target < chunk.header.next_offset
            gets = stream.store.count("get") + stream.store.count("get_suffix")
        # branch levels below the root + one index GET + one data GET
        assert gets <= (height - 1) + 2, gets


# -- remote chunk reads: request-aligned, CRC-checked --------------------------------------


@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=40),
    st.integers(1, 700),
    st.integers(8, 100),
)
def test_aligned_spans_tile_the_region_at_chunk_starts(
    sizes: list[int], step: int, first: int
) -> None:
    positions = [first]
    for size in sizes[:-1]:
        positions.append(positions[-1] + size)
    end = positions[-1] + sizes[-1]
    spans = list(aligned_spans("k", positions, end, step))
    assert spans[0][1] == first and spans[-1][2] == end
    starts = set(positions)
    for (key, start, stop), nxt in zip(spans, [*spans[1:], ("k", end, end)], strict=True):
        assert key == "k" and start < stop == nxt[1]  # contiguous, non-empty
        assert start in starts  # cut only where a chunk starts
        inside = [p for p in positions if start < p < stop]
        assert stop - start <= step or not inside  # over a request only as a single chunk
    # greedy: two neighbours always exceed one request together
    for (_, a, _b), (_, _, c) in itertools.pairwise(spans):
        assert c - a > step


def test_remote_chunks_are_slices_of_one_request(stream: Stream) -> None:
    rng = random.Random(12)
    stream.append(rng, 150)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    stream.free()
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.FORCE) as reader:
        got: Records = []
        for chunk in reader.chunks():
            assert chunk.tier == "remote"
            assert chunk.raw is not None and not isinstance(chunk.raw.obj, bytearray)  # no copy
            got += [(o, bytes(r)) for o, r in chunk.records()]
    assert got == expected


def test_failed_index_read_ahead_is_retried_when_the_reader_gets_there(stream: Stream) -> None:
    rng = random.Random(13)
    stream.append(rng, 150)
    stream.tier_all()
    expected = local_records(stream.log, OffsetSpec.first())
    stream.free()
    tree = stream.tierer.committer.tree
    second = list(tree.iter_fragments(stream.tierer.remote.load))[1]
    # The first suffix GET of the second fragment is its index, loaded by the read-ahead.
    stream.store.fail_nth("get_suffix", 1, key_prefix=second.key)
    stream.store.reset_log()
    manifest = ManifestSource(stream.tierer)  # cold index cache
    reader = TieredReader(
        stream.log,
        manifest,
        OffsetSpec.first(),
        strategy=ReadStrategy.FORCE,
        prefetcher=stream.prefetcher,
    )
    assert tiered_records(reader) == expected
    outcomes = [r.outcome for r in stream.store.log if r.key == second.key]
    assert outcomes[0].startswith("injected-before") and "ok" in outcomes[1:]


def test_remote_chunk_with_a_bad_crc_is_corrupt(stream: Stream) -> None:
    rng = random.Random(14)
    stream.append(rng, 150, max_size=60)
    stream.tier_all()
    count = len(local_records(stream.log, OffsetSpec.first()))
    stream.free()
    tree = stream.tierer.committer.tree
    second = list(tree.iter_fragments(stream.tierer.remote.load))[1]
    index = stream.manifest.fragment_index(second)
    records = index.records
    n = int(np.argmax(records["size"]))  # a chunk with data
    position, size = int(records["position"][n]), int(records["size"][n])
    data = bytearray(stream.store.get(second.key))
    data[position + size - 1] ^= 0xFF  # the last data byte (chunks have no trailer here)
    stream.store.put(second.key, bytes(data))
    broken = int(records["chunk_id"][n])
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.FORCE) as reader:
        seen = []
        with pytest.raises(RemoteDataCorruptError, match="CRC"):
            while (chunk := reader.read_chunk()) is not None:
                seen.append(chunk.header.chunk_id)
        assert seen and max(seen) < broken  # everything before the bad chunk was served
    # without verification the flipped byte is served as it is (the check is what failed)
    with stream.reader(OffsetSpec.first(), strategy=ReadStrategy.FORCE, verify_crc=False) as reader:
        assert len(tiered_records(reader)) == count
