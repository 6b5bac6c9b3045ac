"""Garbage collection of one stream incarnation: the I/O around the rule of
``remote/gc.py``, shared by the server's scheduled collection (``server/gc_service.py``)
and ``tierlog spark gc`` (one Spark task per incarnation).

For one incarnation it

1. walks the committed manifest, if the incarnation is live (in the catalog): the root
   the pointer names, every branch, every fragment;
2. lists the incarnation's objects, page by page, keeping only the candidates (objects
   the rule would delete were nothing pending), at most ``max_candidates`` of them (the
   rest waits for the next collection);
3. reads the pending-deletion queue and the in-flight offload attempts *after* listing,
   so anything trimmed or recorded meanwhile is either in the manifest it read or pending;
4. deletes (with ``apply``) the candidates still garbage, in batches, through the
   ``Pacer`` (its rate limit), and aborts the incomplete multipart uploads older than the
   grace period.

A live incarnation whose manifest cannot be read completely (missing or corrupt root or
branch) is left alone and reported: nothing is deleted on doubt. A live incarnation
without a pointer (deleted during the collection, or never committed) is left to stream
cleanup.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierlog.remote import keys
from tierlog.remote.catalog import Catalog
from tierlog.remote.gc import GcView, Verdict, judge, uploads_to_abort
from tierlog.remote.manifest_check import walk_manifest
from tierlog.storage.errors import UnsupportedBackendError
from tierlog.storage.object_store import ObjectMeta, ObjectStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.rate_limit import RateLimiter

DELETE_BATCH = 1000
MAX_CANDIDATES = 100_000
"""Candidates one collection of one incarnation keeps in memory (the rest waits for the
next collection: a collection's memory is bounded whatever was leaked)."""


@dataclass
class IncarnationGc:
    """What one collection found (and deleted) in one incarnation."""

    incarnation: str
    live: bool
    objects: int = 0
    counts: dict[Verdict, int] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    garbage_bytes: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    uploads_aborted: int = 0
    stale_uploads: list[str] = field(default_factory=list)
    truncated: bool = False
    skipped_reason: str | None = None
    problems: list[dict[str, str]] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        return self.counts.get(verdict, 0)

    @property
    def referenced(self) -> int:
        return self.count(Verdict.REFERENCED)

    @property
    def pending(self) -> int:
        return self.count(Verdict.PENDING)

    @property
    def protected_tail(self) -> int:
        return self.count(Verdict.PROTECTED_TAIL)

    @property
    def in_flight(self) -> int:
        return self.count(Verdict.IN_FLIGHT)

    @property
    def young(self) -> int:
        return self.count(Verdict.YOUNG)

    def to_dict(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,
            "live": self.live,
            "objects": self.objects,
            "referenced": self.referenced,
            "pending_deletion": self.pending,
            "protected_tail": self.protected_tail,
            "offload_in_flight": self.in_flight,
            "younger_than_grace": self.young,
            "unknown_keys": self.unknown,
            "garbage": self.garbage,
            "garbage_bytes": self.garbage_bytes,
            "deleted": self.deleted,
            "stale_multipart_uploads": self.stale_uploads,
            "uploads_aborted": self.uploads_aborted,
            "truncated": self.truncated,
            "skipped": self.skipped_reason,
            "problems": self.problems,
        }


class Pacer:
    """Deletes in batches of at most ``batch`` keys, at most ``per_second`` keys a second
    on average (0: unlimited), so a large collection does not crowd out the writers'
    requests to the same store; stops between batches once ``stopping()`` is true (a
    server shutting down does not wait for a long collection)."""

    def __init__(
        self,
        per_second: float = 0.0,
        batch: int = DELETE_BATCH,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.batch = max(1, batch)
        self.limiter = RateLimiter(per_second) if per_second > 0 else None
        self.stopping = stopping

    def delete(self, store: ObjectStore, keys_: list[str]) -> int:
        """Delete ``keys_`` in order; returns how many were deleted."""
        done = 0
        for i in range(0, len(keys_), self.batch):
            if self.stopping():
                break
            part = keys_[i : i + self.batch]
            if self.limiter is not None:
                self.limiter.acquire(len(part))
            store.delete_many(part)
            done += len(part)
        return done


def discover_incarnations(store: ObjectStore, streams_root: str) -> list[str]:
    """Every incarnation directory with at least one object: one short listing per
    incarnation, skipping over its keys (``/`` sorts right before ``0``)."""
    found: list[str] = []
    after: str | None = None
    while True:
        first = next(iter(store.list(streams_root, start_after=after)), None)
        if first is None:
            return found
        incarnation = first.key[len(streams_root) :].split("/", 1)[0]
        if incarnation and incarnation not in found:
            found.append(incarnation)
        after = f"{streams_root}{incarnation}0"


def streams_root(prefix: str) -> str:
    """``{prefix}/stream/``: where every incarnation's objects live."""
    base = prefix.strip("/")
    return f"{base}/stream/" if base else "stream/"


def collect_incarnation(
    store: ObjectStore,
    catalog: Catalog,
    prefix: str,
    incarnation: str,
    *,
    live: bool,
    grace_seconds: float,
    now: Callable[[], float],
    apply: bool,
    pacer: Pacer | None = None,
    max_candidates: int = MAX_CANDIDATES,
) -> IncarnationGc:
    """Find (and with ``apply`` delete) one incarnation's garbage; see the module
    docstring. ``now`` is read once, after the walk (an object written during the walk is
    younger than the grace period)."""
    result = IncarnationGc(incarnation, live)
    referenced: frozenset[str] = frozenset()
    tail_from: int | None = None
    if live:
        walk = walk_manifest(store, catalog, prefix, incarnation)
        if walk.pointer is None:
            result.skipped_reason = "no manifest pointer (stream deleted or not yet committed)"
            return result
        if not walk.complete:
            result.skipped_reason = "manifest unreadable: nothing deleted (run scrub)"
            result.problems = walk.problems
            return result
        referenced = frozenset(walk.referenced())
        tail_from = walk.next_offset
    at = now()
    view = GcView(prefix, live, referenced, frozenset(), frozenset(), tail_from, at, grace_seconds)
    candidates: list[ObjectMeta] = []
    for obj in store.list(keys.stream_prefix(prefix, incarnation)):
        result.objects += 1
        verdict = judge(obj, view)
        if verdict is Verdict.GARBAGE:
            candidates.append(obj)
            if len(candidates) >= max_candidates:
                result.truncated = True
                break
            continue
        result.counts[verdict] = result.count(verdict) + 1
        if verdict is Verdict.UNKNOWN:
            result.unknown.append(obj.key)
    # after listing: whatever was trimmed or recorded meanwhile is pending or in flight
    meta = catalog.meta
    pending = frozenset(key for key, _due in DeletionQueue(meta).pending_keys())
    in_flight = frozenset(
        record.key.rsplit("/", 1)[-1]
        for record in meta.list(keys.offload_attempts_prefix(incarnation))
    )
    view = GcView(prefix, live, referenced, pending, in_flight, tail_from, at, grace_seconds)
    sizes: list[int] = []
    for obj in candidates:
        verdict = judge(obj, view)
        result.counts[verdict] = result.count(verdict) + 1
        if verdict is Verdict.GARBAGE:
            result.garbage.append(obj.key)
            sizes.append(obj.size)
    result.garbage_bytes = sum(sizes)
    if apply and result.garbage:
        result.deleted = (pacer or Pacer()).delete(store, result.garbage)
        result.deleted_bytes = sum(sizes[: result.deleted])
    with contextlib.suppress(UnsupportedBackendError):  # a store without multipart uploads
        uploads = store.list_multipart_uploads(keys.stream_prefix(prefix, incarnation))
        for upload in list(uploads_to_abort(uploads, at, grace_seconds)):
            result.stale_uploads.append(upload.key)
            if apply:
                store.abort_multipart(upload.key, upload.upload_id)
                result.uploads_aborted += 1
    return result
