"""RabbitMQ's message-store index file ``msg_store_index.ets``, as written by ``ets:tab2file``.

``ets:tab2file`` writes a ``disk_log`` halt log in internal format: an 8-byte file header
(``01 02 03 04`` then ``63 58 4D 0B`` once the log was closed, ``06 07 08 09`` while open),
then one item per logged term: ``Size:32``, the item magic ``62 57 4C 41`` ("bWLA"), an MD5
of the 4 size bytes when ``Size >= 65528``, and ``Size`` bytes of ``term_to_binary(Term)``.
(Older logs used the magic ``0C 21 2C 37`` without MD5; it is read too.) The first term is
the table's info tuple, then one term per object, then ``['$end_of_table', [{count, N}]]``
(RabbitMQ asks for ``{extended_info, [object_count]}``), which is checked.

The message store's objects are ``#msg_location{msg_id, ref_count, file, offset,
total_size}`` records, i.e. tuples ``(msg_location, MsgId, RefCount, File, Offset,
TotalSize)``. A ref count of 0 means the message was removed (acked) although its bytes are
still in its file; ``file = undefined`` marks a temporary entry that names no file.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, NamedTuple

from tierlog.formats.erlang_term import Atom, decode
from tierlog.formats.errors import (
    ErlangTermError,
    EtsFileError,
    TruncatedEtsFileError,
)

LOG_MAGIC = b"\x01\x02\x03\x04"
CLOSED = b"\x63\x58\x4d\x0b"
OPENED = b"\x06\x07\x08\x09"
ITEM_MAGIC = b"\x62\x57\x4c\x41"
OLD_ITEM_MAGIC = b"\x0c\x21\x2c\x37"
MIN_MD5_TERM = 65528

_ITEM_HEAD = struct.Struct(">I4s")


class MsgLocation(NamedTuple):
    """One ``#msg_location{}`` of RabbitMQ's message-store index."""

    msg_id: bytes
    ref_count: int
    file: int
    offset: int
    total_size: int


def read_terms(data: bytes | memoryview) -> list[Any]:
    """Every term of a closed disk_log halt log, in order."""
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != LOG_MAGIC:
        raise EtsFileError("not a disk_log file (bad magic)")
    if bytes(view[4:8]) != CLOSED:
        state = "open (not closed cleanly)" if bytes(view[4:8]) == OPENED else "unknown"
        raise EtsFileError(f"disk_log file is {state}")
    terms: list[Any] = []
    position = 8
    while position < len(view):
        if position + 8 > len(view):
            raise TruncatedEtsFileError(f"item header at {position} is cut off")
        size, magic = _ITEM_HEAD.unpack_from(view, position)
        position += 8
        if magic == ITEM_MAGIC:
            if size >= MIN_MD5_TERM:
                digest = bytes(view[position : position + 16])
                if digest != hashlib.md5(struct.pack(">I", size)).digest():
                    raise EtsFileError(f"item size MD5 mismatch at {position}")
                position += 16
        elif magic != OLD_ITEM_MAGIC:
            raise EtsFileError(f"bad item magic {bytes(magic).hex()} at {position - 4}")
        if position + size > len(view):
            raise TruncatedEtsFileError(f"item of {size} bytes at {position} is cut off")
        try:
            terms.append(decode(view[position : position + size]))
        except ErlangTermError as exc:
            raise EtsFileError(f"item at {position} is not a term: {exc}") from exc
        position += size
    return terms


def read_msg_locations(data: bytes | memoryview) -> dict[bytes, MsgLocation]:
    """The message-store index in an ``msg_store_index.ets`` dump, keyed by msg id.

    Temporary entries (``file = undefined``) are left out. The object count recorded at the
    end of the dump must match the objects read."""
    terms = read_terms(data)
    if len(terms) < 2:
        raise TruncatedEtsFileError("dump has no info term or no end-of-table term")
    end = terms[-1]
    if not (isinstance(end, list) and len(end) == 2 and end[0] == Atom("$end_of_table")):
        raise TruncatedEtsFileError("dump does not end with its end-of-table term")
    counts = [
        v for k, v in (t for t in end[1] if isinstance(t, tuple) and len(t) == 2) if k == "count"
    ]
    objects = terms[1:-1]
    if counts and counts[0] != len(objects):
        raise EtsFileError(f"dump says {counts[0]} objects, holds {len(objects)}")
    locations: dict[bytes, MsgLocation] = {}
    for obj in objects:
        if not (isinstance(obj, tuple) and len(obj) == 6 and obj[0] == Atom("msg_location")):
            raise EtsFileError(f"object is not a #msg_location{{}} record: {obj!r:.200}")
        _, msg_id, ref_count, file, offset, total_size = obj
        if file == Atom("undefined"):
            continue
        if not (
            isinstance(msg_id, bytes)
            and all(isinstance(v, int) for v in (ref_count, file, offset, total_size))
        ):
            raise EtsFileError(f"#msg_location{{}} with unexpected field types: {obj!r:.200}")
        locations[msg_id] = MsgLocation(msg_id, ref_count, file, offset, total_size)
    return locations
