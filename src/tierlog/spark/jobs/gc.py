"""``tierlog spark gc``: delete remote objects that no live manifest references.

One Spark task per stream incarnation found in the store (or in the catalog). A task

1. walks the incarnation's committed manifest, if the incarnation is live (in the
   catalog): the root the pointer names, every branch, every fragment;
2. lists the incarnation's objects;
3. reads the pending-deletion queue (after listing, so anything trimmed meanwhile is
   either still in the manifest it read or pending);
4. deletes (with ``apply``; otherwise only reports) every object that is *not*
   referenced by that manifest, not the live root, not pending deletion, older than
   the grace period, and -- for a live incarnation -- not a fragment at or after its
   committed next offset (a restarting writer may be about to adopt it).

A live incarnation whose manifest cannot be read completely (missing or corrupt root or
branch) is left alone and reported: gc never deletes on doubt. Keys that are not
fragment, root or branch keys are reported as ``unknown`` and kept. Incarnations no
longer in the catalog (deleted streams) have no live manifest: everything older than the
grace period goes. The grace period must exceed the longest time a writer may take
between uploading an object and committing the root that names it, and the longest
gc run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tierlog.remote import keys
from tierlog.remote.catalog import Catalog
from tierlog.spark.jobs.common import Progress, RemoteTier, chunked, run_distributed, walk_manifest
from tierlog.storage.errors import InvalidKeyError
from tierlog.storage.object_store import ObjectStore
from tierlog.tiering.deletion import DeletionQueue

DEFAULT_GRACE_SECONDS = 24 * 3600.0
DELETE_BATCH = 1000


@dataclass(frozen=True)
class GcTask:
    incarnation: str
    live: bool
    grace_seconds: float
    now: float
    apply: bool


@dataclass
class IncarnationGc:
    incarnation: str
    live: bool
    objects: int = 0
    referenced: int = 0
    pending: int = 0
    protected_tail: int = 0
    in_flight: int = 0
    young: int = 0
    unknown: list[str] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    deleted: int = 0
    skipped_reason: str | None = None
    problems: list[dict[str, str]] = field(default_factory=list)

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
            "deleted": self.deleted,
            "skipped": self.skipped_reason,
            "problems": self.problems,
        }


@dataclass
class GcReport:
    applied: bool
    grace_seconds: float
    incarnations: list[IncarnationGc]

    @property
    def garbage(self) -> list[str]:
        return [k for i in self.incarnations for k in i.garbage]

    @property
    def ok(self) -> bool:
        return not any(i.problems or i.skipped_reason for i in self.incarnations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": "gc",
            "applied": self.applied,
            "grace_seconds": self.grace_seconds,
            "garbage": len(self.garbage),
            "deleted": sum(i.deleted for i in self.incarnations),
            "ok": self.ok,
            "incarnations": [i.to_dict() for i in self.incarnations],
        }


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


def gc_incarnation(tier: RemoteTier, task: GcTask) -> IncarnationGc:
    """Task body: find (and with ``apply`` delete) one incarnation's garbage."""
    result = IncarnationGc(task.incarnation, task.live)
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        referenced: set[str] = set()
        tail_from: int | None = None
        if task.live:
            walk = walk_manifest(store, catalog, tier.prefix, task.incarnation)
            if walk.pointer is None:
                result.skipped_reason = "stream deleted during gc (left to stream cleanup)"
                return result
            if not walk.complete:
                result.skipped_reason = "manifest unreadable: nothing deleted (run scrub)"
                result.problems = walk.problems
                return result
            referenced = walk.referenced()
            tail_from = walk.next_offset
        listed = list(store.list(keys.stream_prefix(tier.prefix, task.incarnation)))
        pending = {key for key, _due in DeletionQueue(meta).pending_keys()}
        # objects of segment offloads in flight (recorded, not yet committed) are spared
        in_flight = {
            record.key.rsplit("/", 1)[-1]
            for record in meta.list(keys.offload_attempts_prefix(task.incarnation))
        }
        for meta_obj in listed:
            key = meta_obj.key
            result.objects += 1
            try:
                parsed = keys.parse_key(key, tier.prefix)
            except InvalidKeyError:
                result.unknown.append(key)
                continue
            if key in referenced:
                result.referenced += 1
            elif key in pending:
                result.pending += 1
            elif (
                isinstance(parsed, keys.SegmentKey)
                and f"{parsed.first_offset:020d}.{parsed.uuid.hex}" in in_flight
            ):
                result.in_flight += 1
            elif (
                tail_from is not None
                and isinstance(parsed, keys.FragmentKey)
                and parsed.first_offset >= tail_from
            ):
                result.protected_tail += 1
            elif (
                meta_obj.last_modified is None
                or task.now - meta_obj.last_modified < task.grace_seconds
            ):
                result.young += 1
            else:
                result.garbage.append(key)
        if task.apply:
            for batch in chunked(result.garbage, DELETE_BATCH):
                store.delete_many(batch)
                result.deleted += len(batch)
    return result


def run_gc(
    spark: Any,
    tier: RemoteTier,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    apply: bool = False,
    progress: Progress | None = None,
    now: float | None = None,
) -> GcReport:
    """Collect garbage across every stream of the store (dry run unless ``apply``)."""
    if grace_seconds < 0:
        raise ValueError("grace_seconds must be >= 0")
    say = progress or Progress("gc")
    now = time.time() if now is None else now
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        live = {r.incarnation for r in catalog.list()}
        say(f"{len(live)} live stream(s); looking for incarnations under {tier.streams_root}")
        found = discover_incarnations(store, tier.streams_root)
    names = sorted(set(found) | live)
    tasks = [GcTask(n, n in live, grace_seconds, now, apply) for n in names]
    action = "deleting" if apply else "dry run: finding"
    say(f"{action} garbage of {len(tasks)} incarnation(s), one task each")
    results = run_distributed(
        spark, tasks, lambda task: gc_incarnation(tier, task), "tierlog gc: incarnations"
    )
    report = GcReport(apply, grace_seconds, results)
    verb = "deleted" if apply else "would delete"
    say(f"done: {verb} {len(report.garbage)} object(s)")
    return report
