"""Message-store segment records: v2 typed records (``.sqs``) and RabbitMQ's v1 records (``.rdq``).

A v2 segment is a 64-byte header (magic ``TLMS``, version 2, zero-filled rest) followed by
records whose first byte is their type (all integers big-endian):

* ``SMALL_HOLE`` (1): one byte, no length; a gap of 1..4 bytes is that many of them;
* ``HOLE`` (2): type, total size u32, then ``size - 5`` bytes that are never interpreted, so a
  gap needs only its 5-byte header written, never a zero-fill, and a scanner skips it in O(1);
* ``MESSAGE`` (3): type, total size u32, msg id (16 bytes), body;
* ``MESSAGE_WITH_CHECKSUM`` (4): type, total size u32, msg id, CRC-32 of msg id + body, body.
  tierlog writes this one (bit flips are detected on read); ``MESSAGE`` is read.

Type 0 is reserved forever: a zero-filled region fails a scan loudly instead of reading as
records; 5..255 are unknown and fail too. A v1 record is ``Size:64, MsgId:16 bytes, Body, 255``
with ``Size`` counting msg id + body; v1 files have no header and are only ever read.

The scanners here are pure: they walk a buffer holding file bytes from an absolute position
and report where they stopped, so the caller decides how to read (``os.pread`` blocks) and a
hole's bytes need never be read at all.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

from tierlog.formats.errors import (
    MsgIdMismatchError,
    MsgStoreRecordSizeError,
    NotAMessageError,
    RecordChecksumError,
    SegmentHeaderError,
    TornRecordError,
    UnknownRecordTypeError,
    V1RecordError,
    ZeroFilledRegionError,
)

MAGIC = b"TLMS"
"""v2 segment magic: distinct from RabbitMQ's ``RCQS`` / ``RCQI`` (and from ``RCQV``)."""
VERSION = 2
HEADER_SIZE = 64

RESERVED = 0
SMALL_HOLE = 1
HOLE = 2
MESSAGE = 3
MESSAGE_WITH_CHECKSUM = 4
RECORD_TYPES = (SMALL_HOLE, HOLE, MESSAGE, MESSAGE_WITH_CHECKSUM)

MSG_ID_SIZE = 16
HOLE_MIN = 5
MESSAGE_MIN = 1 + 4 + MSG_ID_SIZE
CHECKSUM_MESSAGE_MIN = MESSAGE_MIN + 4
MAX_RECORD_SIZE = 0xFFFFFFFF
MESSAGE_HEADER = 1 + 4 + MSG_ID_SIZE
"""Bytes a scanner needs to see to classify any record (type, size and msg id)."""

V1_SIZE_BYTES = 8
V1_TRAILER = 255
V1_OVERHEAD = V1_SIZE_BYTES + MSG_ID_SIZE + 1
"""A v1 record's bytes besides the body: size field, msg id, trailer byte (25)."""

_HEADER = struct.Struct(">4sB59x")
_TYPE_SIZE = struct.Struct(">BI")
_MESSAGE_HEAD = struct.Struct(">BI16s")
_CHECKSUM_HEAD = struct.Struct(">BI16sI")
_V1_HEAD = struct.Struct(">Q16s")
_U64 = struct.Struct(">Q")

_NON_ZERO = re.compile(rb"[^\x00]")


