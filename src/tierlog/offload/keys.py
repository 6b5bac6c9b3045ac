"""MetaStore keys of in-flight offload attempts, and the segment object keys' parser.

The object keys of offloaded segments belong to the remote tier's model
(``tierlog.remote.keys``: ``segment_data_key``, ``segment_index_key``, ``segments_prefix``)::

    {prefix}/stream/{stream-dir}/segments/{first:020d}.{uuid}.data
    {prefix}/stream/{stream-dir}/segments/{first:020d}.{uuid}.index

every attempt writes its own keys, so a retried or concurrent attempt never overwrites another
one's objects (Pulsar's ``{uuid}-ledger-{id}`` / ``-index`` naming, under the stream's prefix).

Attempts: ``offload-attempts/{stream-dir}/{first:020d}.{uuid}`` in the MetaStore.
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass

from tierlog.remote.keys import (
    OFFLOAD_ATTEMPTS_PREFIX,
    SegmentKey,
    offload_attempts_prefix,
    parse_key,
    segment_data_key,
    segment_index_key,
    segments_prefix,
    stream_prefix,
)
from tierlog.storage.errors import InvalidKeyError

ATTEMPTS_PREFIX = OFFLOAD_ATTEMPTS_PREFIX
_MAX_OFFSET = (1 << 64) - 1

data_key = segment_data_key
index_key = segment_index_key

__all__ = [
    "ATTEMPTS_PREFIX",
    "OffloadKey",
    "attempt_key",
    "attempts_prefix",
    "data_key",
    "index_key",
    "parse_offload_key",
    "segments_prefix",
    "stream_prefix",
]


@dataclass(frozen=True, slots=True)
class OffloadKey:
    first_offset: int
    uuid: uuid_module.UUID
    kind: str  # "data" or "index"


def _check_offset(offset: int) -> int:
    if not 0 <= offset <= _MAX_OFFSET:
        raise InvalidKeyError(f"offset {offset} out of range")
    return offset


def parse_offload_key(key: str, prefix: str, stream_dir: str) -> OffloadKey:
    """Parse a key made by ``data_key`` / ``index_key``; ``InvalidKeyError`` otherwise."""
    parsed = parse_key(key, prefix)
    if not isinstance(parsed, SegmentKey) or parsed.stream_dir != stream_dir:
        raise InvalidKeyError(f"key {key!r} is not an offloaded segment key of {stream_dir!r}")
    return OffloadKey(parsed.first_offset, parsed.uuid, parsed.part)


def attempts_prefix(stream_dir: str) -> str:
    return offload_attempts_prefix(stream_dir)


def attempt_key(stream_dir: str, first_offset: int, uuid: uuid_module.UUID) -> str:
    return f"{attempts_prefix(stream_dir)}{_check_offset(first_offset):020d}.{uuid.hex}"
