"""Offloading an encrypted stream's segments (offload format 2) on the filesystem store and
SeaweedFS: read back with every offset spec like a local reader, ranged reads that fetch
(and decrypt) only the frames they serve, no plaintext and nothing but the stream directory
in object keys, every kind of tampering refused with a typed error, key rotation, a crash at
every step then recovery, and the cross-tier reader and scrub over sealed segments."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.object_store import FaultyObjectStore
from tests.offload.test_offload import (
    EXTRA,
    PREFIX,
    STREAM,
    OneSegmentSource,
    SimulatedCrash,
    all_objects,
    build_segments,
    chunk_view,
    specs_for,
)
from tests.support.keyring import process_keyring
from tierlog.formats.errors import AuthenticationError, UnknownKeyError
from tierlog.formats.offload import FORMAT_VERSION_KEY, MIN_BLOCK_SIZE
from tierlog.formats.offload_sealed import FRAME_OVERHEAD, SealedOffloadIndex
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.segment_files import SegmentRef, index_chunks
from tierlog.offload.errors import OffloadedDataCorruptError
from tierlog.offload.offloader import ObjectStoreOffloader
from tierlog.remote.encryption import Keyring, set_process_keyring
from tierlog.remote.sealing import is_sealed
from tierlog.remote.settings import StreamSettings
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

K1 = ("k1", bytes(range(32)))
K2 = ("k2", bytes(range(32, 64)))
ENCRYPTED = StreamSettings(tier_mode="segments", encryption="aes-256-gcm")


@pytest.fixture(scope="module")
def segments(tmp_path_factory: pytest.TempPathFactory) -> list[SegmentRef]:
    return build_segments(tmp_path_factory.mktemp("sealed-offload-log"))


@pytest.fixture(autouse=True)
def keyring() -> Iterator[Keyring]:
    with process_keyring(K1) as ring:
        yield ring


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[SqliteMetaStore]:
    store = SqliteMetaStore(str(tmp_path / "meta.db"))
    yield store
    store.close()


def sealed_offloader(
    store: ObjectStore,
    meta: SqliteMetaStore,
    settings: Callable[[], StreamSettings] = lambda: ENCRYPTED,
    **kw: object,
) -> ObjectStoreOffloader:
    return ObjectStoreOffloader(
        store,
        meta,
        PREFIX,
        STREAM,
        block_size=MIN_BLOCK_SIZE,
        settings=settings,
        **kw,  # type: ignore[arg-type]
    )


def read_all(offloader: ObjectStoreOffloader, ref: SegmentRef, attempt: uuid.UUID) -> list[object]:
    handle = offloader.read_offloaded(ref.first_offset, attempt)
    return [chunk_view(c) for c in handle.reader(user_only=False).chunks()]


def local_all(ref: SegmentRef) -> list[object]:
    return [
        chunk_view(c)
        for c in LogReader(OneSegmentSource(ref), OffsetSpec.first(), user_only=False).chunks()
    ]


def test_sealed_offload_reads_back_like_a_local_reader(
    object_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    offloader = sealed_offloader(object_store, meta)
    key_pattern = re.compile(
        rf"{PREFIX}/stream/{STREAM}/segments/\d{{20}}\.[0-9a-f]{{32}}\.(data|index)"
    )
    for ref in segments:
        attempt = uuid.uuid4()
        result = offloader.offload(ref, attempt, EXTRA)
        offloader.finish(ref.first_offset, attempt)
        for key in (result.data_key, result.index_key):
            assert key_pattern.fullmatch(key)  # offsets and the attempt: no content
            head = object_store.head(key)
            assert head.metadata is not None and head.metadata[FORMAT_VERSION_KEY] == "2"
        data = object_store.get(result.data_key)
        assert data[:4] == b"TLSD" and is_sealed(object_store.get(result.index_key))
        assert len(data) == result.data_object_length
        handle = offloader.read_offloaded(ref.first_offset, attempt)
        assert isinstance(handle.index, SealedOffloadIndex)
        # every part but the last holds at least the block size (S3's 5 MiB minimum)
        blocks = handle.index.blocks
        lengths = [b.offset for b in blocks[1:]] + [result.data_object_length]
        sizes = [end - b.offset for b, end in zip(blocks, lengths, strict=True)]
        assert all(size >= MIN_BLOCK_SIZE for size in sizes[:-1]) and result.block_count >= 2
        # no chunk's bytes appear in the clear
        with open(ref.segment_path, "rb") as f:
            plain = f.read()
        for at in range(8, len(plain) - 64, len(plain) // 16):
            assert plain[at : at + 64] not in data
        source = OneSegmentSource(ref)
        for spec in specs_for(ref):
            for user_only in (True, False):
                with LogReader(source, spec, user_only=user_only, verify_crc="always") as local:
                    expected = [chunk_view(c) for c in local.chunks()]
                    expected_next = local.next_offset
                with handle.reader(spec, user_only=user_only) as remote:
                    assert [chunk_view(c) for c in remote.chunks()] == expected, spec
                    assert remote.next_offset == expected_next
    assert meta.list("offload-attempts/") == []


def test_ranged_reads_fetch_only_the_frames_they_serve(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    faulty = FaultyObjectStore(fs_store)
    offloader = sealed_offloader(faulty, meta, read_bytes=256 * 1024)
    ref = segments[0]
    attempt = uuid.uuid4()
    offloader.offload(ref, attempt, {})
    handle = offloader.read_offloaded(ref.first_offset, attempt)
    chunks = index_chunks(ref.segment_path, ref.index_path)
    fetched: list[tuple[int, int]] = []
    inner = handle.store

    class Recording:
        def get_view(self, key: str, start: int, end: int) -> memoryview:
            fetched.append((start, end))
            return inner.get_view(key, start, end)

    handle.store = Recording()  # type: ignore[assignment]
    target = chunks[-3]
    with handle.reader(OffsetSpec.offset(target.chunk_id)) as reader:
        chunk = reader.read_chunk()
        assert chunk is not None and chunk.header.chunk_id == target.chunk_id
    ((start, end),) = fetched  # one ranged GET: the frames from the target on, whole
    i = handle.chunk_ids.index(target.chunk_id)
    assert start == handle.stored_starts[i]
    assert end - start <= max(256 * 1024, target.size + FRAME_OVERHEAD)
    assert end - start >= target.size + FRAME_OVERHEAD


def tampered(data: bytes, at: int) -> bytes:
    bad = bytearray(data)
    bad[at] ^= 0x01
    return bytes(bad)


def test_every_tampering_is_a_typed_error(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    ref = segments[0]
    offloader = sealed_offloader(fs_store, meta)
    attempt = uuid.uuid4()
    result = offloader.offload(ref, attempt, {})
    data = fs_store.get(result.data_key)
    index_bytes = fs_store.get(result.index_key)
    handle = offloader.read_offloaded(ref.first_offset, attempt)
    starts = handle.stored_starts
    second = starts[1]
    frame1 = data[starts[1] : starts[2]]
    frame2 = data[starts[2] : starts[3]]
    attacks = {
        "first frame byte": tampered(data, starts[0] + 3),
        "a tag": tampered(data, starts[2] - 1),
        "last byte": tampered(data, len(data) - 1),
        "truncated": data[: len(data) - 7],
        "frames swapped": data[:second] + frame2 + frame1 + data[starts[3] :]
        if len(frame1) == len(frame2)
        else data[:second] + frame1 + frame1 + data[starts[3] :],
        "a frame dropped": data[:second] + data[starts[2] :],
    }
    for name, bad in attacks.items():
        fs_store.put(result.data_key, bad)
        fresh = sealed_offloader(fs_store, meta)
        with pytest.raises(OffloadedDataCorruptError):
            list(fresh.read_offloaded(ref.first_offset, attempt).reader(user_only=False).chunks())
            pytest.fail(f"{name}: read without an error")
    fs_store.put(result.data_key, data)
    for at in (0, 10, len(index_bytes) // 2, len(index_bytes) - 1):
        fs_store.put(result.index_key, tampered(index_bytes, at))
        with pytest.raises(OffloadedDataCorruptError):
            sealed_offloader(fs_store, meta).read_offloaded(ref.first_offset, attempt)
    fs_store.put(result.index_key, index_bytes)
    assert read_all(sealed_offloader(fs_store, meta), ref, attempt) == local_all(ref)


def test_rotation_keeps_old_segments_readable_while_the_old_key_is_held(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    first, second = segments[0], segments[1]
    old, new = uuid.uuid4(), uuid.uuid4()
    sealed_offloader(fs_store, meta).offload(first, old, {})
    set_process_keyring(Keyring([K2, K1]))  # rotated: k2 current, k1 still held
    sealed_offloader(fs_store, meta).offload(second, new, {})
    reader = sealed_offloader(fs_store, meta)
    assert read_all(reader, first, old) == local_all(first)
    assert read_all(reader, second, new) == local_all(second)
    set_process_keyring(Keyring([K2]))  # k1 dropped
    assert read_all(sealed_offloader(fs_store, meta), second, new) == local_all(second)
    with pytest.raises(OffloadedDataCorruptError, match="'k1'") as info:
        sealed_offloader(fs_store, meta).read_offloaded(first.first_offset, old)
    assert isinstance(info.value.__cause__, UnknownKeyError)


def test_encryption_turned_on_later_keeps_old_segments_readable(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    current = [StreamSettings(tier_mode="segments")]
    offloader = sealed_offloader(fs_store, meta, settings=lambda: current[0])
    plain, sealed = uuid.uuid4(), uuid.uuid4()
    offloader.offload(segments[0], plain, {})
    current[0] = ENCRYPTED
    offloader.offload(segments[1], sealed, {})
    assert fs_store.get(offloader.data_key(segments[0].first_offset, plain))[:4] != b"TLSD"
    assert fs_store.get(offloader.data_key(segments[1].first_offset, sealed))[:4] == b"TLSD"
    assert read_all(offloader, segments[0], plain) == local_all(segments[0])
    assert read_all(offloader, segments[1], sealed) == local_all(segments[1])


def test_crash_at_every_step_then_recovery(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    ref = segments[0]
    for crash_at in ("recorded", "initiated", "part-1", "completed", "index-written", "finish"):
        committed: set[tuple[int, uuid.UUID]] = set()

        def hook(step: str, crash_at: str = crash_at) -> None:
            if step == crash_at:
                raise SimulatedCrash(step)

        attempt = uuid.uuid4()
        with pytest.raises(SimulatedCrash):
            sealed_offloader(fs_store, meta, step_hook=hook).offload(ref, attempt, EXTRA)
            committed.add((ref.first_offset, attempt))
            hook("finish")
        fresh = sealed_offloader(fs_store, meta)
        fresh.recover(lambda first, u, done=committed: (first, u) in done)
        assert meta.list("offload-attempts/") == []
        assert list(fs_store.list_multipart_uploads()) == []
        if committed:
            assert read_all(fresh, ref, attempt) == local_all(ref)
            fresh.delete_offloaded(ref.first_offset, attempt)
        assert all_objects(fs_store) == []


def test_plaintext_index_in_place_of_a_sealed_one_is_refused_when_sealing_is_required(
    fs_store: ObjectStore, meta: SqliteMetaStore, segments: list[SegmentRef]
) -> None:
    from tierlog.remote.segments import decode_offload_index

    ref = segments[0]
    plain_offloader = sealed_offloader(
        fs_store, meta, settings=lambda: StreamSettings(tier_mode="segments")
    )
    attempt = uuid.uuid4()
    result = plain_offloader.offload(ref, attempt, {})
    stored = fs_store.get(result.index_key)
    decode_offload_index(result.index_key, stored)  # a plaintext index as such: fine
    with pytest.raises(AuthenticationError):
        decode_offload_index(result.index_key, stored, require_sealed=True)
