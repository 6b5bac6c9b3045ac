"""Consumer offsets kept in the MetaStore, for a stream no live member can store them for.

Normally a consumer's StoreOffset goes into the stream's own log (a tracking chunk, as in
RabbitMQ), which only the stream's writer can append to. A node that serves the stream
read-only (read anywhere, a retired node's streams) keeps them here instead, under one key
per stream incarnation and consumer reference, so consumers keep their place across a
retirement and a later writer can take them over.

When a writer opens the stream it takes the values over into its log and marks them
``taken_at`` (the log's next offset after them): from the moment the remote tier holds that
offset, the log's tracking state is the newer answer; a later store here clears the mark.

Each value carries the writer epoch of the stream's committed manifest when it was stored.
Offsets only go up within one epoch (a lower one is ignored: an older, reordered store),
and a value stored under a newer epoch replaces one of an older epoch (the MetaStore's
epoch check refuses the reverse), so a node that saw an older writer cannot overwrite what
was stored under a newer one.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from urllib.parse import quote, unquote

from tierlog.storage.errors import (
    AlreadyExistsError,
    EpochFencedError,
    KeyDeletedError,
    NotFoundError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore

ATTEMPTS = 16


def offsets_prefix(incarnation: str) -> str:
    return f"offsets/{quote(incarnation, safe='')}/"


def offset_key(incarnation: str, reference: str) -> str:
    return offsets_prefix(incarnation) + quote(reference, safe="")


@dataclass(frozen=True, slots=True)
class StoredOffset:
    offset: int
    epoch: int
    version: int
    taken_at: int | None = None
    """Set once a writer wrote the offset into its log: the log's next offset after it."""


def _decode(value: bytes, version: int, epoch: int) -> StoredOffset:
    data = json.loads(value)
    taken = data.get("taken_at")
    return StoredOffset(int(data["offset"]), epoch, version, None if taken is None else int(taken))


class ConsumerOffsets:
    """Consumer offsets of stream incarnations in the MetaStore."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def query(self, incarnation: str, reference: str) -> StoredOffset | None:
        stored = self.meta.get(offset_key(incarnation, reference))
        if stored is None:
            return None
        return _decode(stored.value, stored.version, stored.epoch)

    def store(self, incarnation: str, reference: str, offset: int, epoch: int) -> bool:
        """Store ``offset`` under writer ``epoch``; False when a value at least as new is
        there already (a higher epoch, or the same epoch and a higher offset)."""
        if offset < 0 or epoch < 0:
            raise ValueError(f"offset and epoch must be >= 0, got {offset}, {epoch}")
        key = offset_key(incarnation, reference)
        value = json.dumps({"offset": offset}).encode()
        for _ in range(ATTEMPTS):
            current = self.meta.get(key)
            if current is None:
                try:
                    self.meta.create(key, value, epoch=epoch)
                    return True
                except AlreadyExistsError:
                    continue
            known = _decode(current.value, current.version, current.epoch)
            if known.epoch > epoch or (known.epoch == epoch and known.offset >= offset):
                return False
            try:
                self.meta.put_if(key, value, current.version, epoch)
                return True
            except (VersionConflictError, KeyDeletedError):
                continue
            except EpochFencedError:
                return False
        raise VersionConflictError(f"consumer offset {reference!r} keeps changing under us")

    def list(self, incarnation: str) -> dict[str, StoredOffset]:
        prefix = offsets_prefix(incarnation)
        return {
            unquote(v.key[len(prefix) :]): _decode(v.value, v.version, v.epoch)
            for v in self.meta.list(prefix)
        }

    def mark_taken(self, incarnation: str, stored: StoredOffset, reference: str, at: int) -> bool:
        """Record that a writer took ``stored`` over into its log, whose next offset after
        it is ``at``; False if the value changed meanwhile (a newer store: keep it)."""
        value = json.dumps({"offset": stored.offset, "taken_at": at}).encode()
        try:
            self.meta.put_if(
                offset_key(incarnation, reference), value, stored.version, stored.epoch
            )
            return True
        except (VersionConflictError, KeyDeletedError, EpochFencedError):
            return False

    def remove(self, incarnation: str, reference: str, version: int) -> bool:
        """Delete a value unless it changed since (False then)."""
        try:
            self.meta.delete(offset_key(incarnation, reference), expected_version=version)
            return True
        except (NotFoundError, VersionConflictError):
            return False

    def remove_all(self, incarnation: str) -> builtins.list[str]:
        """Delete every value of an incarnation (its stream was deleted)."""
        removed = []
        for reference, stored in self.list(incarnation).items():
            if self.remove(incarnation, reference, stored.version):
                removed.append(reference)
        return removed
