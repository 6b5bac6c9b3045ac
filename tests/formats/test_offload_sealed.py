"""Offload format 2 (an encrypted stream's segments): golden bytes of the data header, a
frame and the index plaintext computed by hand from the layout; round trips; and a typed
error for every flipped, swapped, dropped or truncated byte or frame of either object."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.formats.test_encryption import counter_random
from tierlog.formats.encryption import TAG_SIZE, AesGcmFrameCipher, new_cipher, open_cipher
from tierlog.formats.encryption import open_object as open_sealed_object
from tierlog.formats.encryption import seal_object as seal_whole_object
from tierlog.formats.errors import (
    AuthenticationError,
    FormatError,
    LayoutMismatchError,
    UnknownKeyError,
)
from tierlog.formats.offload import MIN_BLOCK_SIZE, BlockMapping, SegmentMetadata
from tierlog.formats.offload_sealed import (
    FRAME_OVERHEAD,
    SealedOffloadIndex,
    build_sealed_index,
    check_entry,
    data_header,
    decode_data_header,
    decode_sealed_index,
    encode_sealed_index,
    entry_header,
    plan_frame_blocks,
    sealed_chunk_locations,
)
from tierlog.formats.segment import INDEX_RECORD_DTYPE, IndexRecord

KEK = bytes(range(32))
DATA_KEY = "tl/stream/__s_1/segments/00000000000000000010.0123456789abcdef0123456789abcdef.data"
INDEX_KEY = DATA_KEY[: -len(".data")] + ".index"
PAYLOADS = [b"AAAAA", b"BBB", b"CCCC"]
RECORDS = [
    IndexRecord(10, 1000, 1, 8, 0),
    IndexRecord(13, 1001, 1, 13, 1),
    IndexRecord(20, 1002, 2, 16, 0),
]


def metadata(
    records: list[IndexRecord], next_offset: int, payloads: list[bytes]
) -> SegmentMetadata:
    arr = np.frombuffer(b"".join(r.encode() for r in records), dtype=INDEX_RECORD_DTYPE)
    crcs = np.array([zlib.crc32(p) for p in payloads], dtype=np.uint32)
    size = 8 + sum(len(p) for p in payloads)
    return SegmentMetadata(records[0].chunk_id, next_offset, size, arr, crcs)


def golden_cipher() -> AesGcmFrameCipher:
    return new_cipher(DATA_KEY, "k1", KEK, random=counter_random())


def seal_data_object(
    index: SealedOffloadIndex, cipher: AesGcmFrameCipher, payloads: list[bytes]
) -> bytes:
    """The whole data object as the offloader uploads it (its parts back to back)."""
    header = index.header
    ids = index.metadata.records["chunk_id"].tolist()
    out = bytearray(header)
    for i, payload in enumerate(payloads):
        entry = entry_header(len(payload), ids[i]) + payload
        out += cipher.seal(i, i == len(payloads) - 1, entry, header)
    assert len(out) == index.data_object_length
    return bytes(out)


def open_data_object(
    index: SealedOffloadIndex, data: bytes, keks: dict[str, bytes] | None = None
) -> list[bytes]:
    """Every chunk, read the way the readers do: from the index's frame table, each frame
    opened on its own with the index's key block."""
    if decode_data_header(data) != index.key_block:
        raise AuthenticationError("header key block differs from the index's")
    cipher = open_cipher(DATA_KEY, index.key_block, keks or {"k1": KEK})
    locs = sealed_chunk_locations(index)
    sizes = locs.sizes.tolist()
    ids = locs.chunk_ids.tolist()
    out = []
    for i, (start, stored) in enumerate(
        zip(locs.stored_starts.tolist(), locs.stored_sizes.tolist(), strict=True)
    ):
        frame = data[start : start + stored]
        plain = cipher.open(i, i == len(sizes) - 1, frame, index.header)
        out.append(bytes(check_entry(plain, sizes[i], ids[i])))
    if len(data) != index.data_object_length:
        raise FormatError(f"data object of {len(data)} bytes, index says more or less")
    return out


# -- golden bytes -----------------------------------------------------------------------------


