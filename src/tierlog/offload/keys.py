"""Object keys of offloaded segments and MetaStore keys of in-flight offload attempts.

::

    {prefix}/stream/{stream-dir}/segments/{first:020d}.{uuid}.data
    {prefix}/stream/{stream-dir}/segments/{first:020d}.{uuid}.index

``first`` is the segment's first offset (zero-padded, so a listing is in offset order) and
``uuid`` the attempt's UUID as 32 lowercase hex digits: every attempt writes its own keys, so
a retried or concurrent attempt never overwrites another one's objects (Pulsar's
``{uuid}-ledger-{id}`` / ``-index`` naming, under the stream's own prefix).

Attempts: ``offload-attempts/{stream-dir}/{first:020d}.{uuid}`` in the MetaStore.
"""

from __future__ import annotations

import re
import uuid as uuid_module
from dataclasses import dataclass

from tierlog.storage.errors import InvalidKeyError

SEGMENTS_DIR = "segments/"
ATTEMPTS_PREFIX = "offload-attempts/"
_MAX_OFFSET = (1 << 64) - 1
_OBJECT_RE = re.compile(r"(\d{20})\.([0-9a-f]{32})\.(data|index)")


@dataclass(frozen=True, slots=True)
class OffloadKey:
    first_offset: int
    uuid: uuid_module.UUID
    kind: str  # "data" or "index"


def stream_prefix(prefix: str, stream_dir: str) -> str:
    """``{prefix}/stream/{stream-dir}/``, the stream's prefix exactly as the fragment keys
    spell it (kept here, not imported, so offload depends on no sibling package; it belongs
    with the other key functions in the remote tier's model)."""
    if not stream_dir or stream_dir in (".", "..") or any(c in stream_dir for c in "/\\\x00"):
        raise InvalidKeyError(f"invalid stream dir {stream_dir!r}")
    base = prefix.strip("/")
    return f"{base}/stream/{stream_dir}/" if base else f"stream/{stream_dir}/"


def _check_offset(offset: int) -> int:
    if not 0 <= offset <= _MAX_OFFSET:
        raise InvalidKeyError(f"offset {offset} out of range")
    return offset


def segments_prefix(prefix: str, stream_dir: str) -> str:
    """``{prefix}/stream/{stream-dir}/segments/``: every offloaded segment of a stream."""
    return stream_prefix(prefix, stream_dir) + SEGMENTS_DIR


def data_key(prefix: str, stream_dir: str, first_offset: int, uuid: uuid_module.UUID) -> str:
    return (
        f"{segments_prefix(prefix, stream_dir)}{_check_offset(first_offset):020d}.{uuid.hex}.data"
    )


def index_key(prefix: str, stream_dir: str, first_offset: int, uuid: uuid_module.UUID) -> str:
    return (
        f"{segments_prefix(prefix, stream_dir)}{_check_offset(first_offset):020d}.{uuid.hex}.index"
    )


def parse_offload_key(key: str, prefix: str, stream_dir: str) -> OffloadKey:
    """Parse a key made by ``data_key`` / ``index_key``; ``InvalidKeyError`` otherwise."""
    head = segments_prefix(prefix, stream_dir)
    match = _OBJECT_RE.fullmatch(key[len(head) :]) if key.startswith(head) else None
    if match is None:
        raise InvalidKeyError(f"key {key!r} is not an offloaded segment key under {head!r}")
    return OffloadKey(
        _check_offset(int(match.group(1))), uuid_module.UUID(hex=match.group(2)), match.group(3)
    )


def attempts_prefix(stream_dir: str) -> str:
    stream_prefix("", stream_dir)  # validates the stream dir
    return f"{ATTEMPTS_PREFIX}{stream_dir}/"


def attempt_key(stream_dir: str, first_offset: int, uuid: uuid_module.UUID) -> str:
    return f"{attempts_prefix(stream_dir)}{_check_offset(first_offset):020d}.{uuid.hex}"
