"""The v2 scanner over random stores: holes of every kind, torn tails, zero-filled regions,
and holes skipped in O(1) (one header read whatever their size)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats import msgstore as fmt
from tierlog.formats.errors import (
    MsgStoreRecordSizeError,
    UnknownRecordTypeError,
    ZeroFilledRegionError,
)
from tierlog.msgstore import files

ITEM = st.one_of(
    st.tuples(st.just("msg"), st.binary(max_size=300), st.booleans()),
    st.tuples(st.just("hole"), st.integers(1, 400), st.binary(max_size=1)),
)


def _build(items: list[tuple[str, object, object]]) -> tuple[bytes, list[fmt.Record]]:
    """A segment's bytes and the records a scan must find, from a list of items."""
    out = bytearray(fmt.encode_header())
    expected: list[fmt.Record] = []
    for n, (kind, a, b) in enumerate(items):
        pos = len(out)
        if kind == "msg":
            msg_id = n.to_bytes(16, "big")
            rec = fmt.encode_message(msg_id, a, checksum=bool(b))  # type: ignore[arg-type]
            rtype = fmt.MESSAGE_WITH_CHECKSUM if b else fmt.MESSAGE
            expected.append(fmt.Record(pos, rtype, len(rec), msg_id))
            out += rec
        else:
            gap = int(a)  # type: ignore[call-overload]
            # inner bytes are garbage that looks like records: never interpreted
            inner = (fmt.encode_message(bytes(16), b"x" * gap) * 2)[: max(0, gap - 5)]
            out += fmt.encode_hole(gap, inner if gap >= 5 else None)
            if gap < 5:
                expected.extend(fmt.Record(pos + i, fmt.SMALL_HOLE, 1, None) for i in range(gap))
            else:
                expected.append(fmt.Record(pos, fmt.HOLE, gap, None))
    return bytes(out), expected


def _write(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "0.sqs"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


@given(st.lists(ITEM, max_size=40), st.integers(16, 4096))
def test_random_stores_scan_exactly(
    tmp_path_factory: pytest.TempPathFactory, items: list, block: int
) -> None:
    data, expected = _build(items)
    # in-memory, in one block
    records: list[fmt.Record] = []
    stop = fmt.scan_block(data, 0, fmt.HEADER_SIZE, len(data), records)
    assert records == expected and stop.position == len(data) and not stop.torn
    # from a file with small read blocks (records and holes straddle block ends)
    tmp = tmp_path_factory.mktemp("scan")
    fd = _write(tmp, data)
    old = files.SCAN_BLOCK
    files.SCAN_BLOCK = block
    try:
        result = files.scan_v2_fd(fd)
    finally:
        files.SCAN_BLOCK = old
        os.close(fd)
    assert result.records == expected and result.end == len(data) and not result.torn


@given(st.lists(ITEM, min_size=1, max_size=30), st.data())
def test_torn_tail_is_dropped(items: list, data: st.DataObject) -> None:
    full, expected = _build(items)
    cut = data.draw(st.integers(fmt.HEADER_SIZE, len(full)))
    records: list[fmt.Record] = []
    stop = fmt.scan_block(full[:cut], 0, fmt.HEADER_SIZE, cut, records)
    whole = [r for r in expected if r.position + r.size <= cut]
    assert records == whole
    assert stop.position == (whole[-1].position + whole[-1].size if whole else fmt.HEADER_SIZE)
    assert stop.torn == (stop.position < cut)


@given(st.lists(ITEM, min_size=1, max_size=30), st.data())
def test_zero_filled_region_fails_loudly(items: list, data: st.DataObject) -> None:
    full, expected = _build(items)
    boundary = data.draw(st.sampled_from([r.position for r in expected] + [len(full)]))
    length = data.draw(st.integers(1, 200))
    zeroed = full[:boundary] + bytes(length)
    with pytest.raises(ZeroFilledRegionError, match=f"position {boundary}"):
        fmt.scan_block(zeroed, 0, fmt.HEADER_SIZE, len(zeroed), [])


@pytest.mark.parametrize("type_byte", [0, *range(5, 256, 25)])
def test_unknown_or_reserved_types_fail(type_byte: int) -> None:
    data = fmt.encode_header() + bytes([type_byte]) + b"\x00\x00\x00\x30" + bytes(43)
    error = ZeroFilledRegionError if type_byte == 0 else UnknownRecordTypeError
    with pytest.raises(error):
        fmt.scan_block(data, 0, fmt.HEADER_SIZE, len(data), [])


@pytest.mark.parametrize(("rtype", "size"), [(2, 4), (3, 20), (4, 24), (2, 0)])
def test_size_below_minimum_fails(rtype: int, size: int) -> None:
    data = fmt.encode_header() + bytes([rtype]) + size.to_bytes(4, "big") + bytes(40)
    with pytest.raises(MsgStoreRecordSizeError):
        fmt.scan_block(data, 0, fmt.HEADER_SIZE, len(data), [])


@pytest.mark.parametrize("hole_size", [10**6, 10**9, 2**32 - 1])
def test_hole_skipped_in_constant_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hole_size: int
) -> None:
    """A sparse file: a message, a hole of up to 4 GiB, a message. The scan makes the same
    few reads whatever the hole's size (the first block read is capped, the hole's bytes
    past it are never read)."""
    first = fmt.encode_message(b"a" * 16, b"first")
    last = fmt.encode_message(b"b" * 16, b"last")
    path = tmp_path / "0.sqs"
    with open(path, "wb") as out:
        out.write(fmt.encode_header() + first + fmt.hole_marker(hole_size))
        out.seek(fmt.HEADER_SIZE + len(first) + hole_size)
        out.write(last)
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        reads.append(len(data))
        return data

    monkeypatch.setattr(files.os, "pread", counting_pread)
    fd = os.open(path, os.O_RDONLY)
    try:
        result = files.scan_v2_fd(fd)
    finally:
        os.close(fd)
    assert [r.msg_id for r in result.records if r.msg_id] == [b"a" * 16, b"b" * 16]
    assert [r.size for r in result.records if r.type == fmt.HOLE] == [hole_size]
    assert sum(reads) <= fmt.HEADER_SIZE + files.SCAN_BLOCK + len(last)
    assert len(reads) <= 3


def test_v1_salvage_scan_skips_garbage_and_zeros() -> None:
    a = fmt.encode_v1_record(b"a" * 16, b"one")
    b = fmt.encode_v1_record(b"b" * 16, b"two" * 100)
    dup = a
    data = a + bytes(5000) + b"\xff\x13garbage" + b + dup + b"\x00\x00\x00"
    seen: set[bytes] = set()
    records: list[fmt.Record] = []
    stop = fmt.scan_v1_block(data, 0, 0, len(data), seen, records)
    assert [(r.position, r.msg_id) for r in records] == [
        (0, b"a" * 16),
        (len(a) + 5000 + 9, b"b" * 16),
    ]
    assert stop.need == 0
