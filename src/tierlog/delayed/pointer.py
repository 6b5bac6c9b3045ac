"""Where a delayed stream's last checkpoint is: MetaStore key
``delayed-checkpoint/{incarnation}``, value ``b"TLDP" Version:u8=1 Through:u64 At:u64``
(``At``: the offset of the CHECKPOINT record, ``Through``: the scan position it
summarizes).

Retention cuts the system stream at segment or fragment boundaries below the last
checkpoint, so what is left before it can be a whole segment of delivered history; a
rebuild that knows where the checkpoint is starts reading at its ``Through`` instead of the
first offset (``Replay`` is correct from any checkpoint's ``Through``). The pointer is a
hint, never the only copy: it is checked against the record at ``At`` and ignored when that
is not the named checkpoint or lies below the stream's first offset (then the rebuild reads
from the first offset, as without one). Written after the checkpoint record is committed,
so it never names one that is not.
"""

from __future__ import annotations

import contextlib
import struct
from urllib.parse import quote

from tierlog.storage.errors import (
    AlreadyExistsError,
    KeyDeletedError,
    NotFoundError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore

POINTER_MAGIC = b"TLDP"
POINTER_VERSION = 1
_POINTER = struct.Struct(">4sBQQ")


def pointer_key(incarnation: str) -> str:
    return f"delayed-checkpoint/{quote(incarnation, safe='')}"


def encode_pointer(through: int, at: int) -> bytes:
    return _POINTER.pack(POINTER_MAGIC, POINTER_VERSION, through, at)


def decode_pointer(data: bytes) -> tuple[int, int] | None:
    """(through, at); None when the value is not a pointer of this version (ignored)."""
    if len(data) != _POINTER.size:
        return None
    magic, version, through, at = _POINTER.unpack(data)
    if magic != POINTER_MAGIC or version != POINTER_VERSION or at < through:
        return None
    return through, at


class CheckpointPointer:
    """The pointer of one stream incarnation (blocking MetaStore calls)."""

    def __init__(self, meta: MetaStore, incarnation: str) -> None:
        self.meta = meta
        self.key = pointer_key(incarnation)

    def load(self) -> tuple[int, int] | None:
        stored = self.meta.get(self.key)
        return None if stored is None else decode_pointer(stored.value)

    def store(self, through: int, at: int) -> None:
        """Point at the checkpoint record at ``at`` (a later one only: never back)."""
        value = encode_pointer(through, at)
        for _ in range(3):
            stored = self.meta.get(self.key)
            try:
                if stored is None:
                    self.meta.create(self.key, value)
                    return
                known = decode_pointer(stored.value)
                if known is not None and known[1] >= at:
                    return
                self.meta.put_if(self.key, value, stored.version, 0)
                return
            except (AlreadyExistsError, VersionConflictError, KeyDeletedError, NotFoundError):
                continue

    def delete(self) -> None:
        with contextlib.suppress(NotFoundError):
            self.meta.delete(self.key)
