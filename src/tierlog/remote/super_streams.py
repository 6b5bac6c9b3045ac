"""Super streams in the catalog: name, vhost, partitions in order, binding keys, arguments.

A super stream is a name over ordinary streams (its partitions), as in RabbitMQ, where it
is a direct exchange bound to its partition streams by binding key. tierlog keeps one
MetaStore entry per super stream, ``superstream/{vhost}/{name}`` (both percent-encoded;
beside the streams' ``catalog/`` keys, never under them), JSON::

    {"vhost", "name", "partitions": [...], "binding_keys": [...], "arguments": {...},
     "state": "creating" | "ready" | "deleting", "created_ns"}

The entry only uses the MetaStore's create-only put, version-checked put and delete (the
store contract both backends pass). Its ``state`` makes creation and deletion, which span
several streams, converge after a crash:

* creation writes the entry ``creating`` (create-only: one creator wins), then creates the
  partitions, then puts it ``ready``. A crash in between leaves ``creating``: the same
  CreateSuperStream again resumes it (partitions already there are kept, the missing ones
  created); a different definition, or DeleteSuperStream, finds the name taken / removes
  whatever partitions exist. Route and Partitions answer only for ``ready`` entries.
* deletion puts the entry ``deleting``, deletes the partitions, then the entry. A crash
  in between leaves ``deleting``: DeleteSuperStream again finishes it; CreateSuperStream
  of that name answers "already exists" until then.

Partition placement is the client's (rstream hashes UTF-16 with a 128-bit murmur, the
Node.js and Java clients a 32-bit murmur over UTF-8), so the server stores binding keys
and answers Route by exact binding key only (RabbitMQ's direct exchange).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from tierlog.errors import ConfigError
from tierlog.log.names import validate_stream_name, validate_vhost
from tierlog.remote.errors import SuperStreamExistsError, SuperStreamNotFoundError
from tierlog.storage.errors import (
    AlreadyExistsError,
    KeyDeletedError,
    NotFoundError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore

SUPER_STREAM_PREFIX = "superstream/"
MAX_PARTITIONS = 1000
"""RabbitMQ's default ``max_super_stream_partitions``."""

CREATING, READY, DELETING = "creating", "ready", "deleting"
STATES = (CREATING, READY, DELETING)


def super_stream_key(vhost: str, name: str) -> str:
    return f"{SUPER_STREAM_PREFIX}{quote(vhost, safe='')}/{quote(name, safe='')}"


@dataclass(frozen=True, slots=True)
class SuperStreamDefinition:
    """What a client asks for: checked by ``check`` before anything is written."""

    vhost: str
    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    arguments: Mapping[str, str] = field(default_factory=dict)

    def check(self) -> None:
        """RabbitMQ's validation (``rabbit_stream_manager``): as many binding keys as
        partitions, no partition twice, at most ``MAX_PARTITIONS``; names usable as stream
        names. ``ConfigError`` (PRECONDITION_FAILED) otherwise. tierlog also refuses a
        super stream without partitions: it could route nothing."""
        validate_vhost(self.vhost)
        validate_stream_name(self.name)
        if len(self.partitions) != len(self.binding_keys):
            raise ConfigError(
                f"super stream {self.name!r}: {len(self.partitions)} partitions but "
                f"{len(self.binding_keys)} binding keys (there must be one per partition)"
            )
        if not self.partitions:
            raise ConfigError(f"super stream {self.name!r}: no partitions")
        if len(self.partitions) > MAX_PARTITIONS:
            raise ConfigError(
                f"super stream {self.name!r}: {len(self.partitions)} partitions, "
                f"at most {MAX_PARTITIONS}"
            )
        if len(set(self.partitions)) != len(self.partitions):
            raise ConfigError(f"super stream {self.name!r}: a partition is named twice")
        for partition in self.partitions:
            validate_stream_name(partition)

    def same_as(self, record: SuperStreamRecord) -> bool:
        return (self.partitions, self.binding_keys, dict(self.arguments)) == (
            record.partitions,
            record.binding_keys,
            dict(record.arguments),
        )


@dataclass(frozen=True, slots=True)
class SuperStreamRecord:
    vhost: str
    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    arguments: Mapping[str, str]
    state: str
    created_ns: int
    version: int = 0

    def route(self, routing_key: str) -> list[str]:
        """The partitions bound with exactly ``routing_key``, in partition order (a direct
        exchange); empty when none is."""
        return [
            p for p, k in zip(self.partitions, self.binding_keys, strict=True) if k == routing_key
        ]

    def encode(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "partitions": list(self.partitions),
            "binding_keys": list(self.binding_keys),
            "arguments": dict(self.arguments),
            "state": self.state,
            "created_ns": self.created_ns,
        }

    @staticmethod
    def decode(value: bytes, version: int) -> SuperStreamRecord:
        data = json.loads(value)
        state = str(data["state"])
        if state not in STATES:
            raise ValueError(f"super stream state {state!r}")
        return SuperStreamRecord(
            vhost=str(data["vhost"]),
            name=str(data["name"]),
            partitions=tuple(str(p) for p in data["partitions"]),
            binding_keys=tuple(str(k) for k in data["binding_keys"]),
            arguments={str(k): str(v) for k, v in data["arguments"].items()},
            state=state,
            created_ns=int(data["created_ns"]),
            version=version,
        )


