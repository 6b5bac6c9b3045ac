"""The message store's clean-shutdown file: ``last_v1_file`` and the index, CRC-protected.

Layout (big-endian): magic ``TLMC``, version u8 (1), ``last_v1_file`` i64 (-1 for none),
entry count u32, then per entry msg id (16 bytes), ref count u32, file u32, offset u64,
total size u32; finally a CRC-32 of everything before it. The store writes it on a clean
close and deletes it on open, so its presence means the index in it is exact.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from tierlog.formats.crc import crc32
from tierlog.formats.errors import CleanFileError

MAGIC = b"TLMC"
VERSION = 1

_HEAD = struct.Struct(">4sBqI")
_ENTRY = struct.Struct(">16sIIQI")
_CRC = struct.Struct(">I")


class CleanEntry(NamedTuple):
    msg_id: bytes
    ref_count: int
    file: int
    offset: int
    total_size: int


class CleanState(NamedTuple):
    last_v1_file: int | None
    entries: list[CleanEntry]


def encode_clean(last_v1_file: int | None, entries: list[CleanEntry]) -> bytes:
    parts = [_HEAD.pack(MAGIC, VERSION, -1 if last_v1_file is None else last_v1_file, len(entries))]
    pack = _ENTRY.pack
    parts.extend(pack(*e) for e in entries)
    body = b"".join(parts)
    return body + _CRC.pack(crc32(body))


def decode_clean(data: bytes) -> CleanState:
    if len(data) < _HEAD.size + _CRC.size:
        raise CleanFileError("clean-shutdown file is cut off")
    magic, version, last_v1, count = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise CleanFileError(f"clean-shutdown file magic {magic!r} version {version}")
    end = _HEAD.size + count * _ENTRY.size
    if len(data) != end + _CRC.size:
        raise CleanFileError(f"clean-shutdown file holds {len(data)} bytes, expected {end + 4}")
    (stored,) = _CRC.unpack_from(data, end)
    if stored != crc32(data[:end]):
        raise CleanFileError("clean-shutdown file CRC mismatch")
    entries = [CleanEntry(*e) for e in _ENTRY.iter_unpack(data[_HEAD.size : end])]
    return CleanState(None if last_v1 < 0 else last_v1, entries)
