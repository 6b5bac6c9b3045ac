"""Osiris tracking entries: producer sequences, consumer offsets, timestamps.

Each entry is ``type u8, id size u8, id, data``. Types: 0 sequence (producer
deduplication), 1 offset (a consumer's stored offset), 2 timestamp.

* Delta form (tracking delta chunks and user-chunk trailers): data is one 64-bit
  integer (the sequence, the offset, or a signed timestamp). A sequence in a delta
  belongs to the chunk that carries it.
* Snapshot form (tracking snapshot chunks): a sequence entry holds the chunk id it
  was last written in *and* the sequence (two u64); offsets u64; timestamps i64.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from tierlog.formats.errors import FormatError, InvalidSizeError, TruncatedError

MAX_ID_BYTES = 255

_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U64U64 = struct.Struct(">QQ")


class TrackingType(IntEnum):
    """Kinds of tracking entries."""

    SEQUENCE = 0
    OFFSET = 1
    TIMESTAMP = 2


@dataclass(slots=True)
class TrackingSnapshot:
    """Decoded tracking state: what a snapshot chunk holds.

    ``sequences`` maps a producer id to (chunk id of its last write, sequence).
    """

    sequences: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    offsets: dict[bytes, int] = field(default_factory=dict)
    timestamps: dict[bytes, int] = field(default_factory=dict)


def _id_prefix(kind: int, ident: bytes) -> bytes:
    if len(ident) > MAX_ID_BYTES:
        raise InvalidSizeError(f"tracking id is {len(ident)} bytes, at most 255 allowed")
    return bytes((kind, len(ident))) + ident


def encode_delta(
    sequences: Mapping[bytes, int] | None = None,
    offsets: Mapping[bytes, int] | None = None,
    timestamps: Mapping[bytes, int] | None = None,
) -> bytes:
    """Encode delta entries (for a tracking delta chunk or a user chunk's trailer)."""
    parts: list[bytes] = []
    for ident, seq in (sequences or {}).items():
        parts.append(_id_prefix(TrackingType.SEQUENCE, ident) + _U64.pack(seq))
    for ident, off in (offsets or {}).items():
        parts.append(_id_prefix(TrackingType.OFFSET, ident) + _U64.pack(off))
    for ident, ts in (timestamps or {}).items():
        parts.append(_id_prefix(TrackingType.TIMESTAMP, ident) + _I64.pack(ts))
    return b"".join(parts)


def decode_delta(buf: bytes | memoryview) -> list[tuple[int, bytes, int]]:
    """Decode delta entries into (type, id, value) in file order."""
    view = memoryview(buf)
    out: list[tuple[int, bytes, int]] = []
    pos = 0
    end = len(view)
    while pos < end:
        kind, ident, pos = _read_id(view, pos)
        if pos + 8 > end:
            raise TruncatedError("tracking delta value truncated")
        if kind == TrackingType.TIMESTAMP:
            (value,) = _I64.unpack_from(view, pos)
        else:
            (value,) = _U64.unpack_from(view, pos)
        pos += 8
        out.append((kind, ident, value))
    return out


def encode_snapshot(snapshot: TrackingSnapshot) -> bytes:
    """Encode tracking state as a snapshot chunk's entry body."""
    parts: list[bytes] = []
    for ident, (chunk_id, seq) in snapshot.sequences.items():
        parts.append(_id_prefix(TrackingType.SEQUENCE, ident) + _U64U64.pack(chunk_id, seq))
    for ident, off in snapshot.offsets.items():
        parts.append(_id_prefix(TrackingType.OFFSET, ident) + _U64.pack(off))
    for ident, ts in snapshot.timestamps.items():
        parts.append(_id_prefix(TrackingType.TIMESTAMP, ident) + _I64.pack(ts))
    return b"".join(parts)


def decode_snapshot(buf: bytes | memoryview) -> TrackingSnapshot:
    """Decode a snapshot chunk's entry body."""
    view = memoryview(buf)
    snap = TrackingSnapshot()
    pos = 0
    end = len(view)
    while pos < end:
        kind, ident, pos = _read_id(view, pos)
        if kind == TrackingType.SEQUENCE:
            if pos + 16 > end:
                raise TruncatedError("tracking snapshot sequence truncated")
            snap.sequences[ident] = _U64U64.unpack_from(view, pos)
            pos += 16
            continue
        if pos + 8 > end:
            raise TruncatedError("tracking snapshot value truncated")
        if kind == TrackingType.OFFSET:
            snap.offsets[ident] = _U64.unpack_from(view, pos)[0]
        else:
            snap.timestamps[ident] = _I64.unpack_from(view, pos)[0]
        pos += 8
    return snap


def _read_id(view: memoryview, pos: int) -> tuple[int, bytes, int]:
    if pos + 2 > len(view):
        raise TruncatedError("tracking entry header truncated")
    kind = view[pos]
    size = view[pos + 1]
    if kind not in (0, 1, 2):
        raise FormatError(f"unknown tracking type {kind}")
    start = pos + 2
    if start + size > len(view):
        raise TruncatedError("tracking id truncated")
    return kind, bytes(view[start : start + size]), start + size
