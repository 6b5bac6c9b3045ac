"""Fragment format v2: golden bytes, round trips (none / zstd / dictionary), v1 still read,
and a typed error for every damaged byte, frame or index record."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.formats.chunk import encode_chunk, encode_records
from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.fragment import (
    TRAILER_SIZE,
    FragmentChunkInfo,
    FragmentPlacement,
    encode_fragment,
)
from tierlog.formats.fragment_frames import (
    FrameDecoder,
    iter_chunks,
    validate_fragment,
)
from tierlog.formats.fragment_v2 import (
    CODEC_NONE,
    CODEC_ZSTD,
    FRAGMENT_V2_INDEX_HEADER_SIZE,
    INDEX_RECORD_SIZE,
    FragmentIndexV2,
    FragmentTrailerV2,
    FrameCoding,
    decode_fragment,
    decode_index,
    decode_trailer,
    encode_fragment_v2,
    index_region,
    stored_sizes,
)
from tierlog.formats.zstd_dictionary import (
    decode_dictionary,
    encode_dictionary,
    train_dictionary,
)

# An Osiris chunk header, written independently of the code under test.
OSIRIS_HEADER = struct.Struct(">BBHIqQQIIIB3x")
PLACEMENT = FragmentPlacement(seq_no=2, segment_first_offset=50, segment_position=4096)


def osiris_chunk(
    chunk_id: int, records: list[bytes], timestamp: int, epoch: int, bloom: bytes = b""
) -> tuple[bytes, FragmentChunkInfo]:
    data = b"".join(struct.pack(">I", len(r)) + r for r in records)
    crc = zlib.crc32(data)
    header = OSIRIS_HEADER.pack(
        0x50, 0, len(records), len(records), timestamp, epoch, chunk_id, crc, len(data), 0,
        len(bloom),
    )  # fmt: skip
    chunk = header + bloom + data
    info = FragmentChunkInfo(
        chunk_id, timestamp, epoch, len(chunk), len(records), crc, 0, len(records)
    )
    return chunk, info


def build_chunks(
    specs: list[tuple[list[bytes], int, int, bytes]], first: int = 100
) -> tuple[list[bytes], list[FragmentChunkInfo]]:
    chunks, infos, offset = [], [], first
    for records, ts, epoch, bloom in specs:
        chunk, info = osiris_chunk(offset, records, ts, epoch, bloom)
        chunks.append(chunk)
        infos.append(info)
        offset += len(records)
    return chunks, infos


def encode(chunks: list[bytes], infos: list[FragmentChunkInfo], coding: FrameCoding) -> bytes:
    parts, _ = encode_fragment_v2(PLACEMENT, chunks, infos, coding)
    return b"".join(parts)


GOLDEN_SPECS = [
    ([b"a", b"bc"], 1_700_000_000_000, 3, b"\x0f\xf0"),
    ([b"xyz"], 1_700_000_000_005, 4, b""),
]
GOLDEN_HEX = (
    "544c46520000000250000002000000020000018bcfe5680000000000000000030000000000000064"
    "0a181b8a0000000b00000000020000000ff000000001610000000262635000000100000001000001"
    "8bcfe56805000000000000000400000000000000669b1613e5000000070000000000000000000000"
    "0378797a544c46490000000200000000000000020000000000000000000000000000000000000000"
    "00000000000000640000018bcfe56800000000000000000300000000000000080000003d0000003d"
    "000000020a181b8afb4923b600020002de704e0e0000000000000000000000660000018bcfe56805"
    "000000000000000400000000000000450000003700000037000000019b1613e5441baaa700010000"
    "ee061dd8000000000ff0000000000000006400000000000000670000018bcfe568000000018bcfe5"
    "6805000000000000000400000000000000320000000000001000000000000000007c000000000000"
    "00740000000200000002000000a6f2deae7900000002544c4654"
)


def test_golden_bytes_uncompressed() -> None:
    chunks, infos = build_chunks(GOLDEN_SPECS)
    data = encode(chunks, infos, FrameCoding(codec=CODEC_NONE))
    assert data.hex() == GOLDEN_HEX
    # The documented layout, field by field.
    assert data[:8] == b"TLFR\x00\x00\x00\x02"
    assert data[8 : 8 + len(chunks[0])] == chunks[0]  # codec none: frames are the chunks
    index_at = 8 + sum(len(c) for c in chunks)
    header = struct.unpack_from(">4sIBBHI16sI", data, index_at)
    assert header == (b"TLFI", 2, CODEC_NONE, 0, 0, 2, bytes(16), 0)
    at = index_at + FRAGMENT_V2_INDEX_HEADER_SIZE
    rec = struct.unpack_from(">QqQQIIIIIHBBI4x", data, at)
    assert rec[:12] == (
        100, 1_700_000_000_000, 3, 8, len(chunks[0]), len(chunks[0]), 2, infos[0].crc,
        zlib.crc32(chunks[0]), 2, 0, 2,
    )  # fmt: skip
    assert rec[12] == zlib.crc32(b"\x0f\xf0", zlib.crc32(data[at : at + 56]))
    blooms_at = at + 2 * INDEX_RECORD_SIZE
    assert data[blooms_at : blooms_at + 2] == b"\x0f\xf0"
    trailer = struct.unpack_from(">QQqqQQQQQIIIII4s", data, len(data) - TRAILER_SIZE)
    index_size = FRAGMENT_V2_INDEX_HEADER_SIZE + 2 * INDEX_RECORD_SIZE + 2
    assert trailer[:12] == (
        100, 103, 1_700_000_000_000, 1_700_000_000_005, 4, 50, 4096, index_at, index_at - 8,
        2, 2, index_size,
    )  # fmt: skip
    assert trailer[12] == zlib.crc32(
        data[-TRAILER_SIZE:-12], zlib.crc32(data[index_at : index_at + index_size])
    )
    assert trailer[13:] == (2, b"TLFT")
    assert len(data) == index_at + index_size + TRAILER_SIZE


def test_golden_dictionary_object() -> None:
    obj = encode_dictionary(b"\x01" * 16, b"dict")
    assert obj.hex() == (
        "544c44430000000101010101010101010101010101010101000000046469637"
        + "4"
        + f"{zlib.crc32(obj[:-4]):08x}"
    )
    assert decode_dictionary(obj) == (b"\x01" * 16, b"dict")


def realistic_chunks(n_chunks: int = 20, per_chunk: int = 50, first: int = 0):
    import json
    import random

    rng = random.Random(7)
    chunks, infos, offset = [], [], first
    for c in range(n_chunks):
        bodies = [
            json.dumps(
                {
                    "event": rng.choice(["click", "view", "purchase", "login"]),
                    "user_id": rng.randrange(10_000),
                    "session": f"s-{rng.randrange(1000):04d}",
                    "ts": 1_700_000_000_000 + c * 1000 + i,
                    "country": rng.choice(["DE", "FR", "US", "US", "US", "JP"]),
                }
            ).encode()
            for i in range(per_chunk)
        ]
        chunk = encode_chunk(0, offset, 1, 1_700_000_000_000 + c, [encode_records(bodies)])
        from tierlog.formats.chunk import decode_header

        h = decode_header(chunk)
        infos.append(
            FragmentChunkInfo(offset, h.timestamp, 1, len(chunk), h.num_records, h.data_crc, 0,
                      h.num_entries)
        )  # fmt: skip
        chunks.append(chunk)
        offset += h.num_records
    return chunks, infos


@pytest.mark.parametrize("with_dictionary", [False, True])
def test_zstd_round_trip_returns_original_chunks(with_dictionary: bool) -> None:
    chunks, infos = realistic_chunks()
    coding = FrameCoding(codec=CODEC_ZSTD, level=3)
    dictionary = None
    if with_dictionary:
        dictionary = train_dictionary(chunks[:10], size=8 << 10)
        coding = FrameCoding(CODEC_ZSTD, 3, b"\x07" * 16, dictionary)
    data = encode(chunks, infos, coding)
    assert len(data) < sum(len(c) for c in chunks) / 2
    index = validate_fragment(data, dictionary_for=lambda _id: dictionary or b"")
    assert isinstance(index, FragmentIndexV2)
    assert index.dictionary_id == coding.dictionary_id
    decoded = [bytes(c) for _, c in iter_chunks(data, index, lambda _id: dictionary or b"")]
    assert decoded == chunks
    # The index alone says where each frame is and how big.
    start, end = index_region(index.trailer)
    ranged = decode_index(data[start:end], decode_trailer(data[-TRAILER_SIZE:]))
    assert (ranged.records == index.records).all()
    sizes = stored_sizes(ranged)
    assert int(sizes.sum()) == index.trailer.index_start - 8
    assert index.trailer.data_size == sum(len(c) for c in chunks)  # the chunks' own size


def test_dictionary_is_required_and_must_match() -> None:
    chunks, infos = realistic_chunks(12)
    dictionary = train_dictionary(chunks, size=4 << 10)
    data = encode(chunks, infos, FrameCoding(CODEC_ZSTD, 3, b"\x07" * 16, dictionary))
    with pytest.raises(UnsupportedError):
        validate_fragment(data)
    other = train_dictionary(list(reversed(chunks)) + chunks[:3], size=2 << 10)
    if other != dictionary:
        with pytest.raises(FormatError):
            validate_fragment(data, dictionary_for=lambda _id: other)


def test_v1_fragments_still_decode() -> None:
    chunks, infos = build_chunks([(s[0], s[1], s[2], b"") for s in GOLDEN_SPECS])
    parts, _ = encode_fragment(PLACEMENT, chunks, infos)
    data = b"".join(bytes(p) for p in parts)
    index = validate_fragment(data)
    assert not isinstance(index.trailer, FragmentTrailerV2)
    assert [bytes(c) for _, c in iter_chunks(data, index)] == chunks
    assert list(stored_sizes(index)) == [len(c) for c in chunks]


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_ZSTD])
def test_every_flipped_byte_is_a_typed_error(codec: int) -> None:
    chunks, infos = build_chunks(GOLDEN_SPECS)
    data = encode(chunks, infos, FrameCoding(codec=codec))
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        with pytest.raises(FormatError):
            validate_fragment(bytes(damaged))


def test_truncated_and_extended_objects_are_refused() -> None:
    chunks, infos = build_chunks(GOLDEN_SPECS)
    data = encode(chunks, infos, FrameCoding())
    for cut in (1, 7, TRAILER_SIZE, len(data) - 8):
        with pytest.raises(FormatError):
            validate_fragment(data[:-cut])
        with pytest.raises(FormatError):
            validate_fragment(data[cut:])
    with pytest.raises(BadMagicError):
        decode_fragment(b"\x00" + data)
    with pytest.raises(InvalidSizeError):
        decode_fragment(data[:8] + b"\x00" + data[8:])


def test_swapped_frames_are_refused() -> None:
    chunks, infos = build_chunks([([b"aa"], 1, 1, b""), ([b"bb"], 2, 1, b"")])
    data = bytearray(encode(chunks, infos, FrameCoding(codec=CODEC_NONE)))
    a, b = 8, 8 + len(chunks[0])
    size = len(chunks[0])
    assert len(chunks[1]) == size
    data[a:b], data[b : b + size] = data[b : b + size], data[a:b]
    with pytest.raises(CrcMismatchError):
        validate_fragment(bytes(data))


def test_frame_decoder_rejects_wrong_sizes_and_bad_frames() -> None:
    chunks, infos = build_chunks(GOLDEN_SPECS)
    data = encode(chunks, infos, FrameCoding())
    index = decode_fragment(data)
    assert isinstance(index, FragmentIndexV2)
    decoder = FrameDecoder(index)
    p, s = int(index.records["position"][0]), int(index.records["stored_size"][0])
    assert decoder.decode(0, data[p : p + s]) == chunks[0]
    with pytest.raises(TruncatedError):
        decoder.decode(0, data[p : p + s - 1])
    with pytest.raises(FormatError):  # another frame's bytes
        decoder.decode(1, data[p : p + s])


def test_bad_coding_is_refused() -> None:
    with pytest.raises(UnsupportedError):
        FrameCoding(codec=9)
    with pytest.raises(InvalidSizeError):
        FrameCoding(dictionary_id=b"\x01" * 16)
    with pytest.raises(UnsupportedError):
        FrameCoding(CODEC_NONE, 3, b"\x01" * 16, b"d")


def test_dictionary_object_errors() -> None:
    obj = encode_dictionary(b"\x02" * 16, b"some dictionary bytes")
    with pytest.raises(TruncatedError):
        decode_dictionary(obj[:10])
    with pytest.raises(BadMagicError):
        decode_dictionary(b"XXXX" + obj[4:])
    with pytest.raises(InvalidSizeError):
        decode_dictionary(obj + b"\x00")
    for at in range(len(obj)):
        damaged = bytearray(obj)
        damaged[at] ^= 0x80
        with pytest.raises(FormatError):
            decode_dictionary(bytes(damaged))
    with pytest.raises(InvalidSizeError):
        encode_dictionary(bytes(16), b"x")
    with pytest.raises(FormatError):
        train_dictionary([b"x"] * 3)


chunk_specs = st.lists(
    st.tuples(
        st.lists(st.binary(max_size=40), min_size=1, max_size=4),
        st.integers(0, 10),
        st.integers(0, 2),
        st.binary(max_size=16),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(specs=chunk_specs, first=st.integers(0, 2**40), codec=st.sampled_from([0, 1]))
def test_round_trip_property(
    specs: list[tuple[list[bytes], int, int, bytes]], first: int, codec: int
) -> None:
    ts, epoch, absolute = 1_000, 1, []
    for records, dts, de, bloom in specs:
        ts, epoch = ts + dts, epoch + de
        absolute.append((records, ts, epoch, bloom))
    chunks, infos = build_chunks(absolute, first)
    data = encode(chunks, infos, FrameCoding(codec=codec))
    index = validate_fragment(data)
    assert [bytes(c) for _, c in iter_chunks(data, index)] == chunks
    assert isinstance(index, FragmentIndexV2)
    for i, (_, _, _, bloom) in enumerate(absolute):
        assert index.bloom(i) == bloom
        got, _ = index.chunk(i)
        assert got == infos[i]
    t = index.trailer
    assert (t.first_offset, t.next_offset) == (first, first + sum(len(s[0]) for s in specs))
    for offset in range(t.first_offset, t.next_offset):
        i = index.find_offset(offset)
        assert i is not None and infos[i].chunk_id <= offset
