"""Offload block format and index object: golden bytes computed by hand from the layout
(Pulsar's block header, entries and FEDCDEAD padding; index header in Pulsar's field order),
round trips, and a decoder that rejects every kind of corruption with a typed error."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import (
    BadMagicError,
    BadPaddingError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    LayoutMismatchError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.offload import (
    MIN_BLOCK_OVERHEAD,
    MIN_BLOCK_SIZE,
    BlockMapping,
    SegmentMetadata,
    build_index,
    check_block_size,
    chunk_locations,
    decode_block_header,
    decode_index,
    encode_block,
    encode_block_header,
    encode_index,
    iter_block_entries,
    plan_blocks,
    required_block_size,
)
from tierlog.formats.segment import INDEX_RECORD_DTYPE, IndexRecord

# -- golden bytes ----------------------------------------------------------------------------

HEADER_300_7 = bytes.fromhex(
    "fbdbabcb"  # magic
    "0000000000000080"  # header length 128
    "000000000000012c"  # block length 300
    "0000000000000007"  # first entry id 7
) + bytes(100)


def test_block_header_golden() -> None:
    assert encode_block_header(300, 7) == HEADER_300_7
    assert len(HEADER_300_7) == 128
    header = decode_block_header(HEADER_300_7)
    assert (header.header_length, header.block_length, header.first_entry_id) == (128, 300, 7)


IDS = [10, 13, 20]
PAYLOADS = [b"AAAAA", b"BBB", b"CCCC"]
BLOCK1 = (
    bytes.fromhex("fbdbabcb000000000000008000000000000000a5000000000000000a")
    + bytes(100)
    + bytes.fromhex("00000005000000000000000a")
    + b"AAAAA"
    + bytes.fromhex("00000003000000000000000d")
    + b"BBB"
    + bytes.fromhex("fedcdeadfe")  # 5 bytes of padding: entry 20 (16 bytes) does not fit
)
BLOCK2 = (
    bytes.fromhex("fbdbabcb000000000000008000000000000000900000000000000014")
    + bytes(100)
    + bytes.fromhex("000000040000000000000014")
    + b"CCCC"
)


def test_blocks_golden_entries_padding_and_final_block_size() -> None:
    plans = plan_blocks(IDS, [len(p) for p in PAYLOADS], 165)
    assert [(p.part_number, p.offset, p.length, p.first_entry, p.entry_count) for p in plans] == [
        (1, 0, 165, 0, 2),
        (2, 165, 144, 2, 1),
    ]
    # final block: header + remaining payload bytes + 12 per remaining entry (not 4 * 8)
    assert plans[1].length == 128 + 4 + 1 * 12
    assert encode_block(plans[0], IDS, PAYLOADS) == BLOCK1
    assert encode_block(plans[1], IDS, PAYLOADS) == BLOCK2
    assert len(BLOCK1) == 165 and len(BLOCK2) == 144
    entries = [
        (e.entry_id, BLOCK1[e.position : e.position + e.length]) for e in iter_block_entries(BLOCK1)
    ]
    assert entries == [(10, b"AAAAA"), (13, b"BBB")]
    assert [(e.entry_id, e.length) for e in iter_block_entries(BLOCK2)] == [(20, 4)]


def test_block_exactly_full_has_no_padding() -> None:
    plans = plan_blocks(IDS, [5, 3, 4], 160)
    assert plans[0].length == 160 and plans[0].entry_count == 2
    block = encode_block(plans[0], IDS, PAYLOADS)
    assert block.endswith(b"BBB")


def test_padding_pattern_repeats_from_the_first_padding_byte() -> None:
    plans = plan_blocks([0, 1], [1, 1], 128 + 13 + 11)  # second entry needs 13, 11 left
    block = encode_block(plans[0], [0, 1], [b"x", b"y"])
    assert block[128 + 13 :] == bytes.fromhex("fedcdeadfedcdeadfedcde")


RECORDS = [
    IndexRecord(10, 1000, 1, 8, 0),
    IndexRecord(13, 1001, 1, 13, 1),
    IndexRecord(20, 1002, 2, 16, 0),
]


def _metadata(
    records: list[IndexRecord], next_offset: int, size: int, payloads: list[bytes]
) -> SegmentMetadata:
    arr = np.frombuffer(b"".join(r.encode() for r in records), dtype=INDEX_RECORD_DTYPE)
    crcs = np.array([zlib.crc32(p) for p in payloads], dtype=np.uint32)
    return SegmentMetadata(records[0].chunk_id, next_offset, size, arr, crcs)


def golden_index() -> bytes:
    """The index object for segment [10, 22) of 20 bytes cut into blocks of 165, by hand."""
    records = b"".join(
        bytes.fromhex(h)
        for h in (
            "000000000000000a00000000000003e800000000000000010000000800",
            "000000000000000d00000000000003e900000000000000010000000d01",
            "000000000000001400000000000003ea00000000000000020000001000",
        )
    ) + b"".join(struct.pack(">I", zlib.crc32(p)) for p in PAYLOADS)  # chunk CRCs
    mappings = bytes.fromhex(
        "000000000000000a00000001000000000000000000000000000000140000000200000000000000a5"
    )
    head = bytes.fromhex(
        "de47de47"  # magic
        "000000d7"  # index length 215 = 32 + 143 + 2 * 20
        "0000000000000135"  # data object length 309 = 165 + 144
        "0000000000000080"  # data header length 128
        "00000002"  # block count
        "0000008f"  # segment metadata length 143 = 36 + 3 * (29 + 4) + 8
    ) + (
        b"OSSM"
        + bytes.fromhex("00010000")
        + bytes.fromhex("000000000000000a0000000000000016000000000000001400000003")
    )
    covered = head + records + struct.pack(">I", zlib.crc32(mappings))
    return covered + struct.pack(">I", zlib.crc32(covered)) + mappings


def test_index_golden() -> None:
    index, plans = build_index(_metadata(RECORDS, 22, 20, PAYLOADS), 165)
    encoded = encode_index(index)
    assert encoded == golden_index()
    decoded = decode_index(encoded)
    assert decoded.blocks == (BlockMapping(10, 1, 0), BlockMapping(20, 2, 165))
    assert decoded.data_object_length == 309 and decoded.block_size == 165
    assert decoded.metadata.records.tobytes() == b"".join(r.encode() for r in RECORDS)
    assert (decoded.metadata.first_offset, decoded.metadata.next_offset) == (10, 22)
    locs = chunk_locations(decoded)
    assert locs.crcs.tolist() == [zlib.crc32(p) for p in PAYLOADS]
    # payload offsets: block 1 at 0 (+128 +12), then +5+12; block 2 at 165 (+128 +12)
    assert locs.data_offsets.tolist() == [140, 157, 305]
    assert locs.sizes.tolist() == [5, 3, 4]
    data = BLOCK1 + BLOCK2
    assert [data[o : o + s] for o, s in zip(locs.data_offsets, locs.sizes, strict=True)] == PAYLOADS
    assert len(plans) == 2


def test_block_size_rules() -> None:
    assert MIN_BLOCK_OVERHEAD == 140
    assert required_block_size(10) == MIN_BLOCK_SIZE
    assert required_block_size(MIN_BLOCK_SIZE) == MIN_BLOCK_SIZE + 140
    with pytest.raises(InvalidSizeError):
        check_block_size(MIN_BLOCK_SIZE - 1)
    with pytest.raises(InvalidSizeError):
        check_block_size(True)
    assert check_block_size(MIN_BLOCK_SIZE) == MIN_BLOCK_SIZE
    plan_blocks([0], [100], 240)  # 100 + 140 fits exactly
    with pytest.raises(InvalidSizeError):
        plan_blocks([0], [101], 240)
    with pytest.raises(InvalidSizeError):
        plan_blocks([], [], 240)


# -- corruption ------------------------------------------------------------------------------


def _patch(buf: bytes, at: int, new: bytes) -> bytes:
    return buf[:at] + new + buf[at + len(new) :]


@pytest.mark.parametrize(
    ("block", "error"),
    [
        (_patch(BLOCK1, 0, b"\xfb\xdb\xab\xcc"), BadMagicError),
        (_patch(BLOCK1, 4, struct.pack(">q", 64)), UnsupportedError),
        (_patch(BLOCK1, 12, struct.pack(">q", 166)), InvalidSizeError),
        (_patch(BLOCK1, 12, struct.pack(">q", 10)), InvalidSizeError),
        (_patch(BLOCK1, 20, struct.pack(">q", -1)), InvalidSizeError),
        (_patch(BLOCK1, 20, struct.pack(">q", 11)), FormatError),  # first entry id mismatch
        (_patch(BLOCK1, 60, b"\x01"), BadPaddingError),  # header padding
        (_patch(BLOCK1, 128, struct.pack(">i", 500)), TruncatedError),  # entry past the end
        (_patch(BLOCK1, 128 + 17 + 4, struct.pack(">q", 9)), FormatError),  # ids decreasing
        (_patch(BLOCK1, 162, b"\x00"), BadPaddingError),  # padding pattern
        (BLOCK1[:100], TruncatedError),
        (BLOCK1[:-1], InvalidSizeError),
        (_patch(BLOCK1, 128, bytes.fromhex("fedcdead")), InvalidSizeError),  # no entries
    ],
)
def test_block_decoder_rejects_corruption(block: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        list(iter_block_entries(block))


def _reseal(buf: bytes) -> bytes:
    """Recompute both CRCs so a structural corruption gets past them."""
    meta_len = struct.unpack_from(">i", buf, 28)[0]
    meta_end = 32 + meta_len
    mappings = buf[meta_end:]
    buf = _patch(buf, meta_end - 8, struct.pack(">I", zlib.crc32(mappings)))
    return _patch(buf, meta_end - 4, struct.pack(">I", zlib.crc32(buf[: meta_end - 4])))


GOLDEN = golden_index()
RECORDS_AT = 32 + 36


@pytest.mark.parametrize(
    ("buf", "error"),
    [
        (GOLDEN[:20], TruncatedError),
        (GOLDEN[:-1], TruncatedError),
        (GOLDEN + b"\x00", InvalidSizeError),
        (_patch(GOLDEN, 0, b"\xde\x47\xde\x48"), BadMagicError),
        (_patch(GOLDEN, 50, b"\xff"), CrcMismatchError),  # a record byte
        (_patch(GOLDEN, len(GOLDEN) - 1, b"\x01"), CrcMismatchError),  # a mapping byte
        (_patch(GOLDEN, 8, struct.pack(">q", 310)), CrcMismatchError),  # data length
        (_reseal(_patch(GOLDEN, 16, struct.pack(">q", 64))), UnsupportedError),
        (_reseal(_patch(GOLDEN, 24, struct.pack(">i", 3))), InvalidSizeError),  # count
        (_reseal(_patch(GOLDEN, 24, struct.pack(">i", 0))), InvalidSizeError),
        (_reseal(_patch(GOLDEN, 28, struct.pack(">i", 4))), InvalidSizeError),
        (_reseal(_patch(GOLDEN, 32, b"XSSM")), BadMagicError),
        (_reseal(_patch(GOLDEN, 36, b"\x00\x02")), UnsupportedError),
        (_reseal(_patch(GOLDEN, 64, struct.pack(">I", 4))), InvalidSizeError),  # record count
        (_reseal(_patch(GOLDEN, 40, struct.pack(">Q", 11))), FormatError),  # first offset
        (_reseal(_patch(GOLDEN, 48, struct.pack(">Q", 20))), FormatError),  # next offset
        (_reseal(_patch(GOLDEN, 56, struct.pack(">Q", 16))), FormatError),  # segment size
        (_reseal(_patch(GOLDEN, RECORDS_AT + 29, struct.pack(">Q", 9))), FormatError),
        (_reseal(_patch(GOLDEN, RECORDS_AT + 29 + 24, struct.pack(">I", 7))), FormatError),
        (_reseal(_patch(GOLDEN, RECORDS_AT + 29 + 16, struct.pack(">Q", 0))), FormatError),
        (_reseal(_patch(GOLDEN, RECORDS_AT + 28, b"\x07")), FormatError),  # chunk type
        (_reseal(_patch(GOLDEN, RECORDS_AT + 24, struct.pack(">I", 9))), FormatError),
        (_reseal(_patch(GOLDEN, 8, struct.pack(">q", 310))), LayoutMismatchError),
        (_reseal(_patch(GOLDEN, 215 - 8, struct.pack(">q", 164))), LayoutMismatchError),
        (_reseal(_patch(GOLDEN, 215 - 12, struct.pack(">i", 3))), LayoutMismatchError),
        (_reseal(_patch(GOLDEN, 215 - 20, struct.pack(">q", 13))), LayoutMismatchError),
        (_reseal(_patch(GOLDEN, 215 - 40, struct.pack(">q", 13))), LayoutMismatchError),
    ],
)
def test_index_decoder_rejects_corruption(buf: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_index(buf)


def test_every_single_byte_flip_of_the_index_is_rejected() -> None:
    for at in range(len(GOLDEN)):
        flipped = _patch(GOLDEN, at, bytes([GOLDEN[at] ^ 0x40]))
        with pytest.raises(FormatError):
            decode_index(flipped)


# -- round trips -----------------------------------------------------------------------------


@st.composite
def segments(draw: st.DrawFn) -> tuple[list[int], list[bytes], int]:
    count = draw(st.integers(1, 40))
    ids: list[int] = []
    next_id = draw(st.integers(0, 1 << 40))
    for _ in range(count):
        ids.append(next_id)
        next_id += draw(st.integers(1, 1000))
    payloads = [draw(st.binary(min_size=0, max_size=300)) for _ in range(count)]
    block_size = draw(st.integers(max(len(p) for p in payloads) + 140, 2000))
    return ids, payloads, block_size


@given(segments())
def test_round_trip(segment: tuple[list[int], list[bytes], int]) -> None:
    ids, payloads, block_size = segment
    plans = plan_blocks(ids, [len(p) for p in payloads], block_size)
    data = b"".join(encode_block(p, ids, payloads) for p in plans)
    got: list[tuple[int, bytes]] = []
    for plan in plans:
        block = data[plan.offset : plan.offset + plan.length]
        assert plan.length == block_size or plan is plans[-1]
        got += [
            (e.entry_id, block[e.position : e.position + e.length])
            for e in iter_block_entries(block)
        ]
    assert got == list(zip(ids, payloads, strict=True))
    # the index: positions from payload sizes (chunks back to back after the 8-byte header)
    positions = np.cumsum([8] + [len(p) for p in payloads])
    size = int(positions[-1])
    if any(len(p) == 0 for p in payloads):
        return  # a real chunk is never empty: positions would not increase
    records = [
        IndexRecord(i, 5, 1, int(pos), 0) for i, pos in zip(ids, positions[:-1], strict=True)
    ]
    index, _ = build_index(_metadata(records, ids[-1] + 1, size, payloads), block_size)
    decoded = decode_index(encode_index(index))
    assert decoded.data_object_length == len(data)
    locs = chunk_locations(decoded)
    assert [data[o : o + s] for o, s in zip(locs.data_offsets, locs.sizes, strict=True)] == payloads
