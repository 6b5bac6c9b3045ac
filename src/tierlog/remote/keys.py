"""Object keys of a stream's remote tier, and parsing them back.

::

    {prefix}/stream/{stream-dir}/data/{first:020d}.fragment
    {prefix}/stream/{stream-dir}/metadata/root.{uid}.manifest
    {prefix}/stream/{stream-dir}/metadata/{first:020d}.{uid}.{kind}
    {prefix}/stream/{stream-dir}/segments/{first:020d}.{uuid}.data
    {prefix}/stream/{stream-dir}/segments/{first:020d}.{uuid}.index

``uid`` is 16 random bytes written as 32 lowercase hex digits. ``kind`` names the branch
height: 1 ``group``, 2 ``kgroup``, 3 ``mgroup``, h >= 4 ``h{h}group`` (no cap). An empty
prefix drops the leading ``{prefix}/``. Zero-padded offsets keep a listing in offset order.
The ``segments/`` objects are whole offloaded segments (the data object and its index object);
``uuid`` is the offload attempt's UUID, so no two attempts ever write the same key.
"""

from __future__ import annotations

import os
import re
import uuid as uuid_module
from dataclasses import dataclass

from tierlog.formats.manifest import UID_SIZE
from tierlog.storage.errors import InvalidKeyError

_NAMED_HEIGHTS = {1: "group", 2: "kgroup", 3: "mgroup"}
_HEIGHT_OF_KIND = {v: k for k, v in _NAMED_HEIGHTS.items()}
_MAX_OFFSET = (1 << 64) - 1

_DATA_RE = re.compile(r"(\d{20})\.fragment")
_ROOT_RE = re.compile(r"root\.([0-9a-f]{32})\.manifest")
_SEGMENT_RE = re.compile(r"(\d{20})\.([0-9a-f]{32})\.(data|index)")
_BRANCH_RE = re.compile(r"(\d{20})\.([0-9a-f]{32})\.(group|kgroup|mgroup|h([1-9]\d*)group)")


@dataclass(frozen=True, slots=True)
class FragmentKey:
    stream_dir: str
    first_offset: int


@dataclass(frozen=True, slots=True)
class RootKey:
    stream_dir: str
    uid: bytes


@dataclass(frozen=True, slots=True)
class BranchKey:
    stream_dir: str
    first_offset: int
    uid: bytes
    height: int


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """An offloaded segment's object: ``part`` is ``data`` or ``index``."""

    stream_dir: str
    first_offset: int
    uuid: uuid_module.UUID
    part: str


ParsedKey = FragmentKey | RootKey | BranchKey | SegmentKey


def new_uid() -> bytes:
    """A fresh random uid for a root or branch object."""
    return os.urandom(UID_SIZE)


def _check_stream_dir(stream_dir: str) -> str:
    if not stream_dir or "/" in stream_dir or "\\" in stream_dir or "\x00" in stream_dir:
        raise InvalidKeyError(f"invalid stream dir {stream_dir!r}")
    if stream_dir in (".", ".."):
        raise InvalidKeyError(f"invalid stream dir {stream_dir!r}")
    return stream_dir


def _check_offset(offset: int) -> int:
    if not 0 <= offset <= _MAX_OFFSET:
        raise InvalidKeyError(f"offset {offset} out of range")
    return offset


def _uid_hex(uid: bytes) -> str:
    if len(uid) != UID_SIZE or uid == bytes(UID_SIZE):
        raise InvalidKeyError(f"uid must be {UID_SIZE} non-zero bytes, got {uid!r}")
    return uid.hex()


def branch_kind(height: int) -> str:
    """The key suffix naming a branch of ``height`` (>= 1)."""
    if height < 1:
        raise InvalidKeyError(f"branch height must be >= 1, got {height}")
    return _NAMED_HEIGHTS.get(height, f"h{height}group")


def stream_prefix(prefix: str, stream_dir: str) -> str:
    """``{prefix}/stream/{stream-dir}/``: every object of one stream incarnation."""
    base = prefix.strip("/")
    head = f"{base}/stream" if base else "stream"
    return f"{head}/{_check_stream_dir(stream_dir)}/"


def data_prefix(prefix: str, stream_dir: str) -> str:
    return stream_prefix(prefix, stream_dir) + "data/"


