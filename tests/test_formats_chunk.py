"""Chunk header and entries: golden bytes, round trips, and rejection of bad input."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.chunk import (
    DATA_LENGTH_POS,
    HEADER_DTYPE,
    HEADER_SIZE,
    SECTION_SIZES,
    ChunkHeader,
    ChunkType,
    SubBatch,
    check_entries,
    decode_chunk,
    decode_header,
    decode_sub_batch_entry,
    encode_chunk,
    encode_entries,
    iter_entries,
    iter_records,
    make_header,
    single_entry_body,
    sub_batch_entry,
)
from tierlog.formats.compression import Compression, compress, decompress
from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

# One user chunk: chunk id 7, epoch 2, timestamp 1000 ms, one simple entry b"hi".
GOLDEN_CHUNK = bytes.fromhex(
    "50"  # magic 5, version 0
    "00"  # chunk type: user
    "0001"  # entries
    "00000001"  # records
    "00000000000003e8"  # timestamp
    "0000000000000002"  # epoch
    "0000000000000007"  # chunk id
    "2b0c4d9e"  # crc32 of the data
    "00000006"  # data length
    "00000000"  # trailer length
    "00"  # bloom size
    "000000"  # reserved
    "00000002"
    "6869"  # simple entry
)


def test_golden_chunk_encoding() -> None:
    assert encode_chunk(ChunkType.USER, 7, 2, 1000, [b"hi"]) == GOLDEN_CHUNK
    assert len(GOLDEN_CHUNK) == HEADER_SIZE + 6


def test_golden_chunk_decoding() -> None:
    chunk = decode_chunk(GOLDEN_CHUNK)
    h = chunk.header
    assert (h.chunk_type, h.num_entries, h.num_records) == (0, 1, 1)
    assert (h.timestamp, h.epoch, h.chunk_id) == (1000, 2, 7)
    assert (h.data_crc, h.data_length, h.trailer_length, h.bloom_size) == (0x2B0C4D9E, 6, 0, 0)
    assert h.total_size == len(GOLDEN_CHUNK)
    assert h.next_offset == 8
    assert bytes(chunk.data) == bytes.fromhex("000000026869")
    assert list((o, bytes(r)) for o, r in iter_records(7, chunk.data, 1)) == [(7, b"hi")]
    assert h.encode() == GOLDEN_CHUNK[:HEADER_SIZE]


def test_golden_sub_batch_entry() -> None:
    body = b"x" * 11
    entry = SubBatch(Compression.GZIP, 2, 10, body)
    data, entries, records = encode_entries([entry])
    # 1:1, gzip=1:3, 0:4 -> 0x90; 2 records; uncompressed 10; length 11
    assert data == bytes.fromhex("9000020000000a0000000b") + body
    assert (entries, records) == (1, 2)
    (view,) = list(iter_entries(data, 1))
    assert not isinstance(view, memoryview)
    assert (view.compression, view.num_records, view.uncompressed_length) == (1, 2, 10)
    assert bytes(view.data) == body


def test_trailer_and_bloom_are_sized_but_not_in_crc() -> None:
    raw = encode_chunk(ChunkType.USER, 0, 1, 5, [b"abc"], trailer=b"TT", bloom=b"B" * 16)
    chunk = decode_chunk(raw)
    assert chunk.header.bloom_size == 16 and chunk.header.trailer_length == 2
    assert bytes(chunk.bloom) == b"B" * 16 and bytes(chunk.trailer) == b"TT"
    assert chunk.header.data_crc == zlib.crc32(struct.pack(">I", 3) + b"abc")
    assert chunk.header.total_size == len(raw)


def _records_from(entries: list[bytes | SubBatch], first: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for e in entries:
        if isinstance(e, SubBatch):
            body = decompress(e.compression, e.data, e.uncompressed_length)
            pos = 0
            for _ in range(e.num_records):
                (n,) = struct.unpack_from(">I", body, pos)
                out.append((first + len(out), bytes(body[pos + 4 : pos + 4 + n])))
                pos += 4 + n
        else:
            out.append((first + len(out), e))
    return out


def _sub_batch(code: int, records: list[bytes]) -> SubBatch:
    body = b"".join(struct.pack(">I", len(r)) + r for r in records)
    return SubBatch(code, len(records), len(body), compress(code, body))


entry_strategy = st.one_of(
    st.binary(max_size=300),
    st.builds(
        _sub_batch,
        st.sampled_from([0, 1, 2, 3, 4]),
        st.lists(st.binary(max_size=50), max_size=20),
    ),
)


@given(
    entries=st.lists(entry_strategy, min_size=1, max_size=20),
    chunk_type=st.sampled_from(list(ChunkType)),
    chunk_id=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**64 - 1),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    trailer=st.binary(max_size=40),
)
def test_chunk_round_trip(
    entries: list[bytes | SubBatch],
    chunk_type: ChunkType,
    chunk_id: int,
    epoch: int,
    timestamp: int,
    trailer: bytes,
) -> None:
    raw = encode_chunk(chunk_type, chunk_id, epoch, timestamp, entries, trailer=trailer)
    chunk = decode_chunk(raw)
    h = chunk.header
    assert (h.chunk_type, h.chunk_id, h.epoch, h.timestamp) == (
        chunk_type,
        chunk_id,
        epoch,
        timestamp,
    )
    assert bytes(chunk.trailer) == trailer
    check_entries(chunk.data, h.num_entries, h.num_records)
    got = [(o, bytes(r)) for o, r in iter_records(chunk_id, chunk.data, h.num_entries)]
    assert got == _records_from(entries, chunk_id)
    assert h.num_records == len(got)


def test_decode_rejects_bad_input() -> None:
    with pytest.raises(TruncatedError):
        decode_header(GOLDEN_CHUNK[:47])
    with pytest.raises(TruncatedError):
        decode_chunk(GOLDEN_CHUNK[:-1])
    with pytest.raises(BadMagicError):
        decode_header(b"\x51" + GOLDEN_CHUNK[1:])
    with pytest.raises(BadMagicError):
        decode_header(b"\x00" * 48)
    with pytest.raises(FormatError):
        decode_header(GOLDEN_CHUNK[:1] + b"\x07" + GOLDEN_CHUNK[2:])  # unknown chunk type
    flipped = bytearray(GOLDEN_CHUNK)
    flipped[-1] ^= 0x01
    with pytest.raises(CrcMismatchError):
        decode_chunk(bytes(flipped))
    # 3 entries cannot fit in 6 data bytes
    with pytest.raises(InvalidSizeError):
        decode_header(GOLDEN_CHUNK[:2] + b"\x00\x03" + GOLDEN_CHUNK[4:])


def test_entry_structure_errors() -> None:
    data, _, _ = encode_entries([b"abc", b"de"])
    with pytest.raises(InvalidSizeError):
        check_entries(data, 2, 3)  # record count mismatch
    with pytest.raises(InvalidSizeError):
        check_entries(data, 1, 1)  # bytes left over
    with pytest.raises(TruncatedError):
        check_entries(data[:-1], 2, 2)
    with pytest.raises(TruncatedError):
        list(iter_records(0, data[:-1], 2))
    with pytest.raises(InvalidSizeError):
        list(iter_records(0, data, 1))
    with pytest.raises(InvalidSizeError):
        single_entry_body(data, 2)


def test_make_header_limits() -> None:
    with pytest.raises(InvalidSizeError):
        make_header(ChunkType.USER, 0, 1, 0, b"", 70_000, 0)
    with pytest.raises(InvalidSizeError):
        SubBatch(8, 1, 1, b"x")
    with pytest.raises(InvalidSizeError):
        SubBatch(0, 70_000, 1, b"x")


@pytest.mark.parametrize("code", [0, 1, 2, 3, 4])
def test_compression_round_trip(code: int) -> None:
    body = b"hello sub-batch " * 50
    assert bytes(decompress(code, compress(code, body), len(body))) == body


def test_compression_errors() -> None:
    body = b"payload" * 10
    with pytest.raises(UnsupportedError, match="code-5"):
        decompress(5, b"xx", 2)
    with pytest.raises(UnsupportedError):
        compress(7, body)
    with pytest.raises(InvalidSizeError):
        decompress(Compression.GZIP, compress(Compression.GZIP, body), len(body) + 1)
    with pytest.raises(FormatError):
        decompress(Compression.GZIP, b"not gzip at all", 10)
    with pytest.raises(FormatError):
        decompress(Compression.ZSTD, b"not zstd", 10)
    with pytest.raises(FormatError):
        decompress(Compression.LZ4, b"not lz4", 10)
    with pytest.raises(FormatError):
        decompress(Compression.SNAPPY, b"\xffnot snappy", 10)


# ---------------------------------------------------------------- one declaration, two views


@given(
    st.tuples(
        st.integers(0, 2),
        st.integers(0, 0xFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, 255),
    )
)
def test_header_struct_and_dtype_read_the_same_fields(fields: tuple[int, ...]) -> None:
    header = ChunkHeader(*fields)
    raw = header.encode()
    row = np.frombuffer(raw, dtype=HEADER_DTYPE)[0]
    assert int(row["magic"]) == 0x50
    for name in ChunkHeader.__slots__:
        dtype_name = "crc" if name == "data_crc" else name
        assert int(row[dtype_name]) == getattr(header, name), name
    assert SECTION_SIZES.unpack_from(raw, DATA_LENGTH_POS) == (
        header.data_length,
        header.trailer_length,
        header.bloom_size,
    )


@given(st.integers(0, 4), st.lists(st.binary(max_size=20), min_size=1, max_size=5))
def test_sub_batch_entry_round_trip(compression: int, records: list[bytes]) -> None:
    body = encode_entries(list(records))[0]
    entry = sub_batch_entry(body, len(records), len(body), compression)
    assert entry[0] == 0x80 | compression << 4
    assert decode_sub_batch_entry(entry) == SubBatch(compression, len(records), len(body), body)
    with pytest.raises(InvalidSizeError):
        decode_sub_batch_entry(entry + b"x")
    with pytest.raises(TruncatedError):
        decode_sub_batch_entry(entry[:10])
    with pytest.raises(FormatError):
        decode_sub_batch_entry(b"\x00" + entry[1:])
    with pytest.raises(UnsupportedError):
        sub_batch_entry(body, len(records), len(body), 5)
