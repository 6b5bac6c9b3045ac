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

import functools
from dataclasses import dataclass, field
from typing import Any

from tierlog.errors import ConfigError
from tierlog.formats.key_index_manifest import WindowEntry
from tierlog.remote.catalog import Catalog
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.key_index_files import build_window
from tierlog.remote.key_index_manifest import KeyIndexManifestStore, add_windows, drop_expired
from tierlog.remote.key_lookup import stream_hash_name
from tierlog.remote.settings import StreamSettings
from tierlog.spark.jobs.common import (
    Progress,
    RemoteTier,
    run_distributed,
    select_streams,
    walk_manifest,
)
from tierlog.tiering.deletion import DEFAULT_GRACE_SECONDS, DeletionQueue


@dataclass(frozen=True)
class WindowTask:
    stream: str  # display name, hashed into the keys
    incarnation: str
    window_start: int
    window_end: int
    fragments: list[FragmentEntry]
    settings: StreamSettings = field(default_factory=StreamSettings)

    @property
    def next_offset(self) -> int:
        return max(f.next_offset for f in self.fragments)


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
            settings=task.settings,
        )
    return {
        "key": built.key,
        "items": built.item_count,
        "stream": task.stream,
        "incarnation": task.incarnation,
        "window": WindowEntry(
            task.window_start,
            task.window_end,
            built.slot_count,
            built.item_count,
            task.next_offset,
            built.key_block,
            built.frame_size,
        ).to_json(),
    }


def _same(settings: StreamSettings) -> StreamSettings:
    return settings


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
    tasks: list[WindowTask] = []
    indexes: dict[str, tuple[KeyIndexManifestStore, int]] = {}
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        for record in select_streams(catalog, streams, vhost):
            walk = walk_manifest(store, catalog, tier.prefix, record.incarnation)
            epoch = walk.pointer.epoch if walk.pointer is not None else 1
            settings = record.settings
            index = KeyIndexManifestStore(
                meta,
                store,
                tier.prefix,
                record.incarnation,
                epoch=max(1, epoch),
                settings=functools.partial(_same, settings),
            )
            committed = index.read().manifest
            lengths = {w.end - w.start for w in committed.windows}
            if lengths - {window_ms}:
                raise ConfigError(
                    f"{record.name}: its key index has windows of {sorted(lengths)} ms, "
                    f"not {window_ms} (pass the same --window as before)"
                )
            existing = {w.start for w in committed.windows}
            report.skipped_existing += len(existing)
            indexes[record.incarnation] = (index, walk.first_offset or 0)
            planned = plan_windows(
                stream_hash_name(record), record.incarnation, walk.fragments, window_ms, existing
            )
            tasks += [
                WindowTask(
                    t.stream, t.incarnation, t.window_start, t.window_end, t.fragments, settings
                )
                for t in planned
            ]
        say(f"building {len(tasks)} window index file(s)")
        report.built = run_distributed(
            spark, tasks, lambda t: build_task(tier, t), "tierlog key-index: windows"
        )
        deletions = DeletionQueue(meta, grace_seconds)
        for incarnation, (index, first_offset) in indexes.items():
            new = [
                WindowEntry.from_json(b["window"])
                for b in report.built
                if b["incarnation"] == incarnation
            ]
            before = len(index.read().manifest.windows) + len(new)

            def change(
                windows: tuple[WindowEntry, ...],
                new: list[WindowEntry] = new,
                first_offset: int = first_offset,
            ) -> list[WindowEntry]:
                return list(drop_expired(first_offset)(tuple(add_windows(new)(windows))))

            after = index.commit(change, deletions.schedule)
            report.expired += max(0, before - len(after.manifest.windows))
    say(f"done: {len(report.built)} built, {report.expired} expired")
    return report