def _pick_crc32_continue() -> Callable[[bytes | memoryview, int], int]:
    """ISA-L's CRC-32 with a start value when present (checked against zlib), else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32
    fast: Callable[[bytes | memoryview, int], int] = isal_zlib.crc32
    if fast(b"56789", zlib.crc32(b"1234")) != zlib.crc32(b"123456789"):
        return zlib.crc32
    return fast


_crc32_continue = _pick_crc32_continue()

_MIN_SIZE = {HOLE: HOLE_MIN, MESSAGE: MESSAGE_MIN, MESSAGE_WITH_CHECKSUM: CHECKSUM_MESSAGE_MIN}


class Record(NamedTuple):
    """One record found by a scanner: where it is, what it is, how long, which message."""

    position: int
    type: int
    size: int
    msg_id: bytes | None
    """The 16-byte msg id of a message record; None for holes."""


class ScanStop(NamedTuple):
    """Where a block scan stopped: ``position``; ``torn`` when the rest of the file is a torn
    record (dropped); ``need`` is the absolute end offset of bytes needed to go on (0 when the
    scan reached the end of the file or a torn tail)."""

    position: int
    need: int
    torn: bool


# --------------------------------------------------------------------------- v2 header


def encode_header() -> bytes:
    """The 64-byte header every v2 segment starts with."""
    return _HEADER.pack(MAGIC, VERSION)


def check_header(data: bytes | memoryview) -> None:
    """Validate a v2 header (forensics and dirty recovery; the read path never checks it)."""
    if len(data) < HEADER_SIZE:
        raise TornRecordError(f"segment header needs {HEADER_SIZE} bytes, got {len(data)}")
    magic, version = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise SegmentHeaderError(
            f"segment header magic {bytes(magic)!r} version {version}, "
            f"expected {MAGIC!r} version {VERSION}"
        )


# --------------------------------------------------------------------------- v2 records


def _check_msg_id(msg_id: bytes) -> None:
    if len(msg_id) != MSG_ID_SIZE:
        raise ValueError(f"msg id must be {MSG_ID_SIZE} bytes, got {len(msg_id)}")


def message_size(body_len: int, *, checksum: bool = True) -> int:
    """Total size of the message record holding ``body_len`` bytes of body."""
    return body_len + (CHECKSUM_MESSAGE_MIN if checksum else MESSAGE_MIN)


def encode_message(msg_id: bytes, body: bytes | memoryview, *, checksum: bool = True) -> bytes:
    """A MESSAGE_WITH_CHECKSUM record (``checksum=False``: a plain MESSAGE)."""
    _check_msg_id(msg_id)
    size = message_size(len(body), checksum=checksum)
    if size > MAX_RECORD_SIZE:
        raise MsgStoreRecordSizeError(f"message record of {size} bytes exceeds {MAX_RECORD_SIZE}")
    if checksum:
        return _CHECKSUM_HEAD.pack(
            MESSAGE_WITH_CHECKSUM, size, msg_id, message_crc(msg_id, body)
        ) + bytes(body)
    return _MESSAGE_HEAD.pack(MESSAGE, size, msg_id) + bytes(body)


def message_crc(msg_id: bytes | memoryview, body: bytes | memoryview) -> int:
    """CRC-32 (zlib polynomial) of msg id followed by body, without concatenating them."""
    return _crc32_continue(body, _crc32_continue(msg_id, 0))


def hole_marker(gap: int) -> bytes:
    """The bytes that turn a gap of ``gap`` bytes into holes: 1..4 SMALL_HOLE bytes below 5,
    otherwise the 5-byte header of one HOLE record covering the whole gap (its inner bytes are
    left as they are). Every gap size >= 0 is representable."""
    if gap < 0 or gap > MAX_RECORD_SIZE:
        raise MsgStoreRecordSizeError(f"gap of {gap} bytes cannot be a hole")
    if gap < HOLE_MIN:
        return bytes([SMALL_HOLE]) * gap
    return _TYPE_SIZE.pack(HOLE, gap)


def encode_hole(gap: int, inner: bytes | None = None) -> bytes:
    """A complete hole of ``gap`` bytes (marker + ``inner`` or zeros): for tests and tools."""
    marker = hole_marker(gap)
    rest = gap - len(marker)
    if inner is None:
        return marker + bytes(rest)
    if len(inner) != rest:
        raise MsgStoreRecordSizeError(f"hole inner bytes must be {rest} long, got {len(inner)}")
    return marker + inner


def decode_message(
    data: bytes | memoryview, *, expected_id: bytes | None = None, verify: bool = True
) -> tuple[bytes, memoryview]:
    """Decode one whole message record (as read from its indexed position): (msg id, body).

    Raises a typed error when the bytes are not exactly one message record, when the msg id
    differs from ``expected_id``, or when a checksum does not match (``verify``)."""
    view = memoryview(data)
    if len(view) < MESSAGE_MIN:
        raise TornRecordError(f"message record needs {MESSAGE_MIN} bytes, got {len(view)}")
    rtype, size, msg_id = _MESSAGE_HEAD.unpack_from(view, 0)
    if rtype in (SMALL_HOLE, HOLE):
        raise NotAMessageError(f"record of type {rtype} is a hole, not a message")
    _check_type(rtype, 0)
    if size != len(view):
        raise MsgStoreRecordSizeError(f"message record size field {size}, expected {len(view)}")
    if expected_id is not None and msg_id != expected_id:
        raise MsgIdMismatchError(
            f"record holds msg id {msg_id.hex()}, expected {expected_id.hex()}"
        )
    if rtype == MESSAGE:
        return msg_id, view[MESSAGE_MIN:]
    if size < CHECKSUM_MESSAGE_MIN:
        raise MsgStoreRecordSizeError(
            f"checksummed message of {size} bytes < {CHECKSUM_MESSAGE_MIN}"
        )
    body = view[CHECKSUM_MESSAGE_MIN:]
    if verify:
        (stored,) = struct.unpack_from(">I", view, MESSAGE_MIN)
        actual = message_crc(msg_id, body)
        if stored != actual:
            raise RecordChecksumError(
                f"msg id {msg_id.hex()}: stored CRC {stored:#010x}, computed {actual:#010x}"
            )
    return msg_id, body


def _check_type(rtype: int, position: int) -> None:
    if rtype == RESERVED:
        raise ZeroFilledRegionError(f"record type 0 at position {position}: zero-filled region")
    if rtype > MESSAGE_WITH_CHECKSUM:
        raise UnknownRecordTypeError(f"unknown record type {rtype} at position {position}")


def scan_block(
    buf: bytes | memoryview, base: int, position: int, file_size: int, out: list[Record]
) -> ScanStop:
    """Scan v2 records in ``buf`` (file bytes from absolute offset ``base``) from ``position``.

    Appends every record found to ``out`` and stops at the end of the file, at a torn tail
    (a record or header that would end past ``file_size``: dropped, ``torn``), or where the
    buffer ends before the next record's header (``need`` says up to where to read). A
    record's body is never needed: a HOLE or MESSAGE that ends past the buffer is reported
    and the scan continues after it, so holes cost O(1) whatever their size. Structural
    errors (type 0, unknown type, size below the type's minimum) raise typed errors."""
    view = memoryview(buf)
    buf_end = base + len(view)
    unpack_ts = _TYPE_SIZE.unpack_from
    append = out.append
    while position < file_size:
        rel = position - base
        if position >= buf_end:
            return ScanStop(position, min(file_size, position + MESSAGE_HEADER), False)
        rtype = view[rel]
        if rtype == SMALL_HOLE:
            append(Record(position, SMALL_HOLE, 1, None))
            position += 1
            continue
        if rtype == RESERVED or rtype > MESSAGE_WITH_CHECKSUM:
            _check_type(rtype, position)
        head = 5 if rtype == HOLE else MESSAGE_HEADER
        if position + head > file_size:
            return ScanStop(position, 0, True)
        if position + head > buf_end:
            return ScanStop(position, position + head, False)
        _, size = unpack_ts(view, rel)
        if size < _MIN_SIZE[rtype]:
            raise MsgStoreRecordSizeError(
                f"record type {rtype} at position {position} has size {size} "
                f"< minimum {_MIN_SIZE[rtype]}"
            )
        if position + size > file_size:
            return ScanStop(position, 0, True)
        if rtype == HOLE:
            append(Record(position, HOLE, size, None))
        else:
            append(Record(position, rtype, size, bytes(view[rel + 5 : rel + MESSAGE_HEADER])))
        position += size
    return ScanStop(position, 0, False)


# --------------------------------------------------------------------------- v1 records


def encode_v1_record(msg_id: bytes, body: bytes) -> bytes:
    """A RabbitMQ v1 ``.rdq`` record (tests and fixtures only: tierlog never writes v1)."""
    _check_msg_id(msg_id)
    return _V1_HEAD.pack(MSG_ID_SIZE + len(body), msg_id) + body + bytes([V1_TRAILER])


def decode_v1_record(
    data: bytes | memoryview, *, expected_id: bytes | None = None
) -> tuple[bytes, memoryview]:
    """Decode one whole v1 record read from its indexed position: (msg id, body as stored)."""
    view = memoryview(data)
    if len(view) < V1_OVERHEAD:
        raise V1RecordError(f"v1 record needs {V1_OVERHEAD} bytes, got {len(view)}")
    size, msg_id = _V1_HEAD.unpack_from(view, 0)
    if size + V1_SIZE_BYTES + 1 != len(view) or size < MSG_ID_SIZE:
        raise V1RecordError(f"v1 size field {size} does not match a record of {len(view)} bytes")
    if view[-1] != V1_TRAILER:
        raise V1RecordError(f"v1 record trailer is {view[-1]}, expected 255")
    if expected_id is not None and msg_id != expected_id:
        raise MsgIdMismatchError(
            f"record holds msg id {msg_id.hex()}, expected {expected_id.hex()}"
        )
    return msg_id, view[V1_SIZE_BYTES + MSG_ID_SIZE : -1]


def scan_v1_block(
    buf: bytes | memoryview,
    base: int,
    position: int,
    file_size: int,
    seen: set[bytes],
    out: list[Record],
) -> ScanStop:
    """RabbitMQ's salvage scan of a v1 file, over ``buf`` (file bytes from offset ``base``).

    At each position a record is ``Size:64`` (>= 16, ending within the file), msg id, body and
    a 255 trailer, whose msg id was not seen before in this file (a repeat is a compaction
    remnant); anything else advances one byte, and a run of zero bytes is skipped at once
    (a zero size is never a record). Records are appended to ``out`` as type ``MESSAGE``
    with their total size; ``need`` asks for more bytes when a candidate ends past ``buf``."""
    view = memoryview(buf)
    buf_end = base + len(view)
    unpack = _V1_HEAD.unpack_from
    while position + V1_OVERHEAD <= file_size:
        rel = position - base
        if position + V1_SIZE_BYTES + MSG_ID_SIZE > buf_end:
            return ScanStop(position, min(file_size, position + V1_OVERHEAD), False)
        size, msg_id = unpack(view, rel)
        total = size + V1_SIZE_BYTES + 1
        if size >= MSG_ID_SIZE and position + total <= file_size:
            if position + total > buf_end:
                return ScanStop(position, position + total, False)
            if view[rel + total - 1] == V1_TRAILER and msg_id not in seen:
                seen.add(msg_id)
                out.append(Record(position, MESSAGE, total, msg_id))
                position += total
                continue
        elif size == 0:
            position = _skip_zeros(view, base, position, buf_end)
            continue
        position += 1
    return ScanStop(position, 0, False)


def _skip_zeros(view: memoryview, base: int, position: int, buf_end: int) -> int:
    """From a position whose 8 size bytes are zero, the first position whose size field can
    be non-zero (7 bytes before the next non-zero byte), or the buffer end."""
    match = _NON_ZERO.search(view, position - base)
    if match is None:
        return max(position + 1, buf_end - (V1_SIZE_BYTES - 1))
    return max(position + 1, base + match.start() - (V1_SIZE_BYTES - 1))


def v1_size_of_u64(data: bytes | memoryview) -> int:
    """The v1 size field at the start of ``data``."""
    (size,) = _U64.unpack_from(data, 0)
    return int(size)
