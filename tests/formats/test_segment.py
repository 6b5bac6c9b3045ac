"""Segment/index file headers and 29-byte index records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import BadMagicError, TruncatedError
from tierlog.formats.segment import (
    INDEX_FILE_HEADER,
    INDEX_RECORD_SIZE,
    SEGMENT_HEADER,
    IndexRecord,
    check_index_header,
    check_segment_header,
    decode_index_record,
    encode_index_record,
    index_file_name,
    iter_index_records,
    segment_file_name,
)


def test_golden_file_headers_and_names() -> None:
    assert SEGMENT_HEADER == b"OSIL\x00\x00\x00\x01"
    assert INDEX_FILE_HEADER == b"OSII\x00\x00\x00\x01"
    assert segment_file_name(26061613) == "00000000000026061613.segment"
    assert index_file_name(0) == "00000000000000000000.index"


def test_golden_index_record() -> None:
    raw = encode_index_record(7, 1000, 2, 8, 1)
    assert raw == bytes.fromhex("000000000000000700000000000003e800000000000000020000000801")
    assert len(raw) == INDEX_RECORD_SIZE
    assert decode_index_record(raw) == IndexRecord(7, 1000, 2, 8, 1)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**64 - 1),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(0, 2**64 - 1),
            st.integers(1, 2**32 - 1),
            st.integers(0, 255),
        ),
        max_size=20,
    )
)
def test_index_round_trip(records: list[tuple[int, int, int, int, int]]) -> None:
    raw = INDEX_FILE_HEADER + b"".join(encode_index_record(*r) for r in records)
    assert [tuple(r) for r in iter_index_records(raw)] == records


def test_index_tolerates_partial_and_zero_tail() -> None:
    one = encode_index_record(0, 1, 1, 8, 0)
    raw = INDEX_FILE_HEADER + one + bytes(INDEX_RECORD_SIZE) + one
    assert len(list(iter_index_records(raw))) == 1
    assert len(list(iter_index_records(INDEX_FILE_HEADER + one + one[:10]))) == 1


def test_header_errors() -> None:
    with pytest.raises(TruncatedError):
        check_segment_header(b"OSIL")
    with pytest.raises(BadMagicError):
        check_segment_header(INDEX_FILE_HEADER)
    with pytest.raises(BadMagicError):
        check_index_header(b"OSII\x00\x00\x00\x02")
    with pytest.raises(BadMagicError):
        list(iter_index_records(SEGMENT_HEADER))
    with pytest.raises(TruncatedError):
        decode_index_record(b"\x00" * 28)
