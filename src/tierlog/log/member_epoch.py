"""A stream member's persisted highest-seen epoch: its fence against deposed leaders.

A member must never accept chunks, acks or commands of an epoch lower than one it has
already answered, across restarts too, so the highest epoch is fsynced before the
member replies to anything that raised it. The file is tiny and replaced atomically
(write to a temporary name, fsync, rename, fsync the directory): a crash leaves either
the old or the new value, never a torn one. Layout (20 bytes, big-endian)::

    "TLME" | version u32 (1) | epoch u64 | CRC-32 of the first 16 bytes u32

A missing file means epoch 0 (nothing seen yet). A file that does not decode is a
typed error: guessing a value could let a deposed leader back in.
"""

from __future__ import annotations

import os
import struct

from tierlog.formats.crc import crc32
from tierlog.log.errors import MemberEpochCorruptError
from tierlog.log.segment_files import replace_durably

MEMBER_EPOCH_FILE = "member.epoch"
_MAGIC = b"TLME"
_VERSION = 1
_BODY = struct.Struct(">4sIQ")
_CRC = struct.Struct(">I")
FILE_SIZE = _BODY.size + _CRC.size  # 20
MAX_EPOCH = (1 << 64) - 1


def encode_member_epoch(epoch: int) -> bytes:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch {epoch!r} is not a u64")
    body = _BODY.pack(_MAGIC, _VERSION, epoch)
    return body + _CRC.pack(crc32(body))


def decode_member_epoch(raw: bytes, path: str = MEMBER_EPOCH_FILE) -> int:
    if len(raw) != FILE_SIZE:
        raise MemberEpochCorruptError(f"{path}: {len(raw)} bytes, expected {FILE_SIZE}")
    magic, version, epoch = _BODY.unpack_from(raw)
    (crc,) = _CRC.unpack_from(raw, _BODY.size)
    if magic != _MAGIC or version != _VERSION:
        raise MemberEpochCorruptError(f"{path}: bad magic/version {magic!r}/{version}")
    if crc != crc32(raw[: _BODY.size]):
        raise MemberEpochCorruptError(f"{path}: CRC mismatch")
    return int(epoch)


def member_epoch_path(stream_dir: str) -> str:
    return os.path.join(stream_dir, MEMBER_EPOCH_FILE)


def read_member_epoch(stream_dir: str) -> int:
    """The persisted highest-seen epoch (0 when none was ever persisted)."""
    path = member_epoch_path(stream_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read(FILE_SIZE + 1)
    except FileNotFoundError:
        return 0
    return decode_member_epoch(raw, path)


def persist_member_epoch(stream_dir: str, epoch: int) -> None:
    """Durably replace the highest-seen epoch with ``epoch`` (write, fsync, rename,
    fsync the directory). The caller never lowers it (``MemberEpoch`` decides)."""
    raw = encode_member_epoch(epoch)
    path = member_epoch_path(stream_dir)
    replace_durably(path, raw)
