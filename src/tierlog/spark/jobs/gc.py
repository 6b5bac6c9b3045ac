"""``tierlog spark gc``: delete remote objects that no live manifest references.

The server collects its own garbage on a schedule (``tier.gc_*``, on by default); this job
runs the same collection (``tiering/gc.py``, the rule in ``remote/gc.py``) across a whole
store from Spark, e.g. for a store whose servers are gone. One Spark task per stream
incarnation found in the store (or in the catalog). A task

1. walks the incarnation's committed manifest, if the incarnation is live (in the
   catalog): the root the pointer names, every branch, every fragment;
2. lists the incarnation's objects;
3. reads the pending-deletion queue (after listing, so anything trimmed meanwhile is
   either still in the manifest it read or pending);
4. deletes (with ``apply``; otherwise only reports) every object that is *not*
   referenced by that manifest, not the live root, not pending deletion, older than
   the grace period, and -- for a live incarnation -- not a fragment at or after its
   committed next offset (a restarting writer may be about to adopt it); and aborts the
   incarnation's incomplete multipart uploads older than the grace period.

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
from dataclasses import dataclass
from typing import Any

from tierlog.remote.catalog import Catalog
from tierlog.spark.jobs.common import Progress, RemoteTier, run_distributed
from tierlog.tiering.gc import (
    DELETE_BATCH,
    IncarnationGc,
    Pacer,
    collect_incarnation,
)
from tierlog.tiering.gc import (
    discover_incarnations as discover_incarnations,  # re-exported (the soak's oracle)
)

DEFAULT_GRACE_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class GcTask:
    incarnation: str
    live: bool
    grace_seconds: float
    now: float
    apply: bool


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
            "uploads_aborted": sum(i.uploads_aborted for i in self.incarnations),
            "ok": self.ok,
            "incarnations": [i.to_dict() for i in self.incarnations],
        }


def gc_incarnation(tier: RemoteTier, task: GcTask) -> IncarnationGc:
    """Task body: find (and with ``apply`` delete) one incarnation's garbage, by the rule
    the server's own collection runs (``tiering/gc.py``)."""
    with tier.open_meta() as meta, tier.open_store() as store:
        return collect_incarnation(
            store,
            Catalog(meta),
            tier.prefix,
            task.incarnation,
            live=task.live,
            grace_seconds=task.grace_seconds,
            now=lambda: task.now,
            apply=task.apply,
            pacer=Pacer(batch=DELETE_BATCH),
        )


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