def test_golden_data_header_and_frames() -> None:
    cipher = golden_cipher()
    block = cipher.key_block
    # key block: version 1, id "k1", the wrap nonce and the data key (counter bytes 0..31)
    # wrapped under the KEK with the data object's key as associated data
    wrap_aad = b"tierlog-data-key\x00" + DATA_KEY.encode()
    wrapped = AESGCM(KEK).encrypt(bytes(range(32, 44)), bytes(range(32)), wrap_aad)
    assert block == b"\x01\x02k1" + bytes(range(32, 44)) + wrapped
    header = data_header(block)
    assert header == b"TLSD" + bytes.fromhex("00000002") + bytes.fromhex("0040") + block
    assert decode_data_header(header + b"frames...") == block
    index, plans = build_sealed_index(metadata(RECORDS, 22, PAYLOADS), MIN_BLOCK_SIZE, block)
    data = seal_data_object(index, cipher, PAYLOADS)
    # header 74 bytes, then one frame per chunk of 12 + size + 16 bytes
    assert index.data_header_length == 74
    starts = [74, 74 + 33, 74 + 33 + 31]
    assert sealed_chunk_locations(index).stored_starts.tolist() == starts
    assert data[:74] == header and len(data) == 74 + 33 + 31 + 32
    # frame 0 is AES-256-GCM of the entry header and chunk, nonce 0, under the data key the
    # counter random drew (bytes 0..31), associated data binding key, number, flag, header
    aad = (
        b"tierlog-frame\x00"
        + struct.pack(">H", len(DATA_KEY))
        + DATA_KEY.encode()
        + struct.pack(">QB", 0, 0)
        + header
    )
    entry0 = bytes.fromhex("00000005000000000000000a") + b"AAAAA"
    expected0 = AESGCM(bytes(range(32))).encrypt(bytes(12), entry0, aad)
    assert data[74 : 74 + 33] == expected0
    aad_last = aad[: -len(header) - 9] + struct.pack(">QB", 2, 1) + header
    entry2 = bytes.fromhex("000000040000000000000014") + b"CCCC"
    nonce2 = bytes(4) + struct.pack(">Q", 2)
    assert data[138:] == AESGCM(bytes(range(32))).encrypt(nonce2, entry2, aad_last)
    assert len(plans) == 1 and plans[0].length == len(data)
    assert open_data_object(index, data) == PAYLOADS


def golden_index_plaintext(key_block: bytes) -> bytes:
    """The plaintext index of segment [10, 22) in one block of 5 MiB, by hand."""
    records = b"".join(
        bytes.fromhex(h)
        for h in (
            "000000000000000a00000000000003e800000000000000010000000800",
            "000000000000000d00000000000003e900000000000000010000000d01",
            "000000000000001400000000000003ea00000000000000020000001000",
        )
    ) + b"".join(struct.pack(">I", zlib.crc32(p)) for p in PAYLOADS)
    tail = bytes.fromhex("0000000000500000") + bytes.fromhex("0040") + key_block
    mapping = bytes.fromhex("000000000000000a000000010000000000000000")
    body = (
        bytes.fromhex(
            "de47de47"  # magic
            "00000109"  # index length 265 = 32 + 209 + 20 + 4
            "00000000000000aa"  # data object length 170 = 74 + 33 + 31 + 32
            "000000000000004a"  # data header length 74 = 10 + 64
            "00000001"  # block count
            "000000d1"  # segment metadata length 209 = 36 + 3 * 33 + 8 + 2 + 64
        )
        + b"OSSM"
        + bytes.fromhex("00020000")
        + bytes.fromhex("000000000000000a0000000000000016000000000000001400000003")
        + records
        + tail
        + mapping
    )
    return body + struct.pack(">I", zlib.crc32(body))


def test_golden_index_plaintext() -> None:
    block = golden_cipher().key_block
    index, _ = build_sealed_index(metadata(RECORDS, 22, PAYLOADS), MIN_BLOCK_SIZE, block)
    encoded = encode_sealed_index(index)
    # segment metadata: 36 header + 3 * 29 records + 3 * 4 CRCs + 8 block size + 2 + 64 key
    assert 36 + 87 + 12 + 8 + 2 + 64 == 0xD1
    assert 32 + 0xD1 + 20 + 4 == 0x109 == len(encoded)
    assert encoded == golden_index_plaintext(block)
    decoded = decode_sealed_index(encoded)
    assert decoded.blocks == (BlockMapping(10, 1, 0),)
    assert decoded.key_block == block and decoded.block_size == MIN_BLOCK_SIZE
    assert decoded.metadata.records.tobytes() == b"".join(r.encode() for r in RECORDS)


def test_frames_cut_into_blocks_of_at_least_the_block_size() -> None:
    # frames of 28 + size bytes after a 10-byte header; blocks close once they reach 100
    plans = plan_frame_blocks([1, 2, 3, 4, 5], [40, 10, 60, 0, 30], 100, 10)
    assert [(p.offset, p.length, p.first_entry, p.entry_count) for p in plans] == [
        (0, 10 + 68 + 38, 0, 2),  # 116 >= 100
        (116, 88 + 28, 2, 2),  # 116 >= 100
        (232, 58, 4, 1),  # the last block: what is left
    ]
    assert [p.part_number for p in plans] == [1, 2, 3]
    assert FRAME_OVERHEAD == 12 + TAG_SIZE


