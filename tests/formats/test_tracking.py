"""Tracking entries (delta and snapshot forms)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import FormatError, InvalidSizeError, TruncatedError
from tierlog.formats.tracking import (
    TrackingSnapshot,
    decode_delta,
    decode_snapshot,
    encode_delta,
    encode_snapshot,
)


def test_golden_delta() -> None:
    raw = encode_delta(sequences={b"p": 5}, offsets={b"c1": 9}, timestamps={b"t": -1})
    assert raw == bytes.fromhex(
        "0001700000000000000005010263310000000000000009020174ffffffffffffffff"
    )
    assert decode_delta(raw) == [(0, b"p", 5), (1, b"c1", 9), (2, b"t", -1)]


def test_golden_snapshot() -> None:
    snap = TrackingSnapshot({b"p": (100, 5)}, {b"c": 9}, {})
    raw = encode_snapshot(snap)
    assert raw == bytes.fromhex("000170000000000000006400000000000000050101630000000000000009")
    assert decode_snapshot(raw) == snap


ids = st.binary(min_size=0, max_size=255)
u64 = st.integers(0, 2**64 - 1)


@given(
    st.dictionaries(ids, st.tuples(u64, u64), max_size=10),
    st.dictionaries(ids, u64, max_size=10),
    st.dictionaries(ids, st.integers(-(2**63), 2**63 - 1), max_size=10),
)
def test_snapshot_round_trip(
    seqs: dict[bytes, tuple[int, int]], offs: dict[bytes, int], tss: dict[bytes, int]
) -> None:
    snap = TrackingSnapshot(seqs, offs, tss)
    assert decode_snapshot(encode_snapshot(snap)) == snap


@given(st.dictionaries(ids, u64, max_size=10), st.dictionaries(ids, u64, max_size=10))
def test_delta_round_trip(seqs: dict[bytes, int], offs: dict[bytes, int]) -> None:
    decoded = decode_delta(encode_delta(sequences=seqs, offsets=offs))
    assert {i: v for k, i, v in decoded if k == 0} == seqs
    assert {i: v for k, i, v in decoded if k == 1} == offs


def test_tracking_errors() -> None:
    with pytest.raises(InvalidSizeError):
        encode_delta(offsets={b"x" * 256: 1})
    raw = encode_delta(offsets={b"abc": 1})
    with pytest.raises(TruncatedError):
        decode_delta(raw[:-1])
    with pytest.raises(TruncatedError):
        decode_delta(raw[:3])
    with pytest.raises(FormatError):
        decode_delta(b"\x09\x00" + b"\x00" * 8)
    with pytest.raises(TruncatedError):
        decode_snapshot(encode_snapshot(TrackingSnapshot({b"p": (1, 2)}))[:-3])
