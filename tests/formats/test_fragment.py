"""The fragment format: golden bytes, round trips, ranged reads and rejection of bad input."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
)
from tierlog.formats.fragment import (
    FRAGMENT_INDEX_HEADER_SIZE,
    HEADER_SIZE,
    INDEX_RECORD_SIZE,
    TRAILER_SIZE,
    FragmentChunkInfo,
    FragmentPlacement,
    decode_index,
    decode_trailer,
    encode_fragment,
    fragment_size,
    index_range,
    validate_fragment,
)

# An Osiris chunk header, written independently of the code under test.
OSIRIS_HEADER = struct.Struct(">BBHIqQQIIIB3x")


def osiris_chunk(
    chunk_id: int,
    records: list[bytes],
    timestamp: int,
    epoch: int,
    chunk_type: int = 0,
    bloom: bytes = b"",
    trailer: bytes = b"",
) -> tuple[bytes, FragmentChunkInfo]:
    data = b"".join(struct.pack(">I", len(r)) + r for r in records)
    crc = zlib.crc32(data)
    header = OSIRIS_HEADER.pack(
        0x50,
        chunk_type,
        len(records),
        len(records),
        timestamp,
        epoch,
        chunk_id,
        crc,
        len(data),
        len(trailer),
        len(bloom),
    )
    chunk = header + bloom + data + trailer
    info = FragmentChunkInfo(
        chunk_id=chunk_id,
        timestamp=timestamp,
        epoch=epoch,
        size=len(chunk),
        num_records=len(records),
        crc=crc,
        chunk_type=chunk_type,
        num_entries=len(records),
    )
    return chunk, info


def build(
    specs: list[tuple[list[bytes], int, int]],
    first: int = 100,
    placement: FragmentPlacement | None = None,
) -> tuple[bytes, list[FragmentChunkInfo], list[bytes]]:
    chunks, infos, offset = [], [], first
    for records, ts, epoch in specs:
        chunk, info = osiris_chunk(offset, records, ts, epoch)
        chunks.append(chunk)
        infos.append(info)
        offset += len(records)
    placement = placement or FragmentPlacement(
        seq_no=2, segment_first_offset=50, segment_position=4096
    )
    parts, _ = encode_fragment(placement, chunks, infos)
    return b"".join(parts), infos, chunks


GOLDEN_SPECS = [([b"a", b"bc"], 1_700_000_000_000, 3), ([b"xyz"], 1_700_000_000_005, 4)]
GOLDEN_HEX = (
    "544c46520000000150000002000000020000018bcfe5680000000000000000030000000000000064"
    "0a181b8a0000000b0000000000000000000000016100000002626350000001000000010000018bcf"
    "e56805000000000000000400000000000000669b1613e50000000700000000000000000000000378"
    "797a544c46490000000100000000000000640000018bcfe568000000000000000003000000000000"
    "00080000003b000000020a181b8a0002000000000000000000660000018bcfe56805000000000000"
    "0004000000000000004300000037000000019b1613e5000100000000000000000064000000000000"
    "00670000018bcfe568000000018bcfe5680500000000000000040000000000000032000000000000"
    "1000000000000000007a0000000000000072000000020000000200000000a73696ac00000001544c"
    "4654"
)


def test_golden_bytes() -> None:
    data, infos, _ = build(GOLDEN_SPECS)
    assert data.hex() == GOLDEN_HEX
    # The documented layout, field by field.
    assert data[:8] == b"TLFR\x00\x00\x00\x01"
    assert data[8] == 0x50  # the first chunk starts right after the header
    index_at = HEADER_SIZE + sum(i.size for i in infos)
    assert data[index_at : index_at + 8] == b"TLFI\x00\x00\x00\x01"
    record = struct.unpack_from(">QqQQIIIHBx", data, index_at + 8 + INDEX_RECORD_SIZE)
    assert record == (102, 1_700_000_000_005, 4, HEADER_SIZE + infos[0].size, infos[1].size, 1,
                      infos[1].crc, 1, 0)  # fmt: skip
    assert data[-4:] == b"TLFT"
    trailer = decode_trailer(data)
    assert (trailer.first_offset, trailer.next_offset) == (100, 103)
    assert (trailer.min_timestamp, trailer.max_timestamp, trailer.max_epoch) == (
        1_700_000_000_000,
        1_700_000_000_005,
        4,
    )
    assert (trailer.seq_no, trailer.segment_first_offset, trailer.segment_position) == (2, 50, 4096)
    assert (trailer.index_start, trailer.data_size, trailer.chunk_count) == (
        index_at,
        index_at - 8,
        2,
    )
    assert trailer.total_size == len(data) == fragment_size(trailer.data_size, 2)


def test_parts_keep_chunk_buffers_uncopied() -> None:
    chunk, info = osiris_chunk(0, [b"hello"], 1, 1)
    view = memoryview(bytearray(chunk))
    parts, trailer = encode_fragment(FragmentPlacement(0, 0, 8), [view], [info])
    assert parts[1] is view
    assert validate_fragment(b"".join(parts)).trailer == trailer


chunk_specs = st.lists(
    st.tuples(
        st.lists(st.binary(max_size=20), min_size=1, max_size=4),
        st.integers(0, 10),  # timestamp step
        st.integers(0, 2),  # epoch step
    ),
    min_size=1,
    max_size=12,
)


@given(
    specs=chunk_specs,
    first=st.integers(0, 2**40),
    placement=st.builds(
        FragmentPlacement, st.integers(0, 2**32 - 1), st.integers(0, 2**63), st.integers(0, 2**40)
    ),
)
def test_round_trip(
    specs: list[tuple[list[bytes], int, int]], first: int, placement: FragmentPlacement
) -> None:
    ts, epoch, absolute = 1_000, 1, []
    for records, dts, de in specs:
        ts, epoch = ts + dts, epoch + de
        absolute.append((records, ts, epoch))
    data, infos, chunks = build(absolute, first, placement)
    index = validate_fragment(data)
    t = index.trailer
    assert t == decode_trailer(data[-TRAILER_SIZE:])
    assert (t.seq_no, t.segment_first_offset, t.segment_position) == (
        placement.seq_no,
        placement.segment_first_offset,
        placement.segment_position,
    )
    assert t.first_offset == first
    assert t.next_offset == first + sum(len(r) for r, _, _ in specs)
    assert t.max_epoch == max(i.epoch for i in infos)
    # One ranged GET from manifest facts alone yields the same index.
    start, end = index_range(t.data_size, t.chunk_count)
    ranged = decode_index(data[start:end], t)
    assert len(ranged) == len(infos)
    for i, info in enumerate(infos):
        got, position = ranged.chunk(i)
        assert got == info
        assert data[position : position + info.size] == chunks[i]
    for offset in range(t.first_offset, t.next_offset):
        i = ranged.find_offset(offset)
        assert i is not None
        assert infos[i].chunk_id <= offset < infos[i].chunk_id + infos[i].num_records
    assert ranged.find_offset(t.next_offset) is None
    assert ranged.find_offset(t.first_offset - 1) is None
    assert ranged.find_timestamp(t.max_timestamp + 1) is None
    j = ranged.find_timestamp(t.min_timestamp)
    assert j == 0


@given(specs=chunk_specs, data=st.data())
def test_any_flipped_metadata_byte_is_rejected(
    specs: list[tuple[list[bytes], int, int]], data: st.DataObject
) -> None:
    frag, _, _ = build([(r, 10 + i, 1) for i, (r, _, _) in enumerate(specs)])
    t = decode_trailer(frag)
    pos = data.draw(st.integers(t.index_start, len(frag) - 1))
    bit = data.draw(st.integers(0, 7))
    bad = bytearray(frag)
    bad[pos] ^= 1 << bit
    with pytest.raises(FormatError):
        validate_fragment(bytes(bad))


@given(specs=chunk_specs, data=st.data())
def test_any_flipped_chunk_byte_is_rejected_by_whole_validation(
    specs: list[tuple[list[bytes], int, int]], data: st.DataObject
) -> None:
    frag, infos, _ = build([(r, 10 + i, 1) for i, (r, _, _) in enumerate(specs)])
    t = decode_trailer(frag)
    # Every byte but the 3 reserved ones at the end of each Osiris chunk header (unchecked,
    # as in Osiris).
    reserved, at = set(), HEADER_SIZE
    for info in infos:
        reserved |= {at + 45, at + 46, at + 47}
        at += info.size
    pos = data.draw(st.integers(0, t.index_start - 1).filter(lambda p: p not in reserved))
    bad = bytearray(frag)
    bad[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(FormatError):
        validate_fragment(bytes(bad))


def test_flipped_entry_data_is_a_crc_mismatch() -> None:
    frag, _, _ = build(GOLDEN_SPECS)
    bad = bytearray(frag)
    bad[HEADER_SIZE + 48 + 4] ^= 0xFF  # first record byte of the first chunk
    with pytest.raises(CrcMismatchError):
        validate_fragment(bytes(bad))
    validate_fragment(bytes(bad), check_chunks=False)  # metadata alone is still intact


@given(specs=chunk_specs, data=st.data())
def test_truncation_is_rejected(
    specs: list[tuple[list[bytes], int, int]], data: st.DataObject
) -> None:
    frag, _, _ = build([(r, 10, 1) for r, _, _ in specs])
    cut = data.draw(st.integers(0, len(frag) - 1))
    with pytest.raises(FormatError):
        validate_fragment(frag[:cut])


def test_short_inputs_raise_truncated() -> None:
    frag, _, _ = build(GOLDEN_SPECS)
    t = decode_trailer(frag)
    with pytest.raises(TruncatedError):
        decode_trailer(frag[-TRAILER_SIZE + 1 :])
    start, end = index_range(t.data_size, t.chunk_count)
    with pytest.raises(TruncatedError):
        decode_index(frag[start : end - 1], t)
    with pytest.raises(TruncatedError):
        validate_fragment(frag[:20])


def test_bad_magic() -> None:
    frag, _, _ = build(GOLDEN_SPECS)
    with pytest.raises(BadMagicError):
        decode_trailer(frag[:-4] + b"XXXX")
    with pytest.raises(BadMagicError):
        validate_fragment(b"XXXX" + frag[4:])
    t = decode_trailer(frag)
    start, end = index_range(t.data_size, t.chunk_count)
    with pytest.raises(BadMagicError):
        decode_index(b"XXXX" + frag[start + 4 : end], t)


def test_trailer_of_another_fragment_fails_the_crc() -> None:
    a, _, _ = build(GOLDEN_SPECS)
    b, _, _ = build(GOLDEN_SPECS, first=200)
    ta, tb = decode_trailer(a), decode_trailer(b)
    start, end = index_range(ta.data_size, ta.chunk_count)
    with pytest.raises(CrcMismatchError):
        decode_index(a[start:end], tb)


def test_impossible_trailer_sizes() -> None:
    frag, _, _ = build(GOLDEN_SPECS)
    t = decode_trailer(frag)
    # chunk count 0 (the count field sits at bytes 72..76 of the trailer)
    bad = bytearray(frag)
    struct.pack_into(">I", bad, len(frag) - TRAILER_SIZE + 72, 0)
    with pytest.raises(InvalidSizeError):
        decode_trailer(bytes(bad))
    # index start that does not follow the data
    bad = bytearray(frag)
    struct.pack_into(">Q", bad, len(frag) - TRAILER_SIZE + 56, t.index_start + 1)
    with pytest.raises(InvalidSizeError):
        decode_trailer(bytes(bad))
    # extra bytes after a valid fragment
    with pytest.raises(FormatError):
        validate_fragment(frag + b"\x00")
    assert FRAGMENT_INDEX_HEADER_SIZE == 8


def test_encoder_rejects_inconsistent_input() -> None:
    c0, i0 = osiris_chunk(10, [b"a", b"b"], 1, 1)
    c1, i1 = osiris_chunk(12, [b"c"], 2, 1)
    placement = FragmentPlacement(0, 0, 8)
    with pytest.raises(InvalidSizeError):
        encode_fragment(placement, [], [])
    with pytest.raises(InvalidSizeError):
        encode_fragment(placement, [c0], [i0, i1])
    with pytest.raises(InvalidSizeError):  # gap in chunk ids
        encode_fragment(placement, [c0, c1], [i0, FragmentChunkInfo(13, 2, 1, i1.size, 1, i1.crc)])
    with pytest.raises(InvalidSizeError):  # size disagrees with the buffer
        encode_fragment(placement, [c0], [FragmentChunkInfo(10, 1, 1, i0.size + 1, 2, i0.crc)])
    with pytest.raises(InvalidSizeError):  # a chunk without records
        encode_fragment(placement, [c0], [FragmentChunkInfo(10, 1, 1, i0.size, 0, i0.crc)])
    with pytest.raises(InvalidSizeError):  # smaller than a chunk header
        encode_fragment(placement, [b"x" * 10], [FragmentChunkInfo(10, 1, 1, 10, 1, 0)])


def test_index_contradicting_the_chunks_is_rejected() -> None:
    c0, i0 = osiris_chunk(10, [b"a", b"b"], 1, 1)
    # An index record that claims a different epoch than the chunk header holds.
    parts, _ = encode_fragment(
        FragmentPlacement(0, 0, 8), [c0], [FragmentChunkInfo(10, 1, 2, i0.size, 2, i0.crc, 0, 2)]
    )
    frag = b"".join(parts)
    validate_fragment(frag, check_chunks=False)
    with pytest.raises(InvalidSizeError):
        validate_fragment(frag)
