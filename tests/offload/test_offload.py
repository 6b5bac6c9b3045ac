"""Segment offload end to end on the filesystem store and SeaweedFS: real segments written by
the log, offloaded, read back with every offset spec against a local reader of the same
segment, corruption refused with typed errors, and a crash at every step then recovery."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.object_store import FaultyObjectStore, InjectedFault
from tierlog.formats.offload import (
    BLOCK_HEADER_SIZE,
    FORMAT_VERSION_KEY,
    MIN_BLOCK_SIZE,
    decode_index,
    iter_block_entries,
)
from tierlog.log.commit_point import CommitPoint
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import ChunkRead, LogReader
from tierlog.log.segment_files import SegmentRef, index_chunks
from tierlog.log.writer import StreamLog
from tierlog.offload.errors import (
    AttemptExistsError,
    OffloadedDataCorruptError,
    OffloadNotFoundError,
    OffloadSourceError,
)
from tierlog.offload.keys import segments_prefix
from tierlog.offload.offloader import ObjectStoreOffloader
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

PREFIX = "tl"
STREAM = "v_s_1"
EXTRA = {"stream": "v/s", "software": "tierlog-test"}


class SimulatedCrash(BaseException):
    """A process kill: no ``except Exception`` cleanup runs."""


class OneSegmentSource:
    """A ``LogSource`` holding one sealed segment: the local reader the oracle uses."""

    def __init__(self, ref: SegmentRef) -> None:
        chunks = index_chunks(ref.segment_path, ref.index_path)
        self.ref = ref
        last = chunks[-1]
        self._commit = CommitPoint(
            last.chunk_id, last.next_offset, ref.first_offset, last.end_position
        )

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        return (self.ref,)

    def commit_point(self) -> CommitPoint:
        return self._commit

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        return self._commit

    def trusted_from(self) -> int:
        return 1 << 62


@pytest.fixture(scope="module")
def segments(tmp_path_factory: pytest.TempPathFactory) -> list[SegmentRef]:
    """Sealed segments of a real log: ~64 KiB user chunks, tracking chunks, one 6 MiB chunk
    (bigger than a block of 5 MiB - 140), segments of ~11 MiB."""
    return build_segments(tmp_path_factory.mktemp("offload-log"))


def build_segments(root: Path) -> list[SegmentRef]:
    config = LogConfig(max_segment_bytes=11 * 1024 * 1024, fsync="never")
    log = StreamLog.create(str(root), "v", "s", config, created_ns=1)
    record = os.urandom(4096)
    for i in range(600):
        log.append([record[: 1000 + (i * 37 + j) % 3000] + b"%d" % j for j in range(16)])
        if i % 50 == 7:
            log.store_offset("consumer", i)
        if i == 250:
            log.append([os.urandom(6 * 1024 * 1024)])
    refs = log.segment_refs()
    log.close()
    sealed = list(refs[:-1])
    assert len(sealed) >= 2
    return sealed


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[SqliteMetaStore]:
    store = SqliteMetaStore(str(tmp_path / "meta.db"))
    yield store
    store.close()


def make_offloader(store: ObjectStore, meta: SqliteMetaStore, **kw: object) -> ObjectStoreOffloader:
    return ObjectStoreOffloader(store, meta, PREFIX, STREAM, block_size=MIN_BLOCK_SIZE, **kw)  # type: ignore[arg-type]


def chunk_view(chunk: ChunkRead) -> tuple[int, int, bytes, int]:
    assert chunk.raw is not None
    return chunk.header.chunk_id, chunk.header.chunk_type, bytes(chunk.raw), chunk.skip_below


def specs_for(ref: SegmentRef) -> list[OffsetSpec]:
    chunks = index_chunks(ref.segment_path, ref.index_path)
    mid = chunks[len(chunks) // 2]
    return [
        OffsetSpec.first(),
        OffsetSpec.last(),
        OffsetSpec.next(),
        OffsetSpec.offset(0),
        OffsetSpec.offset(chunks[0].chunk_id),
        OffsetSpec.offset(mid.chunk_id),
        OffsetSpec.offset(mid.chunk_id + 3),
        OffsetSpec.offset(chunks[-1].next_offset - 1),
        OffsetSpec.offset(chunks[-1].next_offset),
        OffsetSpec.offset(10**12),
        OffsetSpec.timestamp(0),
        OffsetSpec.timestamp(mid.timestamp),
        OffsetSpec.timestamp(chunks[-1].timestamp),
        OffsetSpec.timestamp(chunks[-1].timestamp + 1),
    ]


def all_objects(store: ObjectStore) -> list[str]:
    return [m.key for m in store.list(segments_prefix(PREFIX, STREAM))]


# -- round trip ------------------------------------------------------------------------------


def test_offload_and_read_back_like_a_local_reader(
    object_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    offloader = make_offloader(object_store, meta)
    for ref in segments:
        attempt = uuid.uuid4()
        result = offloader.offload(ref, attempt, EXTRA)
        offloader.finish(ref.first_offset, attempt)
        chunks = index_chunks(ref.segment_path, ref.index_path)
        assert (result.first_offset, result.next_offset) == (
            ref.first_offset,
            chunks[-1].next_offset,
        )
        assert result.chunk_count == len(chunks)
        assert result.segment_size == os.path.getsize(ref.segment_path)
        assert result.puts == result.block_count + 3
        for key in (result.data_key, result.index_key):
            assert attempt.hex in key
            head = object_store.head(key)
            assert head.metadata is not None
            assert head.metadata[FORMAT_VERSION_KEY] == "1"
            assert head.metadata["stream"] == "v/s"
        assert object_store.head(result.data_key).size == result.data_object_length
        handle = offloader.read_offloaded(ref.first_offset, attempt)
        assert offloader.read_offloaded(ref.first_offset, attempt) is handle  # cached
        local_source = OneSegmentSource(ref)
        for spec in specs_for(ref):
            for user_only in (True, False):
                with LogReader(
                    local_source, spec, user_only=user_only, verify_crc="always"
                ) as local:
                    expected = [chunk_view(c) for c in local.chunks()]
                    expected_next = local.next_offset
                with handle.reader(spec, user_only=user_only) as remote:
                    got = [chunk_view(c) for c in remote.chunks()]
                    assert remote.next_offset == expected_next
                assert got == expected, (spec, user_only)
            with LogReader(local_source, spec) as local, handle.reader(spec) as remote:
                assert [(o, bytes(r)) for o, r in remote.records()] == [
                    (o, bytes(r)) for o, r in local.records()
                ]
    assert meta.list("offload-attempts/") == []


def test_blocks_are_exact_parts_holding_the_chunks_verbatim(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    offloader = make_offloader(fs_store, meta)
    for ref in segments:
        attempt = uuid.uuid4()
        result = offloader.offload(ref, attempt, {})
        index = decode_index(fs_store.get(result.index_key))
        data = fs_store.get(result.data_key)
        assert len(data) == index.data_object_length == result.data_object_length
        with open(ref.segment_path, "rb") as f:
            segment = f.read()
        sizes = {c.chunk_id: c.size for c in index_chunks(ref.segment_path, ref.index_path)}
        positions = {c.chunk_id: c.position for c in index_chunks(ref.segment_path, ref.index_path)}
        seen = []
        for n, block in enumerate(index.blocks):
            assert block.part_number == n + 1
            end = index.blocks[n + 1].offset if n + 1 < len(index.blocks) else len(data)
            if n + 1 < len(index.blocks):
                assert end - block.offset == index.block_size
            for entry in iter_block_entries(data[block.offset : end]):
                payload = data[
                    block.offset + entry.position : block.offset + entry.position + entry.length
                ]
                pos = positions[entry.entry_id]
                assert payload == segment[pos : pos + sizes[entry.entry_id]]
                seen.append(entry.entry_id)
        assert seen == sorted(sizes)
        biggest = max(sizes.values())
        assert index.block_size == max(MIN_BLOCK_SIZE, biggest + BLOCK_HEADER_SIZE + 12)


# -- bad input, corruption -------------------------------------------------------------------


def test_config_and_source_errors(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef], tmp_path: Path
) -> None:
    from tierlog.errors import ConfigError

    with pytest.raises(ConfigError):
        ObjectStoreOffloader(fs_store, meta, PREFIX, STREAM, block_size=MIN_BLOCK_SIZE - 1)
    ref = segments[0]
    unsealed = SegmentRef(ref.first_offset, str(tmp_path / "u.segment"), str(tmp_path / "u.index"))
    shutil.copy(ref.segment_path, unsealed.segment_path)
    shutil.copy(ref.index_path, unsealed.index_path)
    with open(unsealed.segment_path, "ab") as f:
        f.write(b"\x50" + bytes(100))  # bytes after the last indexed chunk: not sealed
    offloader = make_offloader(fs_store, meta)
    with pytest.raises(OffloadSourceError, match="not sealed"):
        offloader.offload(unsealed, uuid.uuid4(), {})
    # a flipped byte in a chunk's data: refused, and the attempt leaves nothing behind
    shutil.copy(ref.segment_path, unsealed.segment_path)
    chunks = index_chunks(ref.segment_path, ref.index_path)
    victim = chunks[len(chunks) // 2]
    with open(unsealed.segment_path, "r+b") as f:
        f.seek(victim.end_position - 10)
        byte = f.read(1)
        f.seek(victim.end_position - 10)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(OffloadSourceError, match="CRC"):
        offloader.offload(unsealed, uuid.uuid4(), {})
    assert all_objects(fs_store) == []
    assert list(fs_store.list_multipart_uploads()) == []
    assert meta.list("offload-attempts/") == []
    attempt = uuid.uuid4()
    result = offloader.offload(ref, attempt, {})
    with pytest.raises(AttemptExistsError):
        offloader.offload(ref, attempt, {})
    assert all_objects(fs_store) == sorted([result.data_key, result.index_key])  # untouched
    assert [a.uuid for a in offloader.attempts.list()] == [attempt]


def test_corrupt_or_missing_objects_are_refused(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    ref = segments[0]
    offloader = make_offloader(fs_store, meta)
    attempt = uuid.uuid4()
    result = offloader.offload(ref, attempt, {})
    data = fs_store.get(result.data_key)
    index = fs_store.get(result.index_key)
    first_chunk = BLOCK_HEADER_SIZE + 12
    for at in (first_chunk + 60, first_chunk - 5, first_chunk + 3, len(data) - 1):
        bad = bytearray(data)
        bad[at] ^= 0xFF
        fs_store.put(result.data_key, bad)
        reader = (
            make_offloader(fs_store, meta)
            .read_offloaded(ref.first_offset, attempt)
            .reader(OffsetSpec.first(), user_only=False)
        )
        with pytest.raises(OffloadedDataCorruptError):
            list(reader.chunks())
    fs_store.put(result.data_key, data[: len(data) // 2])  # truncated data object
    with pytest.raises(OffloadedDataCorruptError):
        list(
            make_offloader(fs_store, meta)
            .read_offloaded(ref.first_offset, attempt)
            .reader()
            .chunks()
        )
    fs_store.put(result.data_key, data)
    fs_store.put(result.index_key, index[:-1])
    with pytest.raises(OffloadedDataCorruptError):
        make_offloader(fs_store, meta).read_offloaded(ref.first_offset, attempt)
    fs_store.put(result.index_key, index)
    handle = make_offloader(fs_store, meta).read_offloaded(ref.first_offset, attempt)
    with pytest.raises(OffloadNotFoundError):
        make_offloader(fs_store, meta).read_offloaded(ref.first_offset, uuid.uuid4())
    offloader.delete_offloaded(ref.first_offset, attempt)
    assert all_objects(fs_store) == []
    with pytest.raises(OffloadNotFoundError):
        list(handle.reader().chunks())
    offloader.delete_offloaded(ref.first_offset, attempt)  # again: fine


def test_index_fetched_once_and_reads_are_ranged(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    faulty = FaultyObjectStore(fs_store)
    offloader = make_offloader(faulty, meta, read_bytes=1024 * 1024)
    ref = segments[0]
    attempt = uuid.uuid4()
    result = offloader.offload(ref, attempt, {})
    faulty.reset_log()
    for _ in range(3):
        handle = offloader.read_offloaded(ref.first_offset, attempt)
    index_gets = [r for r in faulty.log if r.op == "get" and r.key == result.index_key]
    assert len(index_gets) == 1
    chunks = index_chunks(ref.segment_path, ref.index_path)
    faulty.reset_log()
    with handle.reader(OffsetSpec.offset(chunks[-3].chunk_id)) as reader:
        assert reader.read_chunk() is not None
    gets = [r for r in faulty.log if r.op == "get"]
    assert len(gets) == 1  # a seek: one ranged GET of data, the index is cached
    faulty.reset_log()
    total = sum(len(bytes(c.raw or b"")) for c in handle.reader(user_only=False).chunks())
    gets = [r for r in faulty.log if r.op == "get"]
    assert total == sum(c.size for c in chunks)
    assert (
        len(gets)
        <= total // (1024 * 1024) + 2 * len(decode_index(fs_store.get(result.index_key)).blocks) + 2
    )


# -- crash at every step, then recovery ------------------------------------------------------


def crash_steps(parts: int) -> list[str]:
    return (
        ["recorded", "initiated", "upload-id-recorded"]
        + [f"part-{n}" for n in range(1, parts + 1)]
        + ["completed", "index-written", "committed", "finished"]
    )


def run_until_crash(
    store: ObjectStore,
    meta: SqliteMetaStore,
    ref: SegmentRef,
    crash_at: str,
    committed: set[tuple[int, uuid.UUID]],
) -> uuid.UUID:
    def hook(step: str) -> None:
        if step == crash_at:
            raise SimulatedCrash(step)

    offloader = make_offloader(store, meta, step_hook=hook)
    attempt = uuid.uuid4()
    with pytest.raises(SimulatedCrash):
        offloader.offload(ref, attempt, EXTRA)
        # the caller's part: commit (the manifest, in the server), then forget the attempt
        hook("committed")
        committed.add((ref.first_offset, attempt))
        hook("finished")
        offloader.finish(ref.first_offset, attempt)
        raise SimulatedCrash("no crash")
    return attempt


def check_recovered(
    store: ObjectStore,
    meta: SqliteMetaStore,
    ref: SegmentRef,
    attempt: uuid.UUID,
    committed: set[tuple[int, uuid.UUID]],
) -> None:
    offloader = make_offloader(store, meta)  # a new process
    report = offloader.recover(lambda first, u: (first, u) in committed)
    assert meta.list("offload-attempts/") == []
    assert list(store.list_multipart_uploads()) == []
    if (ref.first_offset, attempt) in committed:
        assert [a.uuid for a in report.kept] == [attempt]
        local = [
            chunk_view(c) for c in LogReader(OneSegmentSource(ref), OffsetSpec.first()).chunks()
        ]
        got = [
            chunk_view(c)
            for c in offloader.read_offloaded(ref.first_offset, attempt).reader().chunks()
        ]
        assert got == local
        offloader.delete_offloaded(ref.first_offset, attempt)
    assert all_objects(store) == []


def test_crash_at_every_step_then_recovery(
    object_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    ref = segments[0]
    probe = make_offloader(object_store, meta).offload(ref, uuid.uuid4(), {})
    make_offloader(object_store, meta).delete_offloaded(ref.first_offset, probe.uuid)
    make_offloader(object_store, meta).finish(ref.first_offset, probe.uuid)
    assert probe.block_count >= 2
    for step in crash_steps(probe.block_count):
        committed: set[tuple[int, uuid.UUID]] = set()
        attempt = run_until_crash(object_store, meta, ref, step, committed)
        check_recovered(object_store, meta, ref, attempt, committed)


def test_lost_complete_reply(
    object_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    """CompleteMultipartUpload takes effect but its reply is lost: first with the process
    alive (its own cleanup removes everything), then with a crash right after (recovery
    does)."""
    ref = segments[0]
    faulty = FaultyObjectStore(object_store)
    faulty.fail_nth("complete_multipart", 1, after=True)
    offloader = make_offloader(faulty, meta)
    with pytest.raises(InjectedFault):
        offloader.offload(ref, uuid.uuid4(), {})
    assert all_objects(object_store) == []
    assert list(object_store.list_multipart_uploads()) == []
    assert meta.list("offload-attempts/") == []

    def crash(message: str) -> InjectedFault:
        raise SimulatedCrash(message)

    faulty.fail_nth("complete_multipart", 1, after=True, error=crash)
    attempt = uuid.uuid4()
    with pytest.raises(SimulatedCrash):
        make_offloader(faulty, meta).offload(ref, attempt, {})
    assert len(all_objects(object_store)) == 1  # the data object exists, nobody knows
    check_recovered(object_store, meta, ref, attempt, set())


def test_recovery_aborts_stray_uploads_and_spares_running_ones(
    object_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    stray = object_store.create_multipart(segments_prefix(PREFIX, STREAM) + "whatever.data")
    stray.put_part(1, b"x")
    elsewhere = object_store.create_multipart("other/stream/key")
    offloader = make_offloader(object_store, meta)
    report = offloader.recover(lambda first, u: False)
    assert report.stray_uploads_aborted == 1
    assert [u.key for u in object_store.list_multipart_uploads()] == ["other/stream/key"]
    elsewhere.abort()
    # an attempt running in this process is left alone by a concurrent recovery
    seen: list[object] = []

    def hook(step: str) -> None:
        if step == "part-1":
            seen.append(offloader.recover(lambda first, u: False))

    running = make_offloader(object_store, meta, step_hook=hook)
    offloader = running
    result = running.offload(segments[0], uuid.uuid4(), {})
    assert seen and seen[0].cleaned == () and seen[0].stray_uploads_aborted == 0  # type: ignore[attr-defined]
    assert object_store.head(result.index_key).size == result.index_length


def test_every_offset_and_timestamp_attaches_like_a_local_reader(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    """Exhaustive over one segment: every chunk id, the offsets around it and inside it, and
    every chunk timestamp around it; the first chunk handed out and the reader's position must
    be the local reader's."""
    ref = segments[1]
    offloader = make_offloader(fs_store, meta)
    attempt = uuid.uuid4()
    offloader.offload(ref, attempt, {})
    handle = offloader.read_offloaded(ref.first_offset, attempt)
    local_source = OneSegmentSource(ref)
    specs = []
    for chunk in index_chunks(ref.segment_path, ref.index_path):
        for offset in (
            chunk.chunk_id - 1,
            chunk.chunk_id,
            chunk.chunk_id + 1,
            chunk.next_offset - 1,
        ):
            specs.append(OffsetSpec.offset(max(0, offset)))
        for ts in (chunk.timestamp - 1, chunk.timestamp, chunk.timestamp + 1):
            specs.append(OffsetSpec.timestamp(ts))
    for spec in specs:
        with LogReader(local_source, spec) as local, handle.reader(spec) as remote:
            assert remote.next_offset == local.next_offset, spec
            expected = local.read_chunk()
            got = remote.read_chunk(load=False)
            assert (got is None) == (expected is None), spec
            if got is not None and expected is not None:
                assert (got.header, got.skip_below, got.raw) == (
                    expected.header,
                    expected.skip_below,
                    None,
                ), spec
            assert remote.next_offset == local.next_offset, spec


