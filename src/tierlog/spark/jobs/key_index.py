"""``tierlog spark key-index``: build the key index files of every complete time window.

The driver walks each stream's committed manifest and plans one task per window of
``window_seconds`` (aligned to multiples of it) that is complete -- the manifest already
holds a chunk stamped at or after the window's end, and timestamps never go backwards -- and
has no index file yet. A task reads the window's fragments and writes the file with a
create-only put. So the job is incremental (only new windows are built) and idempotent (a
rerun, or a retried task, finds or writes the same file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierlog.remote.catalog import Catalog
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.key_index_files import build_window, list_index_files
from tierlog.spark.jobs.common import (
    Progress,
    RemoteTier,
    run_distributed,
    select_streams,
    walk_manifest,
)


@dataclass(frozen=True)
class WindowTask:
    stream: str  # display name, hashed into the keys
    incarnation: str
    window_start: int
    window_end: int
    fragments: list[FragmentEntry]


@dataclass
class KeyIndexReport:
    built: list[dict[str, Any]] = field(default_factory=list)
    skipped_existing: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"built": self.built, "skipped_existing": self.skipped_existing}


def plan_windows(
    stream: str,
    incarnation: str,
    fragments: list[FragmentEntry],
    window_ms: int,
    existing: set[int],
) -> list[WindowTask]:
    """Complete windows without an index file, each with the fragments it overlaps."""
    if not fragments:
        return []
    newest = max(f.max_timestamp for f in fragments)
    start = min(f.min_timestamp for f in fragments) // window_ms * window_ms
    tasks = []
    while start + window_ms <= newest:
        end = start + window_ms
        if start not in existing:
            inside = [f for f in fragments if f.max_timestamp >= start and f.min_timestamp < end]
            if inside:
                tasks.append(WindowTask(stream, incarnation, start, end, inside))
        start = end
    return tasks


def build_task(tier: RemoteTier, task: WindowTask) -> dict[str, Any]:
    with tier.open_store() as store:
        built = build_window(
            store,
            tier.prefix,
            task.incarnation,
            task.stream,
            task.fragments,
            task.window_start,
            task.window_end,
        )
    return {"key": built.key, "items": built.item_count, "stream": task.stream}


def run_key_index(
    spark: Any,
    tier: RemoteTier,
    streams: list[str] | None = None,
    *,
    vhost: str = "/",
    window_seconds: float = 3600.0,
    progress: Progress | None = None,
) -> KeyIndexReport:
    say = progress or Progress("key-index")
    window_ms = max(1, int(window_seconds * 1000))
    report = KeyIndexReport()
    tasks: list[WindowTask] = []
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        for record in select_streams(catalog, streams, vhost):
            walk = walk_manifest(store, catalog, tier.prefix, record.incarnation)
            existing = {
                f.window_start for f in list_index_files(store, tier.prefix, record.incarnation)
            }
            report.skipped_existing += len(existing)
            display = record.name if record.vhost == "/" else f"{record.vhost}/{record.name}"
            tasks += plan_windows(display, record.incarnation, walk.fragments, window_ms, existing)
    say(f"building {len(tasks)} window index file(s)")
    report.built = run_distributed(
        spark, tasks, lambda t: build_task(tier, t), "tierlog key-index: windows"
    )
    say(f"done: {len(report.built)} built")
    return report
