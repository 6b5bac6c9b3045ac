"""The replication wire format: golden bytes, round trips, and typed rejection of
malformed frames."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats import replication as rp
from tierlog.formats.errors import (
    BadMagicError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

GOLDEN = [
    (
        rp.Written("s", 7, 5),
        "00000015070000010000000000000007730000000000000005",
    ),
    (
        rp.Hello("n1"),
        "00000012010000000000000000000000000200026e31",
    ),
    (
        rp.Tiered("s", 3, 40, 1000),
        "0000001d11000001000000000000000373000000000000002800000000000003e8",
    ),
    (
        rp.Chunks("s", 2, 10, 12, 9, 1, b"\x50\x00"),
        "0000002f"
        "06"
        "00"
        "0001"
        "0000000000000002"
        "73"
        "000000000000000a"
        "000000000000000c"
        "0000000000000009"
        "00000001"
        "00000002"
        "5000",
    ),
    (
        rp.Challenge(bytes(range(32))),
        "0000002c0a0000000000000000000000" + bytes(range(32)).hex(),
    ),
    (
        rp.Adopted("s", 3, True, 3, 2, -1),
        "00000026030000010000000000000003730100000000000000030000000000000002ffffffffffffffff",
    ),
    (
        rp.History("s", 4, 6, ((1, 0, 3), (3, 4, 9))),
        "00000049"
        "05"
        "00"
        "0001"
        "0000000000000004"
        "73"
        "0000000000000006"
        "00000002"
        "0000000000000001"
        "0000000000000000"
        "0000000000000003"
        "0000000000000003"
        "0000000000000004"
        "0000000000000009",
    ),
]


@pytest.mark.parametrize(("frame", "hexed"), GOLDEN)
def test_golden_bytes(frame: rp.Frame, hexed: str) -> None:
    assert rp.encode(frame).hex() == hexed
    assert rp.decode(bytes.fromhex(hexed)) == frame
    assert rp.frame_size(bytes.fromhex(hexed)) == len(hexed) // 2


def test_chunks_header_lets_data_follow_separately() -> None:
    data = b"\x50" + bytes(60)
    header = rp.encode_chunks_header("stream-a", 5, 100, 104, 99, 2, len(data))
    whole = rp.encode(rp.Chunks("stream-a", 5, 100, 104, 99, 2, data))
    assert header + data == whole
    assert rp.frame_size(header) == len(whole)


streams = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 1024)
u64 = st.integers(0, (1 << 64) - 1)
chunk_ids = st.integers(-1, (1 << 63) - 1)


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[int, int, int], ...]:
    bounds = sorted(draw(st.sets(st.integers(0, 1 << 40), max_size=8)))
    ranges = []
    for first, last in zip(bounds[::2], bounds[1::2], strict=False):
        ranges.append((draw(u64), first, last))
    return tuple(ranges)


@st.composite
def chunk_frames(draw: st.DrawFn) -> rp.Chunks:
    first = draw(st.integers(0, 1 << 50))
    data = draw(st.binary(max_size=300))
    count = draw(st.integers(1, 50)) if data else 0
    return rp.Chunks(
        draw(streams),
        draw(u64),
        first,
        first + draw(st.integers(0, 1000)),
        draw(chunk_ids),
        count,
        data,
        bool(count) and draw(st.booleans()),
    )


frames = st.one_of(
    st.builds(rp.Hello, st.text(max_size=30)),
    st.builds(rp.Challenge, st.binary(min_size=32, max_size=32)),
    st.builds(rp.Proof, st.binary(min_size=32, max_size=32)),
    st.builds(rp.Adopt, streams, u64),
    st.builds(rp.Adopted, streams, u64, st.booleans(), u64, u64, chunk_ids),
    st.builds(rp.Fetch, streams, u64, u64, u64, chunk_ids, st.integers(0, rp.MAX_FRAME_BYTES)),
    st.builds(rp.History, streams, u64, chunk_ids, histories()),
    chunk_frames(),
    st.builds(rp.Written, streams, u64, chunk_ids),
    st.builds(rp.Commit, streams, u64, chunk_ids),
    st.builds(rp.Refused, streams, u64, st.sampled_from(rp.RefusalCode), u64, st.text(max_size=50)),
    st.builds(rp.TailQuery, streams, u64, st.integers(0, 0xFFFFFFFF), st.text(max_size=50)),
    st.builds(
        rp.Tail,
        streams,
        u64,
        st.integers(0, 0xFFFFFFFF),
        st.booleans(),
        chunk_ids,
        u64,
        chunk_ids,
        chunk_ids,
    ),
    st.builds(rp.OffsetStore, streams, u64, st.integers(0, 0xFFFFFFFF), st.text(max_size=50), u64),
    st.builds(rp.OffsetQuery, streams, u64, st.integers(0, 0xFFFFFFFF), st.text(max_size=50)),
    st.builds(rp.Offset, streams, u64, st.integers(0, 0xFFFFFFFF), st.booleans(), chunk_ids),
    st.builds(lambda s, e, a, b: rp.Tiered(s, e, min(a, b), max(a, b)), streams, u64, u64, u64),
)


@given(frames)
def test_round_trip(frame: rp.Frame) -> None:
    data = rp.encode(frame)
    assert rp.frame_size(data) == len(data)
    assert rp.decode(data) == frame


@given(frames, st.data())
def test_every_truncation_is_a_typed_error(frame: rp.Frame, data: st.DataObject) -> None:
    raw = rp.encode(frame)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(FormatError):
        rp.decode(raw[:cut])


@given(frames, st.binary(min_size=1, max_size=8))
def test_trailing_bytes_rejected(frame: rp.Frame, extra: bytes) -> None:
    with pytest.raises(InvalidSizeError):
        rp.decode(rp.encode(frame) + extra)


@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_an_untyped_error(raw: bytes) -> None:
    with contextlib.suppress(FormatError):
        rp.decode(raw)


def patch(raw: bytes, offset: int, value: bytes) -> bytes:
    return raw[:offset] + value + raw[offset + len(value) :]


def test_malformed_frames_rejected() -> None:
    written = rp.encode(rp.Written("s", 7, 5))
    with pytest.raises(UnsupportedError):
        rp.decode(patch(written, 4, b"\x63"))  # unknown kind
    with pytest.raises(UnsupportedError):
        rp.decode(patch(written, 5, b"\x01"))  # reserved flags
    with pytest.raises(FormatError):
        rp.decode(patch(written, 16, b"\xff"))  # stream id not UTF-8
    with pytest.raises(InvalidSizeError):
        rp.decode(patch(written, 17, b"\xff" * 7 + b"\xfe"))  # chunk id below -1
    with pytest.raises(InvalidSizeError):
        rp.frame_size(b"\x00\x00\x00\x02")  # shorter than a header
    with pytest.raises(InvalidSizeError):
        rp.frame_size((rp.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    assert rp.frame_size(b"\x00\x00") is None
    hello = rp.encode(rp.Hello("n1"))
    with pytest.raises(BadMagicError):
        rp.decode(patch(hello, 16, b"\x00\x01"))  # protocol version 1: an older node
    with pytest.raises(BadMagicError):
        rp.decode(patch(hello, 16, b"\x00\x03"))
    with pytest.raises(FormatError):
        rp.decode(rp._frame(rp.FrameKind.WRITTEN, "", 1, bytes(8)))  # no stream id
    history = rp.encode(rp.History("s", 4, 6, ((1, 0, 3), (3, 4, 9))))
    with pytest.raises(FormatError):
        rp.decode(patch(history, 61, (2).to_bytes(8, "big")))  # ranges overlap
    with pytest.raises(TruncatedError):
        rp.decode(patch(history, 25, (1000).to_bytes(4, "big")))  # range count too big
    chunks = rp.encode(rp.Chunks("s", 2, 10, 12, 9, 1, b"\x50\x00"))
    with pytest.raises(FormatError):
        rp.decode(patch(chunks, 41, (0).to_bytes(4, "big")))  # data without chunks
    tiered = rp.encode(rp.Tiered("s", 3, 40, 1000))
    with pytest.raises(FormatError):
        rp.decode(patch(tiered, 17, (2000).to_bytes(8, "big")))  # first past tiered
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.Tiered("s", 3, 41, 40))
    refused = rp.encode(rp.Refused("s", 1, rp.RefusalCode.STALE_EPOCH, 4, "old"))
    with pytest.raises(UnsupportedError):
        rp.decode(patch(refused, 17, b"\x00\x63"))  # unknown refusal code


def test_segment_start_flag_only_on_chunks_with_data() -> None:
    chunks = rp.Chunks("s", 2, 10, 12, 9, 1, b"\x50\x00", segment_start=True)
    raw = rp.encode(chunks)
    assert raw[5] == rp.SEGMENT_START and rp.decode(raw) == chunks
    assert rp.encode_chunks_header("s", 2, 10, 12, 9, 1, 2, True) + b"\x50\x00" == raw
    with pytest.raises(UnsupportedError):
        rp.decode(patch(rp.encode(rp.Written("s", 7, 5)), 5, b"\x01"))
    empty = rp.encode(rp.Chunks("s", 2, 10, 10, 9, 0, b""))
    with pytest.raises(FormatError):
        rp.decode(patch(empty, 5, b"\x01"))


def test_authentication_frames_are_connection_level() -> None:
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.Proof(b"short"))
    with pytest.raises(FormatError):
        rp.decode(rp._frame(rp.FrameKind.PROOF, "s", 0, bytes(32)))  # has a stream
    with pytest.raises(TruncatedError):
        rp.decode(rp._frame(rp.FrameKind.CHALLENGE, "", 0, bytes(31)))


def test_encoder_rejects_bad_values() -> None:
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.Written("s", -1, 5))
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.Written("s", 1, -2))
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.Adopt("x" * 2000, 1))
    with pytest.raises(InvalidSizeError):
        rp.encode_chunks_header("s", 1, 10, 9, 0, 1, 10)  # inverted range
    with pytest.raises(InvalidSizeError):
        rp.encode_chunks_header("s", 1, 10, 12, 0, 0, 10)  # data without chunks
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.History("s", 1, 0, ((1, 5, 3),)))
    with pytest.raises(InvalidSizeError):
        rp.encode_chunks_header("s", 1, 0, 1, 0, 1, rp.MAX_FRAME_BYTES)


def test_tail_frames_golden_and_checked() -> None:
    query = rp.TailQuery("s", 0, 7, "p")
    assert rp.encode(query).hex() == "000000140c00000100000000000000007300000007" + "00017" + "0"
    tail = rp.Tail("s", 3, 7, True, 9, 12, 8, 41)
    encoded = rp.encode(tail)
    assert rp.decode(encoded) == tail
    bad_flag = bytearray(encoded)
    bad_flag[21] = 2  # the leads byte: after the header, stream id and request id
    with pytest.raises(FormatError):
        rp.decode(bytes(bad_flag))
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.TailQuery("s", 0, 1 << 32, ""))
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.Tail("s", 0, 1, True, -2))


def test_offset_frames_golden_and_checked() -> None:
    header = "0001000000000000000073"  # stream id length 1, epoch 0, "s"
    store = rp.OffsetStore("s", 0, 7, "r", 42)
    offset = "2a".zfill(16)
    assert rp.encode(store).hex() == "0000001c0e00" + header + "00000007" + offset + "000172"
    query = rp.OffsetQuery("s", 0, 7, "r")
    assert rp.encode(query).hex() == "000000140f00" + header + "00000007000172"
    answer = rp.Offset("s", 3, 7, True, 42)
    encoded = rp.encode(answer)
    leader_header = "0001000000000000000373"  # epoch 3
    assert encoded.hex() == "0000001a1000" + leader_header + "00000007" + "01" + "2a".zfill(16)
    assert rp.decode(encoded) == answer
    assert rp.decode(rp.encode(rp.Offset("s", 3, 7, False))).offset == -1  # none stored
    bad_flag = bytearray(encoded)
    bad_flag[21] = 2  # the leads byte
    with pytest.raises(FormatError):
        rp.decode(bytes(bad_flag))
    below = bytearray(encoded)
    below[22:30] = (-2).to_bytes(8, "big", signed=True)
    with pytest.raises(InvalidSizeError):
        rp.decode(bytes(below))
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.OffsetStore("s", 0, 1, "r", -1))  # a consumer offset is a u64
    with pytest.raises(InvalidSizeError):
        rp.encode(rp.OffsetQuery("s", 0, 1 << 32, "r"))
