"""The key index of one time window, compacted for the object store (a hash slot table
whose slots point at contiguous runs of items, as RocketMQ rewrites its IndexFile for cold
storage): a lookup reads one slot entry and then that slot's items, each with one ranged
GET, and filters the items in memory.

Layout (all integers big-endian)::

    header  32 bytes: "TLKX", u32 version 1, u32 slot count, u32 item count,
            i64 window start (ms), u32 header CRC (of the 20 bytes before it), 4 zero bytes
    slots   ``slot count`` entries of 16 bytes: u32 first item, u32 item count,
            u32 CRC of the slot's items, u32 CRC of the 12 bytes before it
    items   ``item count`` entries of 48 bytes, grouped by slot, in offset order within a
            slot: u64 key hash, u64 offset, i64 timestamp (ms), u64 first offset of the
            fragment holding the record, u64 position of its chunk's frame in that fragment,
            u32 stored size of the frame, u32 flags (1: the frame is coded, i.e. the fragment
            is format v2 and the frame must be decoded with its index)

A record's key hash is the first 8 bytes of BLAKE2b over ``stream + "#" + key``; its slot is
``hash % slot count``. Items of different keys can share a slot (and, rarely, a hash): the
reader checks the record itself. Slot entry ``i`` is at ``32 + 16 i``, the items of a slot at
``32 + 16 * slots + 48 * first``; both are self-checking, so each ranged read is verified on
its own.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

KEY_INDEX_MAGIC = b"TLKX"
KEY_INDEX_VERSION = 1
HEADER = struct.Struct(">4sIIIqI4x")
HEADER_SIZE = HEADER.size  # 32
SLOT = struct.Struct(">IIII")
SLOT_SIZE = SLOT.size  # 16
ITEM_DTYPE = np.dtype(
    {
        "names": [
            "hash",
            "offset",
            "timestamp",
            "fragment",
            "frame_position",
            "frame_size",
            "flags",
        ],
        "formats": [">u8", ">u8", ">i8", ">u8", ">u8", ">u4", ">u4"],
        "offsets": [0, 8, 16, 24, 32, 40, 44],
        "itemsize": 48,
    }
)
ITEM_SIZE = ITEM_DTYPE.itemsize  # 48
FLAG_CODED_FRAME = 1
MAX_SLOTS = 1 << 26


def key_hash(stream: str, key: bytes) -> int:
    """The 64-bit hash of a record key within its stream."""
    digest = hashlib.blake2b(stream.encode() + b"#" + key, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def slots_for(item_count: int) -> int:
    """A slot count for ``item_count`` items: about four items per slot, at least 1."""
    return max(1, min(MAX_SLOTS, item_count // 4 + 1))


@dataclass(frozen=True, slots=True)
class KeyIndexHeader:
    slot_count: int
    item_count: int
    window_start: int

    @property
    def slots_end(self) -> int:
        return HEADER_SIZE + SLOT_SIZE * self.slot_count

    def slot_range(self, slot: int) -> tuple[int, int]:
        at = HEADER_SIZE + SLOT_SIZE * slot
        return at, at + SLOT_SIZE

    def items_range(self, first: int, count: int) -> tuple[int, int]:
        at = self.slots_end + ITEM_SIZE * first
        return at, at + ITEM_SIZE * count

    @property
    def total_size(self) -> int:
        return self.slots_end + ITEM_SIZE * self.item_count


def encode_key_index(items: np.ndarray, window_start: int, slot_count: int | None = None) -> bytes:
    """The index file of one window from its items (``ITEM_DTYPE``, any order)."""
    if items.dtype != ITEM_DTYPE:
        items = items.astype(ITEM_DTYPE)
    slots = slot_count if slot_count is not None else slots_for(len(items))
    if not 1 <= slots <= MAX_SLOTS or len(items) > 0xFFFFFFFF:
        raise InvalidSizeError(f"{slots} slots / {len(items)} items out of range")
    slot_of = (items["hash"].astype(np.uint64) % np.uint64(slots)).astype(np.int64)
    order = np.lexsort((items["offset"].astype(np.uint64), slot_of))
    ordered = items[order]
    counts = np.bincount(slot_of, minlength=slots)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    item_bytes = ordered.tobytes()
    table = bytearray()
    for first, count in zip(firsts.tolist(), counts.tolist(), strict=True):
        crc = zlib.crc32(item_bytes[first * ITEM_SIZE : (first + count) * ITEM_SIZE])
        head = struct.pack(">III", first, count, crc)
        table += head + struct.pack(">I", zlib.crc32(head))
    fields = (KEY_INDEX_MAGIC, KEY_INDEX_VERSION, slots, len(items), window_start)
    header_crc = zlib.crc32(HEADER.pack(*fields, 0)[:24])
    return HEADER.pack(*fields, header_crc) + bytes(table) + item_bytes


def build_items(
    stream: str,
    keys: Sequence[bytes],
    offsets: Sequence[int],
    timestamps: Sequence[int],
    fragments: Sequence[int],
    frame_positions: Sequence[int],
    frame_sizes: Sequence[int],
) -> np.ndarray:
    """Items for records (one per record that has a key)."""
    items = np.zeros(len(keys), dtype=ITEM_DTYPE)
    items["hash"] = [key_hash(stream, k) for k in keys]
    items["offset"] = offsets
    items["timestamp"] = timestamps
    items["fragment"] = fragments
    items["frame_position"] = frame_positions
    items["frame_size"] = frame_sizes
    return items


def decode_header(data: bytes | bytearray | memoryview) -> KeyIndexHeader:
    view = memoryview(data).cast("B")
    if view.nbytes < HEADER_SIZE:
        raise TruncatedError(f"key index header needs {HEADER_SIZE} bytes, got {view.nbytes}")
    magic, version, slots, count, window_start, crc = HEADER.unpack_from(view, 0)
    if magic != KEY_INDEX_MAGIC:
        raise BadMagicError(f"not a key index: magic {magic!r}")
    if version != KEY_INDEX_VERSION:
        raise UnsupportedError(f"key index version {version} not supported")
    if zlib.crc32(view[:24]) != crc or view[28:32] != b"\x00" * 4:
        raise CrcMismatchError("key index header CRC mismatch")
    if not 1 <= slots <= MAX_SLOTS:
        raise InvalidSizeError(f"key index has {slots} slots")
    return KeyIndexHeader(slots, count, window_start)


def decode_slot(
    data: bytes | bytearray | memoryview, header: KeyIndexHeader
) -> tuple[int, int, int]:
    """``(first item, item count, items CRC)`` of one slot entry (its 16 bytes)."""
    view = memoryview(data).cast("B")
    if view.nbytes != SLOT_SIZE:
        raise TruncatedError(f"slot entry of {view.nbytes} bytes")
    first, count, items_crc, crc = SLOT.unpack_from(view, 0)
    if zlib.crc32(view[:12]) != crc:
        raise CrcMismatchError("key index slot entry CRC mismatch")
    if first + count > header.item_count:
        raise InvalidSizeError(f"slot items [{first}, {first + count}) past {header.item_count}")
    return first, count, items_crc


def decode_items(data: bytes | bytearray | memoryview, count: int, crc: int) -> np.ndarray:
    view = memoryview(data).cast("B")
    if view.nbytes != count * ITEM_SIZE:
        raise TruncatedError(f"slot items: {view.nbytes} bytes for {count} items")
    if zlib.crc32(view) != crc:
        raise CrcMismatchError("key index slot items CRC mismatch")
    return np.frombuffer(view, dtype=ITEM_DTYPE, count=count)


def lookup(
    get: Callable[[int, int], bytes],
    header: KeyIndexHeader,
    stream: str,
    key: bytes,
) -> np.ndarray:
    """Items whose hash matches ``key`` (candidates; the record itself has the last word):
    one ranged read of the slot entry, one of the slot's items (none when the slot is
    empty). ``get(start, end)`` reads bytes ``[start, end)`` of the index file."""
    h = key_hash(stream, key)
    slot = h % header.slot_count
    first, count, crc = decode_slot(get(*header.slot_range(slot)), header)
    if count == 0:
        return np.zeros(0, dtype=ITEM_DTYPE)
    items = decode_items(get(*header.items_range(first, count)), count, crc)
    return items[items["hash"] == np.uint64(h)]