class SuperStreamCatalog:
    """The super-stream entries of one MetaStore (blocking calls: run them off the loop)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def get(self, vhost: str, name: str) -> SuperStreamRecord | None:
        stored = self.meta.get(super_stream_key(vhost, name))
        return None if stored is None else SuperStreamRecord.decode(stored.value, stored.version)

    def ready(self, vhost: str, name: str) -> SuperStreamRecord:
        """The entry, if it is ``ready`` (what Route and Partitions answer from)."""
        record = self.get(vhost, name)
        if record is None or record.state != READY:
            raise SuperStreamNotFoundError(f"no super stream {name!r} in vhost {vhost!r}")
        return record

    def list(self) -> list[SuperStreamRecord]:
        return [
            SuperStreamRecord.decode(v.value, v.version)
            for v in self.meta.list(SUPER_STREAM_PREFIX)
        ]

    def begin_create(self, definition: SuperStreamDefinition) -> tuple[SuperStreamRecord, bool]:
        """Write the entry ``creating``; (entry, resumed). ``resumed``: an entry of the
        same definition was left ``creating`` (a crash, or a creation that failed and could
        not roll back) and this creation takes it over. ``SuperStreamExistsError`` when the
        name is taken otherwise."""
        definition.check()
        record = SuperStreamRecord(
            vhost=definition.vhost,
            name=definition.name,
            partitions=definition.partitions,
            binding_keys=definition.binding_keys,
            arguments=dict(definition.arguments),
            state=CREATING,
            created_ns=time.time_ns(),
        )
        key = super_stream_key(definition.vhost, definition.name)
        try:
            stored = self.meta.create(key, record.encode())
        except AlreadyExistsError:
            existing = self.get(definition.vhost, definition.name)
            if existing is not None and existing.state == CREATING and definition.same_as(existing):
                return existing, True
            raise SuperStreamExistsError(
                f"super stream {definition.name!r} already exists in vhost {definition.vhost!r}"
            ) from None
        return replace(record, version=stored.version), False

    def mark(self, record: SuperStreamRecord, state: str) -> SuperStreamRecord:
        """Move the entry to ``state`` with a version-checked put: it fails
        (``SuperStreamNotFoundError``, ``VersionConflictError``) when another node changed or
        removed it meanwhile."""
        moved = replace(record, state=state)
        key = super_stream_key(record.vhost, record.name)
        try:
            stored = self.meta.put_if(key, moved.encode(), record.version, 0)
        except KeyDeletedError as exc:
            raise SuperStreamNotFoundError(f"super stream {record.name!r} was deleted") from exc
        return replace(moved, version=stored.version)

    def begin_delete(self, vhost: str, name: str) -> SuperStreamRecord:
        """The entry put ``deleting`` (whatever its state: a creation left half-way is
        deleted the same way). ``SuperStreamNotFoundError`` when there is none."""
        for _ in range(16):
            record = self.get(vhost, name)
            if record is None:
                raise SuperStreamNotFoundError(f"no super stream {name!r} in vhost {vhost!r}")
            if record.state == DELETING:
                return record
            try:
                return self.mark(record, DELETING)
            except VersionConflictError:
                continue
        raise VersionConflictError(f"super stream {name!r} keeps changing under us")

    def remove(self, record: SuperStreamRecord) -> None:
        """Delete the entry (idempotent: gone already is fine)."""
        with contextlib.suppress(NotFoundError):
            self.meta.delete(super_stream_key(record.vhost, record.name))


def partitions_for(
    name: str, count: int | None = None, binding_keys: Sequence[str] | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(partitions, binding keys) named as RabbitMQ's ``rabbitmq-streams
    add_super_stream`` names them (``rabbit_stream_utils``): ``count`` partitions
    ``{name}-0`` … bound with ``"0"`` …, or one partition ``{name}-{key}`` per binding
    key. Exactly one of the two; ``ConfigError`` otherwise."""
    if (count is None) == (binding_keys is None):
        raise ConfigError("give either a number of partitions or the binding keys")
    if binding_keys is not None:
        keys = tuple(str(k) for k in binding_keys)
        return tuple(f"{name}-{k}" for k in keys), keys
    assert count is not None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"the number of partitions must be a positive integer, not {count!r}")
    if count > MAX_PARTITIONS:
        raise ConfigError(f"{count} partitions: at most {MAX_PARTITIONS}")
    keys = tuple(str(i) for i in range(count))
    return tuple(f"{name}-{k}" for k in keys), keys


class PartitionIndexes:
    """Where a stream sits in a super stream, for single active consumer's ``super-stream``
    groups (``server/sac.py``'s ``PartitionLookup``). It answers on the event loop at
    Subscribe, so entries are read at most once per ``ttl`` seconds per super stream: a
    super stream's partitions change only when it is deleted and created again, and a
    stale answer for that moment only spreads the group's partitions differently."""

    def __init__(self, catalog: SuperStreamCatalog, ttl: float = 5.0) -> None:
        self.catalog = catalog
        self.ttl = ttl
        self._seen: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}

    def __call__(self, vhost: str, super_stream: str, stream: str) -> int | None:
        key = (vhost, super_stream)
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] > self.ttl:
            record = self.catalog.get(vhost, super_stream)
            ready = record is not None and record.state == READY
            seen = (now, record.partitions if ready and record is not None else ())
            if len(self._seen) >= 10_000:
                self._seen.clear()  # bounded: one entry per super stream looked up
            self._seen[key] = seen
        partitions = seen[1]
        return partitions.index(stream) if stream in partitions else None
