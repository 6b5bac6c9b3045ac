"""The chunk bloom filter of RabbitMQ stream filtering, bit for bit as osiris writes it.

osiris (``osiris_bloom.erl``, ``osiris_log.erl:make_chunk``) gives every user chunk whose
entries carry filter values a bloom filter of ``filter_size`` bytes (16..255, the stream's
``stream-filter-size-bytes``, default 16) between the 48-byte header and the entry data;
the header's bloom size byte says how long it is. A chunk with no filter values at all (or
only unfiltered entries) has no bloom (size 0).

Each distinct filter value ``V`` (its UTF-8 bytes) sets two bits::

    H1 = erlang:phash2(V, BitSize - 1) + 1
    H2 = erlang:phash2([V], BitSize - 1) + 1      (the one-element list holding V)

where ``BitSize = 8 * filter_size`` and bit ``N`` is bit ``N`` of the filter read as an
Erlang bitstring: byte ``N // 8``, counted from its most significant bit. Bit 0 is never
set by a value: it marks a chunk holding at least one entry without a filter value (a
Publish v2 null or empty value, or a v1 publish), so ``match-unfiltered`` readers find them.

A reader (``ChunkFilter``, osiris's matcher) with filter values ``F`` and
``match_unfiltered`` wants a chunk when any of its values has both bits set, or (with
``match_unfiltered``) bit 0 is set, or the chunk has no bloom and ``match_unfiltered`` is
on. A bloom of another size than the reader's hashes is matched with hashes for its size,
as osiris's ``{retry_with, ...}`` does. tierlog adds one rule: a bloom it cannot trust (a
size outside 16..255, a fragment index record failing its CRC) counts as "may match", so a
damaged bloom costs bytes, never a silently skipped chunk.

``erlang:phash2/2`` is the Jenkins one-at-a-time-block hash of OTP's ``make_hash2``
(``erts/emulator/beam/erl_term_hashing.c``), reduced modulo the range; only its binary and
list-of-one-binary cases are needed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

DEFAULT_FILTER_SIZE = 16
MIN_FILTER_SIZE = 16
MAX_FILTER_SIZE = 255
UNFILTERED = b""
"""The filter value osiris records for an entry published without one (sets bit 0)."""

_M = 0xFFFFFFFF
_HCONST = 0x9E3779B9  # the golden ratio
_HCONST_2 = (_HCONST * 2) & _M
_HCONST_13 = (_HCONST * 13) & _M
_NIL_DEF = 2  # the tag value make_hash2 mixes in for the [] ending a list


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins's ``mix`` on three unsigned 32-bit words (OTP's ``MIX`` macro)."""
    a = (a - b - c) & _M
    a ^= c >> 13
    b = (b - c - a) & _M
    b ^= (a << 8) & _M
    c = (c - a - b) & _M
    c ^= b >> 13
    a = (a - b - c) & _M
    a ^= c >> 12
    b = (b - c - a) & _M
    b ^= (a << 16) & _M
    c = (c - a - b) & _M
    c ^= b >> 5
    a = (a - b - c) & _M
    a ^= c >> 3
    b = (b - c - a) & _M
    b ^= (a << 10) & _M
    c = (c - a - b) & _M
    c ^= b >> 15
    return a, b, c


def _block_hash(data: bytes, initval: int) -> int:
    """OTP's ``block_hash``: 12-byte little-endian blocks, then the tail with the length."""
    a = b = _HCONST
    c = initval
    n = len(data)
    i = 0
    while n - i >= 12:
        a = (a + int.from_bytes(data[i : i + 4], "little")) & _M
        b = (b + int.from_bytes(data[i + 4 : i + 8], "little")) & _M
        c = (c + int.from_bytes(data[i + 8 : i + 12], "little")) & _M
        a, b, c = _mix(a, b, c)
        i += 12
    c = (c + n) & _M
    tail = data[i:] + bytes(12 - (n - i))
    a = (a + int.from_bytes(tail[0:4], "little")) & _M
    b = (b + int.from_bytes(tail[4:8], "little")) & _M
    c = (c + (int.from_bytes(tail[8:12], "little") << 8)) & _M  # byte 0 of c holds the length
    return _mix(a, b, c)[2]


def phash2_binary(value: bytes) -> int:
    """``make_hash2`` of an Erlang binary: the full 32-bit hash (``erlang:phash2/1`` keeps
    its low 27 bits, ``phash2/2`` takes it modulo the range)."""
    if not value:
        return _HCONST_13
    return _block_hash(value, _HCONST_13)