# -- round trips and attacks ------------------------------------------------------------------


def build(payloads: list[bytes]) -> tuple[SealedOffloadIndex, bytes, bytes]:
    """(index, data object, sealed index object) of a segment of ``payloads``."""
    records, position = [], 8
    for i, p in enumerate(payloads):
        records.append(IndexRecord(100 + 7 * i, 5000 + i, 1, position, 0))
        position += len(p)
    cipher = new_cipher(DATA_KEY, "k1", KEK)
    meta = metadata(records, 100 + 7 * len(payloads), payloads)
    index, _ = build_sealed_index(meta, MIN_BLOCK_SIZE, cipher.key_block)
    data = seal_data_object(index, cipher, payloads)
    sealed_index = seal_whole_object(
        encode_sealed_index(index), new_cipher(INDEX_KEY, "k1", KEK), 4096
    )
    return index, data, sealed_index


def read_back(
    data: bytes, sealed_index: bytes, keks: dict[str, bytes] | None = None
) -> list[bytes]:
    plain = open_sealed_object(sealed_index, INDEX_KEY, keks or {"k1": KEK})
    return open_data_object(decode_sealed_index(plain), data, keks)


payload_lists = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(payloads=payload_lists)
def test_round_trip_is_identical(payloads: list[bytes]) -> None:
    _, data, sealed_index = build(payloads)
    assert read_back(data, sealed_index) == payloads


@settings(max_examples=60, deadline=None)
@given(payloads=payload_lists, where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_of_either_object_is_refused(
    payloads: list[bytes], where: float, bit: int
) -> None:
    _, data, sealed_index = build(payloads)
    bad = bytearray(data)
    bad[int(where * len(bad))] ^= 1 << bit
    with pytest.raises(FormatError):
        read_back(bytes(bad), sealed_index)
    bad_index = bytearray(sealed_index)
    bad_index[int(where * len(bad_index))] ^= 1 << bit
    with pytest.raises(FormatError):
        read_back(data, bytes(bad_index))


@settings(max_examples=40, deadline=None)
@given(payloads=payload_lists, cut=st.integers(1, 10_000))
def test_truncated_objects_are_refused(payloads: list[bytes], cut: int) -> None:
    _, data, sealed_index = build(payloads)
    with pytest.raises(FormatError):
        read_back(data[: max(0, len(data) - cut)], sealed_index)
    with pytest.raises(FormatError):
        read_back(data, sealed_index[: max(0, len(sealed_index) - cut)])
    with pytest.raises(FormatError):
        read_back(data + b"\x00" * cut, sealed_index)  # appended bytes


def test_swapped_dropped_or_foreign_frames_are_refused() -> None:
    payloads = [b"same-size-1", b"same-size-2", b"same-size-3"]
    index, data, sealed_index = build(payloads)
    starts = sealed_chunk_locations(index).stored_starts.tolist()
    step = len(payloads[0]) + FRAME_OVERHEAD
    head, frames = data[: starts[0]], [data[s : s + step] for s in starts]
    with pytest.raises(AuthenticationError):  # swapped: frame numbers are bound
        read_back(head + frames[1] + frames[0] + frames[2], sealed_index)
    with pytest.raises(AuthenticationError):  # the last frame dropped: frame 1 is not last
        read_back(head + frames[0] + frames[1] + frames[1], sealed_index)
    with pytest.raises(FormatError):  # a frame dropped
        read_back(head + frames[0] + frames[2], sealed_index)
    _, other, _ = build(payloads)  # the same chunks sealed under another data key
    with pytest.raises(AuthenticationError):
        read_back(head + other[starts[0] :], sealed_index)
    with pytest.raises(AuthenticationError):  # another object's header and key block
        read_back(other[: starts[0]] + data[starts[0] :], sealed_index)


def test_index_layout_is_checked_after_opening() -> None:
    block = golden_cipher().key_block
    index, _ = build_sealed_index(metadata(RECORDS, 22, PAYLOADS), MIN_BLOCK_SIZE, block)
    plain = bytearray(encode_sealed_index(index))
    plain[8:16] = struct.pack(">q", 171)  # data object length one byte off
    plain[-4:] = struct.pack(">I", zlib.crc32(plain[:-4]))
    with pytest.raises(LayoutMismatchError):
        decode_sealed_index(bytes(plain))


def test_rotation_and_a_missing_key_is_named() -> None:
    _, data, sealed_index = build([b"x" * 50, b"y" * 70])
    both = {"k2": bytes(range(32, 64)), "k1": KEK}
    assert read_back(data, sealed_index, both) == [b"x" * 50, b"y" * 70]
    with pytest.raises(UnknownKeyError, match="'k1'"):
        read_back(data, sealed_index, {"k2": bytes(range(32, 64))})