def metadata_prefix(prefix: str, stream_dir: str) -> str:
    return stream_prefix(prefix, stream_dir) + "metadata/"


def segments_prefix(prefix: str, stream_dir: str) -> str:
    """``{prefix}/stream/{stream-dir}/segments/``: every offloaded segment of a stream."""
    return stream_prefix(prefix, stream_dir) + "segments/"


def segment_data_key(
    prefix: str, stream_dir: str, first_offset: int, uuid: uuid_module.UUID
) -> str:
    """The data object (block format) of an offloaded segment."""
    return (
        f"{segments_prefix(prefix, stream_dir)}{_check_offset(first_offset):020d}.{uuid.hex}.data"
    )


def segment_index_key(
    prefix: str, stream_dir: str, first_offset: int, uuid: uuid_module.UUID
) -> str:
    """The index object of an offloaded segment."""
    return (
        f"{segments_prefix(prefix, stream_dir)}{_check_offset(first_offset):020d}.{uuid.hex}.index"
    )


OFFLOAD_ATTEMPTS_PREFIX = "offload-attempts/"


def offload_attempts_prefix(stream_dir: str) -> str:
    """MetaStore keys of a stream's in-flight segment offloads (stream cleanup drops them)."""
    return f"{OFFLOAD_ATTEMPTS_PREFIX}{_check_stream_dir(stream_dir)}/"


def fragment_key(prefix: str, stream_dir: str, first_offset: int) -> str:
    return f"{data_prefix(prefix, stream_dir)}{_check_offset(first_offset):020d}.fragment"


def fragment_keys(prefix: str, stream_dir: str, first_offsets: list[int]) -> list[str]:
    """``fragment_key`` of many fragments of one stream (the prefix is checked once)."""
    if first_offsets:
        _check_offset(min(first_offsets))
        _check_offset(max(first_offsets))
    head = data_prefix(prefix, stream_dir)
    return [f"{head}{offset:020d}.fragment" for offset in first_offsets]


def root_key(prefix: str, stream_dir: str, uid: bytes) -> str:
    return f"{metadata_prefix(prefix, stream_dir)}root.{_uid_hex(uid)}.manifest"


def branch_key(prefix: str, stream_dir: str, first_offset: int, uid: bytes, height: int) -> str:
    offset = _check_offset(first_offset)
    return (
        f"{metadata_prefix(prefix, stream_dir)}{offset:020d}.{_uid_hex(uid)}.{branch_kind(height)}"
    )


def parse_key(key: str, prefix: str) -> ParsedKey:
    """Parse a key made by this module under ``prefix``; raise ``InvalidKeyError`` otherwise."""
    base = prefix.strip("/")
    head = f"{base}/stream/" if base else "stream/"
    if not key.startswith(head):
        raise InvalidKeyError(f"key {key!r} is not under {head!r}")
    parts = key[len(head) :].split("/")
    if len(parts) != 3:
        raise InvalidKeyError(f"key {key!r} is not a stream object key")
    stream_dir, area, name = parts
    _check_stream_dir(stream_dir)
    if area == "data" and (m := _DATA_RE.fullmatch(name)):
        return FragmentKey(stream_dir, _check_offset(int(m.group(1))))
    if area == "segments" and (m := _SEGMENT_RE.fullmatch(name)):
        uuid = uuid_module.UUID(hex=m.group(2))
        return SegmentKey(stream_dir, _check_offset(int(m.group(1))), uuid, m.group(3))
    if area == "metadata":
        if m := _ROOT_RE.fullmatch(name):
            return RootKey(stream_dir, _parse_uid(m.group(1)))
        if m := _BRANCH_RE.fullmatch(name):
            height = int(m.group(4)) if m.group(4) else _HEIGHT_OF_KIND[m.group(3)]
            if m.group(4) and height < 4:
                raise InvalidKeyError(f"key {key!r}: height {height} has a proper name")
            offset = _check_offset(int(m.group(1)))
            return BranchKey(stream_dir, offset, _parse_uid(m.group(2)), height)
    raise InvalidKeyError(f"key {key!r} is not a fragment, segment, root or branch key")


def _parse_uid(text: str) -> bytes:
    uid = bytes.fromhex(text)
    _uid_hex(uid)
    return uid
