"""The chunk bloom filter against osiris's own.

Every expected value below was produced by running osiris's ``src/osiris_bloom.erl``
(osiris commit 8e0b786a, compiled with erlc) on Erlang/OTP 25 — ``osiris_bloom:init/1``,
``insert/2``, ``to_binary/1``, ``make_hash/2``, ``init_matcher/1`` and ``is_match/2`` —
and ``erlang:phash2/1,2``; none of them comes from tierlog's code.
"""

from __future__ import annotations

import pytest

from tierlog.formats.bloom import (
    UNFILTERED,
    ChunkFilter,
    bloom_bytes,
    filter_from_properties,
    make_hash,
    phash2_binary,
    phash2_list1,
)

# osiris_bloom:to_binary(lists:foldl(fun osiris_bloom:insert/2, osiris_bloom:init(Size), Values))
OSIRIS_BLOOMS = [
    (16, [b"apple"], "04000000000000000000040000000000"),
    (16, [b"apple", b"banana"], "04000100000000000000060000000000"),
    (16, [b"apple", b""], "84000000000000000000040000000000"),
    (16, [b""], ""),
    (16, [], ""),
    (
        32,
        [b"invoices-eu", b"invoices-us", b"z"],
        "0001000010000000000000000000080001000800040000000000000000000000",
    ),
    (17, [b"abcdefghijkl", b"abcdefghijklm"], "0800000001000080000040000000000000"),
]

# a 255-byte filter: the bits set (byte, value) of the values below, rest zero
OSIRIS_BLOOM_255 = (
    [b"a much longer filter value, more than twelve bytes", "é".encode()],
    {19: 0x02, 160: 0x08, 186: 0x02, 217: 0x40},
)

# osiris_bloom:make_hash(Value, BitSize)
OSIRIS_HASHES = [
    (b"apple", 128, (5, 85)),
    (b"apple", 256, (208, 48)),
    (b"apple", 2040, (1479, 944)),
    (b"v42", 128, (75, 104)),
    (b"v42", 256, (129, 77)),
    (b"v42", 2040, (248, 2027)),
    (b"x", 128, (37, 63)),
    (b"x", 256, (29, 122)),
    (b"x", 2040, (1750, 470)),
]

# erlang:phash2(Value) (27 bits) and erlang:phash2([Value])
ERLANG_PHASH2 = [
    (b"apple", 98295965, 100705874),
    (b"x", 125354872, 50193253),
    (b"", 13708901, 38220213),
    (b"abcdefghijklmnop", 1713436, 104135151),
    (b"abcdefghijkl", 15432855, 89208944),
]


@pytest.mark.parametrize(("size", "values", "expected"), OSIRIS_BLOOMS)
def test_bloom_bytes_equal_osiris(size: int, values: list[bytes], expected: str) -> None:
    assert bloom_bytes(values, size).hex() == expected


def test_bloom_of_255_bytes_equals_osiris() -> None:
    values, bits = OSIRIS_BLOOM_255
    expected = bytearray(255)
    for at, byte in bits.items():
        expected[at] = byte
    assert bloom_bytes(values, 255) == bytes(expected)


@pytest.mark.parametrize(("value", "bit_size", "expected"), OSIRIS_HASHES)
def test_make_hash_equals_osiris(value: bytes, bit_size: int, expected: tuple[int, int]) -> None:
    assert make_hash(value, bit_size) == expected


@pytest.mark.parametrize(("value", "single", "listed"), ERLANG_PHASH2)
def test_phash2_equals_erlang(value: bytes, single: int, listed: int) -> None:
    assert phash2_binary(value) & 0x7FFFFFF == single
    assert phash2_list1(value) & 0x7FFFFFF == listed


def test_bit_layout_is_the_erlang_bitstring_order() -> None:
    """apple in 128 bits sets bits 5 and 85: byte 0 and byte 10, each 0b00000100 (bit 0 is
    the most significant bit of byte 0, as in an Erlang bitstring)."""
    bloom = bloom_bytes([b"apple"])
    assert bloom[0] == 0b00000100 and bloom[10] == 0b00000100
    assert bloom_bytes([b"apple", UNFILTERED])[0] == 0b10000100  # bit 0: unfiltered entries


def _bloom(size: int, values: list[bytes]) -> bytes:
    return bloom_bytes(values, size)


# is_match(Bloom, init_matcher(Spec)) (retried once on {retry_with, M2}), by osiris
MATCHER_SPECS = {
    "apple": ([b"apple"], False),
    "banana_mu": ([b"banana"], True),
    "cherry": ([b"cherry"], False),
    "cherry_mu": ([b"cherry"], True),
}
BLOOMS = {
    "a16": (16, [b"apple"]),
    "ab16": (16, [b"apple", b"banana"]),
    "au16": (16, [b"apple", b""]),
    "none": (16, []),
    "b32": (32, [b"banana"]),
    "a32": (32, [b"apple"]),
}
OSIRIS_MATCHES = (
    "apple a16 true;apple ab16 true;apple au16 true;apple none false;apple b32 false;"
    "apple a32 true;banana_mu a16 false;banana_mu ab16 true;banana_mu au16 true;"
    "banana_mu none true;banana_mu b32 true;banana_mu a32 false;cherry a16 false;"
    "cherry ab16 false;cherry au16 false;cherry none false;cherry b32 false;cherry a32 false;"
    "cherry_mu a16 false;cherry_mu ab16 false;cherry_mu au16 true;cherry_mu none true;"
    "cherry_mu b32 false;cherry_mu a32 false"
)


@pytest.mark.parametrize("case", OSIRIS_MATCHES.split(";"))
def test_matcher_equals_osiris(case: str) -> None:
    spec_name, bloom_name, expected = case.split()
    values, match_unfiltered = MATCHER_SPECS[spec_name]
    size, bloom_values = BLOOMS[bloom_name]
    chunk_filter = ChunkFilter(values, match_unfiltered)
    assert chunk_filter.may_match(_bloom(size, bloom_values)) is (expected == "true")


@pytest.mark.parametrize("size", [1, 8, 15])
def test_a_bloom_of_an_invalid_size_may_match(size: int) -> None:
    """tierlog's rule: a bloom it cannot trust costs bytes, never a skipped chunk."""
    assert ChunkFilter([b"cherry"]).may_match(bytes(size))


def test_filter_size_outside_16_255_is_refused() -> None:
    for size in (0, 15, 256):
        with pytest.raises(ValueError):
            bloom_bytes([b"apple"], size)


def test_filter_from_subscribe_properties() -> None:
    assert filter_from_properties({"name": "x"}) is None
    f = filter_from_properties({"filter.0": "apple", "filter.1": "banana", "name": "x"})
    assert f is not None and set(f.values) == {b"apple", b"banana"} and not f.match_unfiltered
    f = filter_from_properties({"filter.a": "apple", "match-unfiltered": "true"})
    assert f is not None and f.match_unfiltered
    # rabbit_stream_utils:filter_spec/1 matches the binary <<"true">> only
    f = filter_from_properties({"filter.a": "apple", "match-unfiltered": "TRUE"})
    assert f is not None and not f.match_unfiltered