def phash2_list1(value: bytes) -> int:
    """``make_hash2`` of ``[Value]``: the binary's hash, then the ``[]`` tail mixed in."""
    return _mix((_HCONST_2 + _NIL_DEF) & _M, _HCONST_2, phash2_binary(value))[2]


@lru_cache(maxsize=4096)
def make_hash(value: bytes, bit_size: int) -> tuple[int, int]:
    """osiris_bloom:make_hash/2: the two bit numbers of ``value`` in a filter of
    ``bit_size`` bits, 1..bit_size-1 (``(0, 0)`` for the unfiltered marker)."""
    if not value:
        return 0, 0
    rng = bit_size - 1
    return phash2_binary(value) % rng + 1, phash2_list1(value) % rng + 1


def check_filter_size(size: int) -> int:
    """``size`` when it is a valid filter size (16..255, as osiris_bloom:init/1 and
    RabbitMQ's ``stream-filter-size-bytes`` validation require), else ValueError."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise ValueError(f"filter size must be an integer, not {size!r}")
    if not MIN_FILTER_SIZE <= size <= MAX_FILTER_SIZE:
        raise ValueError(f"filter size {size} is outside {MIN_FILTER_SIZE}..{MAX_FILTER_SIZE}")
    return size


def bloom_bytes(values: Iterable[bytes], size: int = DEFAULT_FILTER_SIZE) -> bytes:
    """osiris_bloom:to_binary/1 of a chunk whose entries carry ``values`` (``UNFILTERED``
    for an entry without one): empty when no value is a real filter value, else ``size``
    bytes with both bits of each distinct value set (and bit 0 for ``UNFILTERED``)."""
    distinct = set(values)
    if not distinct or distinct == {UNFILTERED}:
        return b""
    bit_size = check_filter_size(size) * 8
    bits = 0
    for value in distinct:
        h1, h2 = make_hash(value, bit_size)
        bits |= (1 << (bit_size - 1 - h1)) | (1 << (bit_size - 1 - h2))
    return bits.to_bytes(size, "big")


class ChunkFilter:
    """A subscription's filter (osiris_bloom's matcher): which chunks may hold a value it
    wants. ``may_match`` is called once per chunk, never per record."""

    __slots__ = ("_masks", "match_unfiltered", "values")

    def __init__(self, values: Iterable[bytes], match_unfiltered: bool = False) -> None:
        self.values = tuple(dict.fromkeys(values))
        if not self.values:
            raise ValueError("a chunk filter needs at least one filter value")
        self.match_unfiltered = match_unfiltered
        self._masks: dict[int, list[int]] = {}

    def _masks_for(self, size: int) -> list[int]:
        """Per value, the integer with its two bits set in a filter of ``size`` bytes."""
        masks = self._masks.get(size)
        if masks is None:
            bit_size = size * 8
            masks = []
            for value in self.values:
                h1, h2 = make_hash(value, bit_size)
                masks.append((1 << (bit_size - 1 - h1)) | (1 << (bit_size - 1 - h2)))
            if self.match_unfiltered:
                masks.append(1 << (bit_size - 1))
            self._masks[size] = masks
        return masks

    def may_match(self, bloom: bytes | memoryview) -> bool:
        """Whether a chunk with this bloom may hold a wanted entry (osiris_bloom:is_match/2;
        a bloom of an invalid size may match)."""
        size = len(bloom)
        if size == 0:
            return self.match_unfiltered
        if not MIN_FILTER_SIZE <= size <= MAX_FILTER_SIZE:
            return True
        bits = int.from_bytes(bloom, "big")
        return any(bits & mask == mask for mask in self._masks_for(size))

    def __repr__(self) -> str:
        return f"ChunkFilter({list(self.values)!r}, match_unfiltered={self.match_unfiltered})"


def filter_from_properties(properties: Mapping[str, str]) -> ChunkFilter | None:
    """A Subscribe's ``filter.N`` properties (any key starting ``filter.``) and
    ``match-unfiltered`` (``true`` exactly, as rabbit_stream_utils:filter_spec/1 reads it)
    as a ChunkFilter; None without filter properties."""
    values = [v.encode("utf-8") for k, v in properties.items() if k.startswith("filter.")]
    if not values:
        return None
    return ChunkFilter(values, properties.get("match-unfiltered") == "true")
