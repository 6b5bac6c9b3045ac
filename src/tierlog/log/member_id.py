"""A stream member's directory identity (``member.id``): which disk made its promises.

The cluster record of a replicated stream names, for every member, the identity its
stream directory must carry (``cluster/disk_identity.py`` decides what that means). This
module only keeps the file: a random 16-byte token, written when the member takes its
place and replaced atomically (write, fsync, rename, fsync the directory), so a crash
leaves the old identity or the new one. Layout (28 bytes, big-endian)::

    "TLMI" | version u32 (1) | token 16 bytes | CRC-32 of the first 24 bytes u32

A missing or undecodable file reads as ``None``: the directory carries no identity,
which the decision treats as a directory it cannot trust (never as a guess).
"""

from __future__ import annotations

import contextlib
import os
import struct

from tierlog.formats.crc import crc32
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.segment_files import fsync_dir, replace_durably

MEMBER_ID_FILE = "member.id"
_MAGIC = b"TLMI"
_VERSION = 1
_BODY = struct.Struct(">4sI16s")
_CRC = struct.Struct(">I")
FILE_SIZE = _BODY.size + _CRC.size  # 28


def new_member_id() -> str:
    """A fresh identity (32 hex digits)."""
    return os.urandom(16).hex()


def encode_member_id(member_id: str) -> bytes:
    token = bytes.fromhex(member_id)
    if len(token) != 16:
        raise ValueError(f"member id {member_id!r} is not 16 bytes of hex")
    body = _BODY.pack(_MAGIC, _VERSION, token)
    return body + _CRC.pack(crc32(body))


def decode_member_id(raw: bytes) -> str | None:
    if len(raw) != FILE_SIZE:
        return None
    magic, version, token = _BODY.unpack_from(raw)
    (crc,) = _CRC.unpack_from(raw, _BODY.size)
    if magic != _MAGIC or version != _VERSION or crc != crc32(raw[: _BODY.size]):
        return None
    return bytes(token).hex()


def read_member_id(stream_dir: str) -> str | None:
    """The identity ``stream_dir`` carries; None if it has none (or a damaged one)."""
    try:
        with open(os.path.join(stream_dir, MEMBER_ID_FILE), "rb") as f:
            raw = f.read(FILE_SIZE + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return decode_member_id(raw)


def write_member_id(stream_dir: str, member_id: str) -> None:
    """Durably make ``member_id`` the identity of ``stream_dir`` (created if missing,
    with its parent made durable too)."""
    raw = encode_member_id(member_id)
    if not os.path.isdir(stream_dir):
        os.makedirs(stream_dir, exist_ok=True)
        fsync_dir(os.path.dirname(os.path.abspath(stream_dir)))
    path = os.path.join(stream_dir, MEMBER_ID_FILE)
    replace_durably(path, raw)


def holds_chunks(stream_dir: str) -> bool:
    """Whether the stream directory's log holds at least one chunk (a segment file
    longer than its header), without opening the log."""
    try:
        names = os.listdir(stream_dir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    for name in names:
        if name.endswith(".segment"):
            with contextlib.suppress(OSError):
                if os.path.getsize(os.path.join(stream_dir, name)) > FILE_HEADER_SIZE:
                    return True
    return False
