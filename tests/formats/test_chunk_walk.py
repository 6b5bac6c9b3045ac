"""The one entry walk (``iter_records``) over a whole chunk buffer: bounds, typed errors,
simple entries mixed with sub-batches."""

from __future__ import annotations

import pytest

from tierlog.formats.chunk import (
    HEADER_SIZE,
    Entry,
    SubBatch,
    count_entries,
    decode_header,
    encode_chunk,
    encode_records,
    iter_records,
)
from tierlog.formats.errors import FormatError, InvalidSizeError, TruncatedError

_PAYLOAD = encode_records([b"c1", b"c22", b"c333"])
MIXED: list[Entry] = [b"a", b"bb", SubBatch(0, 3, len(_PAYLOAD), _PAYLOAD), b"dddd", b""]
MIXED_RECORDS = [b"a", b"bb", b"c1", b"c22", b"c333", b"dddd", b""]


class _Typed(Exception):
    pass


def _chunk() -> tuple[memoryview, int, int]:
    raw = memoryview(encode_chunk(0, 100, 1, 0, MIXED, trailer=b"TRAILER"))
    header = decode_header(raw)
    return raw, header.data_start, header.data_start + header.data_length


def test_walks_the_whole_chunk_in_place_within_its_data_bounds() -> None:
    raw, start, end = _chunk()
    got = list(iter_records(100, raw, len(MIXED), start, end))
    assert [o for o, _ in got] == list(range(100, 100 + len(MIXED_RECORDS)))
    assert [bytes(r) for _, r in got] == MIXED_RECORDS
    assert got[0][1].obj is raw.obj  # simple records are views of the caller's buffer


def test_resumes_mid_chunk_with_the_entries_left() -> None:
    raw, start, end = _chunk()
    third = start + 5 + 6  # after b"a" and b"bb"
    assert count_entries(raw, start, third) == 2
    got = list(iter_records(102, raw, len(MIXED) - 2, third, end))
    assert [bytes(r) for _, r in got] == MIXED_RECORDS[2:]


def test_damage_raises_format_errors_or_the_callers_type() -> None:
    raw, start, end = _chunk()
    with pytest.raises(InvalidSizeError):
        list(iter_records(100, raw, len(MIXED) + 1, start, end))  # an entry too few
    with pytest.raises(TruncatedError):
        list(iter_records(100, raw, len(MIXED), start, end - 1))  # last entry cut
    with pytest.raises(_Typed) as caught:
        list(iter_records(100, raw, len(MIXED), start, end - 1, lambda exc: _Typed(str(exc))))
    assert isinstance(caught.value.__cause__, FormatError)
    with pytest.raises(TruncatedError):  # a length word past the end of the buffer
        list(iter_records(0, b"\x00\x00", 1))


def test_header_size_is_where_the_data_starts_without_a_bloom_filter() -> None:
    raw, start, _ = _chunk()
    assert start == HEADER_SIZE and len(raw) > start
