"""The compacted key index: golden bytes, lookups find exactly the records with a key in at
most two ranged reads per window, and every damaged byte read is a typed error."""

from __future__ import annotations

import hashlib
import random
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.formats.errors import FormatError
from tierlog.formats.key_index import (
    HEADER_SIZE,
    ITEM_SIZE,
    SLOT_SIZE,
    build_items,
    decode_header,
    encode_key_index,
    key_hash,
    lookup,
)


def index_of(keys: list[bytes], slots: int | None = None) -> bytes:
    n = len(keys)
    offsets = list(range(n))
    stamps = [1000 + i for i in range(n)]
    positions = [8 + 100 * i for i in range(n)]
    items = build_items("s", keys, offsets, stamps, [0] * n, positions, [100] * n)
    return encode_key_index(items, window_start=1_700_000_000_000, slot_count=slots)


class CountingFile:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.gets = 0

    def get(self, start: int, end: int) -> bytes:
        self.gets += 1
        return self.data[start:end]


def test_golden_bytes() -> None:
    data = index_of([b"a", b"b", b"a"], slots=2)
    h = {k: key_hash("s", k) for k in (b"a", b"b")}
    assert h[b"a"] == int.from_bytes(hashlib.blake2b(b"s#a", digest_size=8).digest(), "big")
    header = struct.unpack_from(">4sIIIqI4x", data, 0)
    assert header[:5] == (b"TLKX", 1, 2, 3, 1_700_000_000_000)
    assert header[5] == zlib.crc32(data[:24])
    # Items grouped by slot, in offset order within a slot.
    items = [struct.unpack_from(">QQqQQI4x", data, HEADER_SIZE + 2 * SLOT_SIZE + i * ITEM_SIZE)
             for i in range(3)]  # fmt: skip
    slot_of = {k: v % 2 for k, v in h.items()}
    expected = sorted(
        [(slot_of[b"a"], 0, b"a"), (slot_of[b"b"], 1, b"b"), (slot_of[b"a"], 2, b"a")]
    )
    assert [(it[0], it[1]) for it in items] == [(h[k], o) for _, o, k in expected]
    assert items[0][2:] == (1000 + items[0][1], 0, 8 + 100 * items[0][1], 100)
    for slot in range(2):
        first, count, crc, own = struct.unpack_from(">IIII", data, HEADER_SIZE + slot * SLOT_SIZE)
        at = HEADER_SIZE + 2 * SLOT_SIZE + first * ITEM_SIZE
        assert crc == zlib.crc32(data[at : at + count * ITEM_SIZE])
        assert own == zlib.crc32(data[HEADER_SIZE + slot * SLOT_SIZE :][:12])
    assert len(data) == HEADER_SIZE + 2 * SLOT_SIZE + 3 * ITEM_SIZE


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.binary(min_size=1, max_size=4), min_size=1, max_size=200))
def test_lookup_finds_exactly_the_records_with_the_key(keys: list[bytes]) -> None:
    data = index_of(keys)
    header = decode_header(data[:HEADER_SIZE])
    for key in set(keys) | {b"missing-key"}:
        f = CountingFile(data)
        found = lookup(f.get, header, "s", key)
        assert sorted(found["offset"].tolist()) == [i for i, k in enumerate(keys) if k == key]
        assert f.gets <= 2


def test_lookup_on_a_large_window_costs_two_gets() -> None:
    rng = random.Random(1)
    keys = [f"order-{rng.randrange(50_000)}".encode() for _ in range(100_000)]
    data = index_of(keys)
    header = decode_header(data[:HEADER_SIZE])
    f = CountingFile(data)
    found = lookup(f.get, header, "s", keys[777])
    assert f.gets == 2
    assert set(found["offset"].tolist()) == {i for i, k in enumerate(keys) if k == keys[777]}
    assert np.all(np.diff(found["offset"].astype(np.int64)) > 0)  # in offset order


def test_damaged_reads_are_typed_errors() -> None:
    keys = [bytes([i % 7]) for i in range(60)]
    data = index_of(keys, slots=5)
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        try:
            header = decode_header(bytes(damaged[:HEADER_SIZE]))
            f = CountingFile(bytes(damaged))
            for key in set(keys):
                found = lookup(f.get, header, "s", key)
                assert sorted(found["offset"].tolist()) == [
                    i for i, k in enumerate(keys) if k == key
                ]
            pytest.fail(f"flip at {at} went unnoticed")
        except FormatError:
            pass
    with pytest.raises(FormatError):
        decode_header(data[:10])
    with pytest.raises(FormatError):
        decode_header(b"XXXX" + data[4:HEADER_SIZE])
