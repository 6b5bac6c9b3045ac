"""Manifest node format: golden bytes, round trips, binary search and rejection of bad input."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.manifest import (
    ENTRY_FRAGMENT,
    ENTRY_SEGMENT,
    ENTRY_SIZE,
    HEADER_SIZE,
    KIND_BRANCH,
    KIND_ROOT,
    ManifestEntry,
    NodeHeader,
    decode_node,
    encode_node,
    entries_array,
    entry_at,
    entry_next_offset,
    find_offset,
    find_timestamp,
    node_size,
    summarize,
)

UID = bytes(range(1, 17))

GOLDEN_ENTRIES = [
    ManifestEntry(100, 1_000, 1_500, 4096, 8, fragment_count=2, height=1, uid=UID),
    ManifestEntry(140, 1_500, 1_700, 2048, 3),
]
GOLDEN_HEX = (
    "544c4d4e000100000000000200000000000000070000000000000064000000000000009600000000"
    "000003e800000000000006a40000000000001800000000000000000b000000000000000300000002"
    "0006000076315f735f39000000000000006400000000000003e800000000000005dc000000000000"
    "1000000000000000000800000000000000020102030405060708090a0b0c0d0e0f10010000000000"
    "0000000000000000008c00000000000005dc00000000000006a40000000000000800000000000000"
    "000300000000000000010000000000000000000000000000000000000000000000005f7a1226"
)


def test_golden_bytes() -> None:
    entries = entries_array(GOLDEN_ENTRIES)
    header = summarize(KIND_ROOT, 7, "v1_s_9", entries, 150)
    data = encode_node(header, entries)
    assert data.hex() == GOLDEN_HEX
    assert len(data) == node_size(2, "v1_s_9") == HEADER_SIZE + 6 + 2 * ENTRY_SIZE + 4
    # The documented layout, field by field.
    assert data[:4] == b"TLMN"
    fields = struct.unpack_from(">4sHBxIQQQqqQQQIHxx", data)
    assert fields == (b"TLMN", 1, KIND_ROOT, 2, 7, 100, 150, 1_000, 1_700, 6144, 11, 3, 2, 6)
    assert data[HEADER_SIZE : HEADER_SIZE + 6] == b"v1_s_9"
    first = struct.unpack_from(">QqqQQQ16sB7x", data, HEADER_SIZE + 6)
    assert first == (100, 1_000, 1_500, 4096, 8, 2, UID, 1)
    assert struct.unpack(">I", data[-4:])[0] == zlib.crc32(data[:-4])
    node = decode_node(data)
    assert node.header == header
    assert [entry_at(node.entries, i) for i in range(2)] == GOLDEN_ENTRIES


@st.composite
def nodes(draw: st.DrawFn) -> tuple[NodeHeader, np.ndarray]:
    kind = draw(st.sampled_from([KIND_ROOT, KIND_BRANCH]))
    n = draw(st.integers(0 if kind == KIND_ROOT else 1, 30))
    offset = draw(st.integers(0, 2**62))
    ts = draw(st.integers(-(2**40), 2**40))
    if kind == KIND_BRANCH:
        heights = [draw(st.integers(0, 4))] * n
    else:
        heights = sorted((draw(st.integers(0, 4)) for _ in range(n)), reverse=True)
    entries = []
    for h in heights:
        fragments = 1 if h == 0 else draw(st.integers(1, 5000))
        chunks = draw(st.integers(fragments, fragments * 100))
        span = draw(st.integers(chunks, chunks * 10))
        t0 = ts + draw(st.integers(0, 100))
        ts = t0 + draw(st.integers(0, 100))
        uid = bytes(16) if h == 0 else draw(st.binary(min_size=16, max_size=16).filter(any))
        size = draw(st.integers(chunks * 48, 2**50))
        entries.append(ManifestEntry(offset, t0, ts, size, chunks, fragments, h, uid))
        offset += span
    epoch = draw(st.integers(0, 2**64 - 1))
    stream = draw(st.text(max_size=40))
    arr = entries_array(entries)
    return summarize(kind, epoch, stream, arr, offset), arr


@given(node=nodes())
def test_round_trip(node: tuple[NodeHeader, np.ndarray]) -> None:
    header, entries = node
    data = encode_node(header, entries)
    assert len(data) == node_size(len(entries), header.stream_dir)
    decoded = decode_node(data)
    assert decoded.header == header
    assert np.array_equal(decoded.entries, entries)
    assert encode_node(decoded.header, decoded.entries) == data


@given(node=nodes(), data=st.data())
def test_binary_search_matches_a_linear_scan(
    node: tuple[NodeHeader, np.ndarray], data: st.DataObject
) -> None:
    header, entries = node
    if not len(entries):
        return
    offset = data.draw(st.integers(header.first_offset, header.next_offset - 1))
    i = find_offset(entries, offset)
    assert (
        int(entries["first_offset"][i])
        <= offset
        < entry_next_offset(entries, i, header.next_offset)
    )
    ts = data.draw(st.integers(header.min_timestamp - 1, header.max_timestamp + 1))
    j = find_timestamp(entries, ts)
    linear = next(
        (k for k in range(len(entries)) if entries["max_timestamp"][k] >= ts), len(entries)
    )
    assert j == linear
    assert find_offset(entries, header.first_offset - 1) == -1 if header.first_offset else True


@given(node=nodes(), data=st.data())
def test_any_flipped_bit_is_rejected(
    node: tuple[NodeHeader, np.ndarray], data: st.DataObject
) -> None:
    encoded = bytearray(encode_node(*node))
    pos = data.draw(st.integers(0, len(encoded) - 1))
    encoded[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(FormatError):
        decode_node(bytes(encoded))


@given(node=nodes(), data=st.data())
def test_truncation_is_rejected(node: tuple[NodeHeader, np.ndarray], data: st.DataObject) -> None:
    encoded = encode_node(*node)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(TruncatedError):
        decode_node(encoded[:cut])
    with pytest.raises(InvalidSizeError):
        decode_node(encoded + b"\x00")


def _recrc(body: bytes) -> bytes:
    return body + struct.pack(">I", zlib.crc32(body))


def test_bad_magic_version_kind() -> None:
    data = encode_node(*_golden())
    with pytest.raises(BadMagicError):
        decode_node(_recrc(b"XXXX" + data[4:-4]))
    with pytest.raises(UnsupportedError):
        decode_node(_recrc(data[:4] + b"\x00\x02" + data[6:-4]))
    with pytest.raises(UnsupportedError):
        decode_node(_recrc(data[:6] + b"\x07" + data[7:-4]))
    with pytest.raises(CrcMismatchError):
        decode_node(data[:-1] + bytes([data[-1] ^ 1]))


def _golden() -> tuple[NodeHeader, np.ndarray]:
    entries = entries_array(GOLDEN_ENTRIES)
    return summarize(KIND_ROOT, 7, "v1_s_9", entries, 150), entries


def _reencoded(header: NodeHeader, entries: np.ndarray, **changes: int) -> bytes:
    """Bytes with a valid CRC whose header was changed after summarizing."""
    fields = {f: getattr(header, f) for f in NodeHeader.__dataclass_fields__}
    fields.update(changes)
    return encode_node(NodeHeader(**fields), entries)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"total_bytes": 1},
        {"total_chunks": 12},
        {"total_fragments": 4},
        {"first_offset": 99},
        {"next_offset": 140},  # last entry would be empty
        {"min_timestamp": 0},
        {"max_timestamp": 2_000},
        {"height": 3},
        {"kind": KIND_BRANCH},  # a branch holding two heights
    ],
)
def test_header_contradicting_entries_is_rejected(change: dict[str, int]) -> None:
    with pytest.raises(InvalidSizeError):
        decode_node(_reencoded(*_golden(), **change))


def test_malformed_entries_are_rejected() -> None:
    def node_of(
        entries: list[ManifestEntry], kind: int = KIND_ROOT, next_offset: int = 500
    ) -> bytes:
        arr = entries_array(entries)
        return encode_node(summarize(kind, 1, "s", arr, next_offset), arr)

    frag = ManifestEntry(100, 1, 2, 100, 2)
    with pytest.raises(InvalidSizeError):  # not ascending
        decode_node(node_of([ManifestEntry(200, 1, 2, 100, 2), frag]))
    with pytest.raises(InvalidSizeError):  # heights increase in a root
        decode_node(node_of([frag, ManifestEntry(200, 1, 2, 100, 2, 2, 1, UID)]))
    with pytest.raises(InvalidSizeError):  # fragment with a uid
        decode_node(node_of([ManifestEntry(100, 1, 2, 100, 2, uid=UID)]))
    with pytest.raises(InvalidSizeError):  # branch without one
        decode_node(node_of([ManifestEntry(100, 1, 2, 100, 2, 2, 1)]))
    with pytest.raises(InvalidSizeError):  # more chunks than offsets
        decode_node(node_of([frag], next_offset=101))
    with pytest.raises(InvalidSizeError):  # min timestamp above max
        decode_node(node_of([ManifestEntry(100, 3, 2, 100, 2)]))
    with pytest.raises(InvalidSizeError):  # empty branch
        decode_node(node_of([], KIND_BRANCH))
    with pytest.raises(InvalidSizeError):
        encode_node(summarize(KIND_ROOT, 1, "s", entries_array([frag]), 500), entries_array([]))
    with pytest.raises(InvalidSizeError):
        entries_array([ManifestEntry(1, 1, 1, 1, 1, uid=b"short")])


def test_empty_root() -> None:
    empty = entries_array([])
    header = summarize(KIND_ROOT, 3, "s", empty, 42)
    node = decode_node(encode_node(header, empty))
    assert (node.header.first_offset, node.header.next_offset, node.header.height) == (42, 42, 0)
    assert len(node.entries) == 0
    with pytest.raises(InvalidSizeError):
        decode_node(_reencoded(header, empty, first_offset=0))


def test_large_node_decodes_whole_array() -> None:
    n = 200_000
    arr = np.zeros(n, dtype=entries_array([]).dtype)
    arr["first_offset"] = np.arange(n, dtype=np.uint64) * 1000
    arr["min_timestamp"] = np.arange(n)
    arr["max_timestamp"] = np.arange(n) + 1
    arr["data_size"] = 64 << 20
    arr["chunk_count"] = 100
    arr["fragment_count"] = 1
    data = encode_node(summarize(KIND_ROOT, 1, "s", arr, n * 1000), arr)
    node = decode_node(data)
    assert node.header.total_bytes == n * (64 << 20)
    assert find_offset(node.entries, 123_456_789) == 123_456
    assert find_timestamp(node.entries, 5_000) == 4_999


def test_segment_entry_golden_bytes() -> None:
    """An offloaded segment is a height-0 entry whose kind byte (entry byte 65, once the
    first reserved byte) is 1 and whose uid is the attempt's UUID; a manifest of fragments
    only is byte for byte what it was before entry kinds existed (GOLDEN_HEX)."""
    attempt = bytes(range(0xA0, 0xB0))
    segment = ManifestEntry(140, 1_500, 1_700, 2048, 3, uid=attempt, entry_kind=ENTRY_SEGMENT)
    entries = entries_array([GOLDEN_ENTRIES[0], segment])
    data = encode_node(summarize(KIND_ROOT, 7, "v1_s_9", entries, 150), entries)
    old = bytes.fromhex(GOLDEN_HEX)
    second = HEADER_SIZE + 6 + ENTRY_SIZE
    # hand-computed: only the uid (48..64) and the kind byte (65) of the second entry differ
    expected = bytearray(old)
    expected[second + 48 : second + 64] = attempt
    expected[second + 65] = 1
    expected[-4:] = struct.pack(">I", zlib.crc32(bytes(expected[:-4])))
    assert data == bytes(expected)
    assert struct.unpack_from(">QqqQQQ16sBB6x", data, second) == (
        140, 1_500, 1_700, 2048, 3, 1, attempt, 0, ENTRY_SEGMENT,
    )  # fmt: skip
    node = decode_node(data)
    assert entry_at(node.entries, 1) == segment
    assert entry_at(decode_node(old).entries, 1).entry_kind == ENTRY_FRAGMENT


def test_bad_entry_kinds_are_rejected() -> None:
    def node_of(entries: list[ManifestEntry]) -> bytes:
        arr = entries_array(entries)
        return encode_node(summarize(KIND_ROOT, 1, "s", arr, 500), arr)

    with pytest.raises(InvalidSizeError):  # a segment needs its attempt uuid
        decode_node(node_of([ManifestEntry(100, 1, 2, 100, 2, entry_kind=ENTRY_SEGMENT)]))
    with pytest.raises(UnsupportedError):  # an unknown kind
        decode_node(node_of([ManifestEntry(100, 1, 2, 100, 2, uid=UID, entry_kind=7)]))
    with pytest.raises(UnsupportedError):  # a branch entry is never a segment
        decode_node(node_of([ManifestEntry(100, 1, 2, 100, 2, 2, 1, UID, ENTRY_SEGMENT)]))