def test_keys_share_the_stream_prefix_of_fragments() -> None:
    from tierlog.offload.keys import data_key, index_key, parse_offload_key, stream_prefix
    from tierlog.storage.errors import InvalidKeyError

    try:  # the fragment keys' home moves from tiering/ to remote/
        from tierlog.remote.keys import stream_prefix as fragments_stream_prefix
    except ImportError:
        from tierlog.tiering.keys import stream_prefix as fragments_stream_prefix

    for prefix in ("", "p", "/a/b/"):
        assert stream_prefix(prefix, STREAM) == fragments_stream_prefix(prefix, STREAM)
    attempt = uuid.UUID(int=0x1234)
    key = data_key("p", STREAM, 42, attempt)
    assert key == f"p/stream/{STREAM}/segments/00000000000000000042.{attempt.hex}.data"
    assert index_key("p", STREAM, 42, attempt) == key[: -len("data")] + "index"
    parsed = parse_offload_key(key, "p", STREAM)
    assert (parsed.first_offset, parsed.uuid, parsed.kind) == (42, attempt, "data")
    for bad in ("", ".", "..", "a/b", "a\\b", "a\x00b"):
        with pytest.raises(InvalidKeyError):
            stream_prefix("p", bad)
    with pytest.raises(InvalidKeyError):
        parse_offload_key(key.replace(".data", ".fragment"), "p", STREAM)
    with pytest.raises(InvalidKeyError):
        data_key("p", STREAM, -1, attempt)
