"""Building a stream's key index: plan the complete windows the key-index manifest does not
list yet, build each window file, commit them (and drop expired windows) in one manifest
commit. The Spark job (``tierlog spark key-index``) runs the builds as distributed tasks;
``index_stream`` runs them in this process (tests, small streams, the scale script).

A window ``[start, start + window)`` is complete once the stream's manifest holds a chunk
stamped at or after its end (timestamps never go backwards). All windows of one stream have
the same length: asking for another length is a ``ConfigError`` rather than overlapping
windows that would index records twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tierlog.errors import ConfigError
from tierlog.formats.key_index_manifest import WindowEntry
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.committed import read_committed_root
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.key_index_files import KeyOf, build_window, key_of_setting
from tierlog.remote.key_index_manifest import (
    CommittedIndex,
    KeyIndexManifestStore,
    add_windows,
    drop_expired,
)
from tierlog.remote.key_lookup import stream_hash_name
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.settings import StreamSettings
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore


@dataclass(frozen=True)
class WindowTask:
    """One window file to build (picklable: Spark ships it to an executor)."""

    stream: str  # the name keys are hashed with
    incarnation: str
    window_start: int
    window_end: int
    fragments: list[FragmentEntry]
    settings: StreamSettings = field(default_factory=StreamSettings)

    @property
    def next_offset(self) -> int:
        return max(f.next_offset for f in self.fragments)


def plan_windows(
    stream: str,
    incarnation: str,
    fragments: list[FragmentEntry],
    window_ms: int,
    existing: set[int],
    settings: StreamSettings | None = None,
) -> list[WindowTask]:
    """Complete windows not in ``existing``, each with the fragments it overlaps."""
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
                tasks.append(
                    WindowTask(
                        stream, incarnation, start, end, inside, settings or StreamSettings()
                    )
                )
        start = end
    return tasks


def build_task(
    store: ObjectStore, prefix: str, task: WindowTask, key_of: KeyOf | None = None
) -> WindowEntry:
    """Build (or find, from an earlier run) the window file of ``task``, keyed by the
    stream's ``index_key`` unless ``key_of`` is given."""
    if key_of is None:
        key_of = key_of_setting(task.settings.index_key)
    built = build_window(
        store,
        prefix,
        task.incarnation,
        task.stream,
        task.fragments,
        task.window_start,
        task.window_end,
        key_of,
        settings=task.settings,
    )
    return WindowEntry(
        task.window_start,
        task.window_end,
        built.slot_count,
        built.item_count,
        task.next_offset,
        built.key_block,
        built.frame_size,
        task.settings.index_key,
    )


@dataclass
class StreamPlan:
    """What building one stream's index needs: its manifest store, the committed index,
    the stream's first offset (retention) and the windows to build."""

    index: KeyIndexManifestStore
    committed: CommittedIndex
    first_offset: int
    tasks: list[WindowTask]


def committed_fragments(
    catalog: Catalog, store: ObjectStore, prefix: str, incarnation: str
) -> tuple[int, int, list[FragmentEntry]]:
    """``(pointer epoch, first offset, fragments)`` of the committed manifest."""
    pointer, data = read_committed_root(catalog, store, prefix, incarnation)
    if pointer is None or data is None:
        return (pointer.epoch if pointer else 1), 0, []
    tree = ManifestTree.from_root(data, prefix, sealed=pointer.sealed)
    fragments = [loc.entry for loc in tree.iter_fragments(store.get)]
    return pointer.epoch, tree.first_offset, fragments


def plan_stream(
    meta: MetaStore,
    store: ObjectStore,
    prefix: str,
    record: StreamRecord,
    window_ms: int,
    *,
    epoch: int,
    first_offset: int,
    fragments: list[FragmentEntry],
) -> StreamPlan:
    """The windows of ``record`` to build, against its key-index manifest."""
    settings = record.settings
    index = KeyIndexManifestStore(
        meta,
        store,
        prefix,
        record.incarnation,
        epoch=max(1, epoch),
        settings=lambda: settings,
    )
    committed = index.read()
    lengths = {w.end - w.start for w in committed.manifest.windows}
    if lengths - {window_ms}:
        raise ConfigError(
            f"{record.name}: its key index has windows of {sorted(lengths)} ms, "
            f"not {window_ms} (pass the same window length as before)"
        )
    existing = {w.start for w in committed.manifest.windows}
    # the key index is built from fragments: a segment-mode stream has none to index
    fragments = [f for f in fragments if not f.is_segment]
    tasks = plan_windows(
        stream_hash_name(record), record.incarnation, fragments, window_ms, existing, settings
    )
    return StreamPlan(index, committed, first_offset, tasks)


def commit_windows(
    plan: StreamPlan, built: list[WindowEntry], schedule: Callable[[Iterable[str]], None]
) -> tuple[CommittedIndex, int]:
    """Commit ``built`` windows and drop the expired ones in one manifest commit;
    ``(committed index, windows dropped)``."""

    def change(windows: tuple[WindowEntry, ...]) -> list[WindowEntry]:
        return list(drop_expired(plan.first_offset)(tuple(add_windows(built)(windows))))

    before = {w.start for w in plan.index.read().manifest.windows} | {w.start for w in built}
    after = plan.index.commit(change, schedule)
    return after, len(before - {w.start for w in after.manifest.windows})


def index_stream(
    meta: MetaStore,
    store: ObjectStore,
    prefix: str,
    vhost: str,
    name: str,
    window_ms: int,
    schedule: Callable[[Iterable[str]], None],
    key_of: KeyOf | None = None,
) -> tuple[CommittedIndex, int, int]:
    """Build every missing complete window of one stream in this process and commit them;
    ``(committed index, windows built, windows dropped)``."""
    catalog = Catalog(meta)
    record = catalog.require(vhost, name)
    epoch, first, fragments = committed_fragments(catalog, store, prefix, record.incarnation)
    plan = plan_stream(
        meta, store, prefix, record, window_ms, epoch=epoch, first_offset=first, fragments=fragments
    )
    built = [build_task(store, prefix, task, key_of) for task in plan.tasks]
    committed, dropped = commit_windows(plan, built, schedule)
    return committed, len(built), dropped
