"""``tierlog spark key-index`` (alias ``index``): build the key index files of every
complete time window and record them in each stream's key-index manifest.

The driver walks each stream's committed manifest and plans one task per window of
``window_seconds`` (aligned to multiples of it) that is complete -- the manifest already
holds a chunk stamped at or after the window's end, and timestamps never go backwards -- and
is not in the stream's key-index manifest yet. A task reads the window's fragments and writes
the file with a create-only put (sealed when the stream is encrypted). The driver then commits
the new windows to the key-index manifest (compare-and-swap on the pointer under the stream's
writer epoch) and, in the same commit, drops the windows whose records are all past the
stream's retention; their files and the superseded manifest go through the grace-period
deletion queue. So the job is incremental (only new windows are built) and idempotent (a
rerun finds every window listed; a file left by a run that died before its commit is found
and reused, its key block included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierlog.formats.key_index_manifest import WindowEntry
from tierlog.remote.catalog import Catalog
from tierlog.remote.key_index_build import (
    StreamPlan,
    WindowTask,
    build_task,
    commit_windows,
    plan_stream,
    plan_windows,
)
from tierlog.spark.jobs.common import (
    Progress,
    RemoteTier,
    run_distributed,
    select_streams,
    walk_manifest,
)
from tierlog.tiering.deletion import DEFAULT_GRACE_SECONDS, DeletionQueue

__all__ = ["KeyIndexReport", "WindowTask", "plan_windows", "run_key_index"]


@dataclass
class KeyIndexReport:
    built: list[dict[str, Any]] = field(default_factory=list)
    skipped_existing: int = 0
    expired: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "built": self.built,
            "skipped_existing": self.skipped_existing,
            "expired": self.expired,
        }


def _build(tier: RemoteTier, task: WindowTask) -> dict[str, Any]:
    with tier.open_store() as store:
        window = build_task(store, tier.prefix, task)
    return {
        "items": window.items,
        "stream": task.stream,
        "incarnation": task.incarnation,
        "window": window.to_json(),
    }


def run_key_index(
    spark: Any,
    tier: RemoteTier,
    streams: list[str] | None = None,
    *,
    vhost: str = "/",
    window_seconds: float = 3600.0,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    progress: Progress | None = None,
) -> KeyIndexReport:
    say = progress or Progress("key-index")
    window_ms = max(1, int(window_seconds * 1000))
    report = KeyIndexReport()
    plans: dict[str, StreamPlan] = {}
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        for record in select_streams(catalog, streams, vhost):
            walk = walk_manifest(store, catalog, tier.prefix, record.incarnation)
            plan = plan_stream(
                meta,
                store,
                tier.prefix,
                record,
                window_ms,
                epoch=walk.pointer.epoch if walk.pointer is not None else 1,
                first_offset=walk.first_offset or 0,
                fragments=walk.fragments,
            )
            report.skipped_existing += len(plan.committed.manifest.windows)
            plans[record.incarnation] = plan
        tasks = [task for plan in plans.values() for task in plan.tasks]
        say(f"building {len(tasks)} window index file(s)")
        report.built = run_distributed(
            spark, tasks, lambda t: _build(tier, t), "tierlog key-index: windows"
        )
        deletions = DeletionQueue(meta, grace_seconds)
        for incarnation, plan in plans.items():
            built = [
                WindowEntry.from_json(b["window"])
                for b in report.built
                if b["incarnation"] == incarnation
            ]
            _, dropped = commit_windows(plan, built, deletions.schedule)
            report.expired += dropped
    say(f"done: {len(report.built)} built, {report.expired} expired")
    return report
