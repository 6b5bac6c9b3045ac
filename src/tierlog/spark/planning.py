"""Plan a read of the remote tier straight from the committed manifest (no Spark in here).

``plan_stream`` reads the catalog pointer and the root it names, then walks the manifest
tree top-down, descending only into branches whose offset and timestamp ranges overlap the
wanted ``Bounds`` (entries are tested a whole node at a time with numpy); ``coalesce``
groups consecutive fragments into ``ReadTask``\\ s of about a target size, which become Spark
input partitions. Everything here is picklable plain data, reused by the batch source, the
streaming source and the Spark jobs.

Offsets are record offsets; timestamps are chunk timestamps in ms since the epoch (what the
manifest and the chunk headers hold). A read covers the committed manifest's
``[first, next)`` as of planning time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tierlog.formats.manifest import KIND_BRANCH, decode_node
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.committed import read_committed_root
from tierlog.remote.errors import ManifestCorruptError
from tierlog.remote.keys import branch_key, fragment_key
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.spark import connections
from tierlog.spark.errors import StreamUnavailableError
from tierlog.spark.options import SourceOptions, StreamName
from tierlog.storage.object_store import ObjectStore

Loader = Callable[[str], bytes]


@dataclass(frozen=True, slots=True)
class Bounds:
    """Inclusive bounds on record offset and chunk timestamp (ms); None means unbounded."""

    min_offset: int | None = None
    max_offset: int | None = None
    min_ts: int | None = None
    max_ts: int | None = None

    def intersect(self, other: Bounds) -> Bounds:
        return Bounds(
            _max(self.min_offset, other.min_offset),
            _min(self.max_offset, other.max_offset),
            _max(self.min_ts, other.min_ts),
            _min(self.max_ts, other.max_ts),
        )

    @property
    def is_empty(self) -> bool:
        return (
            self.min_offset is not None
            and self.max_offset is not None
            and self.min_offset > self.max_offset
        ) or (self.min_ts is not None and self.max_ts is not None and self.min_ts > self.max_ts)

    def covers(self, fragment: PlannedFragment) -> bool:
        """True when every record of ``fragment`` is inside the bounds (no row filter)."""
        return (
            (self.min_offset is None or self.min_offset <= fragment.first_offset)
            and (self.max_offset is None or self.max_offset >= fragment.next_offset - 1)
            and (self.min_ts is None or self.min_ts <= fragment.min_timestamp)
            and (self.max_ts is None or self.max_ts >= fragment.max_timestamp)
        )


def offset_bounds(start: int | None, end: int | None) -> Bounds:
    """Bounds for the offsets ``[start, end)`` (end exclusive, as options give it)."""
    return Bounds(min_offset=start, max_offset=None if end is None else end - 1)


def timestamp_bounds(start: int | None, end: int | None) -> Bounds:
    """Bounds for the chunk timestamps ``[start, end)`` in ms (end exclusive)."""
    return Bounds(min_ts=start, max_ts=None if end is None else end - 1)


@dataclass(frozen=True, slots=True)
class PlannedFragment:
    """One fragment object to read: its key and what the manifest says about it."""

    key: str
    first_offset: int
    next_offset: int
    min_timestamp: int
    max_timestamp: int
    data_size: int
    chunk_count: int


@dataclass(frozen=True, slots=True)
class ReadTask:
    """Consecutive fragments of one stream read by one task, with the rows to keep."""

    stream: str  # the stream column's value
    incarnation: str
    fragments: tuple[PlannedFragment, ...]
    bounds: Bounds

    @property
    def data_size(self) -> int:
        return sum(f.data_size for f in self.fragments)


@dataclass(slots=True)
class StreamPlan:
    """What planning found for one stream: the committed range and the fragments to read."""

    stream: str
    incarnation: str
    first_offset: int
    next_offset: int
    total_fragments: int
    fragments: list[PlannedFragment] = field(default_factory=list)
    branch_loads: int = 0


def load_tree(catalog: Catalog, store: ObjectStore, prefix: str, incarnation: str) -> ManifestTree:
    """The committed manifest of ``incarnation`` (an empty tree before the first commit).

    A 404 on the root means a newer commit superseded it and it was deleted after the
    grace period: the pointer is read again.
    """
    pointer, data = read_committed_root(catalog, store, prefix, incarnation)
    if pointer is None:
        raise StreamUnavailableError(f"stream incarnation {incarnation} was deleted")
    if data is None:
        return ManifestTree(prefix, incarnation)
    return ManifestTree.from_root(data, prefix)


def resolve_stream(catalog: Catalog, vhost: str, name: str) -> StreamRecord:
    record = catalog.get(vhost, name)
    if record is None:
        raise StreamUnavailableError(f"no stream {name!r} in vhost {vhost!r}")
    return record


def plan_stream(
    stream: str, tree: ManifestTree, load: Loader, bounds: Bounds = Bounds()
) -> StreamPlan:
    """Every fragment of ``tree`` that may hold a record inside ``bounds``, in offset order."""
    header = tree.header()
    plan = StreamPlan(
        stream=stream,
        incarnation=tree.stream_dir,
        first_offset=tree.first_offset,
        next_offset=tree.next_offset,
        total_fragments=header.total_fragments,
    )
    if tree.is_empty or bounds.is_empty:
        return plan
    walker = _Walker(tree.prefix, tree.stream_dir, load, bounds)
    plan.fragments = list(walker.walk(tree.root_entries(), tree.next_offset))
    plan.branch_loads = walker.loads
    return plan


class _Walker:
    def __init__(self, prefix: str, stream_dir: str, load: Loader, bounds: Bounds) -> None:
        self.prefix = prefix
        self.stream_dir = stream_dir
        self.load = load
        self.bounds = bounds
        self.loads = 0

    def walk(self, entries: np.ndarray, node_next: int) -> Iterator[PlannedFragment]:
        if not len(entries):
            return
        first = entries["first_offset"].astype(np.int64)
        nexts = np.append(first[1:], np.int64(node_next))
        keep = np.ones(len(entries), dtype=bool)
        b = self.bounds
        if b.min_offset is not None:
            keep &= nexts > b.min_offset
        if b.max_offset is not None:
            keep &= first <= b.max_offset
        if b.min_ts is not None:
            keep &= entries["max_timestamp"] >= b.min_ts
        if b.max_ts is not None:
            keep &= entries["min_timestamp"] <= b.max_ts
        for i in np.flatnonzero(keep).tolist():
            row = entries[i]
            height = int(row["height"])
            if height == 0:
                start = int(first[i])
                yield PlannedFragment(
                    key=fragment_key(self.prefix, self.stream_dir, start),
                    first_offset=start,
                    next_offset=int(nexts[i]),
                    min_timestamp=int(row["min_timestamp"]),
                    max_timestamp=int(row["max_timestamp"]),
                    data_size=int(row["data_size"]),
                    chunk_count=int(row["chunk_count"]),
                )
            else:
                yield from self._branch(row, int(first[i]), int(nexts[i]), height)

    def _branch(self, row: np.void, first: int, nxt: int, height: int) -> Iterator[PlannedFragment]:
        uid = bytes(row["uid"].tobytes())
        key = branch_key(self.prefix, self.stream_dir, first, uid, height)
        node = decode_node(self.load(key))
        self.loads += 1
        h = node.header
        if (h.kind, h.height, h.stream_dir, h.first_offset, h.next_offset) != (
            KIND_BRANCH,
            height,
            self.stream_dir,
            first,
            nxt,
        ):
            raise ManifestCorruptError(f"branch {key} does not match the entry naming it")
        yield from self.walk(node.entries, nxt)


def coalesce(
    plan: StreamPlan, bounds: Bounds, target_bytes: int, max_fragments: int = 4096
) -> list[ReadTask]:
    """Group consecutive fragments into tasks of about ``target_bytes`` (0: one each).

    A task closes once it reaches the target, so a task is at most one fragment over it.
    """
    tasks: list[ReadTask] = []
    run: list[PlannedFragment] = []
    size = 0
    for fragment in plan.fragments:
        run.append(fragment)
        size += fragment.data_size
        if size >= target_bytes or len(run) >= max_fragments:
            tasks.append(ReadTask(plan.stream, plan.incarnation, tuple(run), bounds))
            run, size = [], 0
    if run:
        tasks.append(ReadTask(plan.stream, plan.incarnation, tuple(run), bounds))
    return tasks


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def options_bounds(options: SourceOptions) -> Bounds:
    """The offset and timestamp ranges the options ask for."""
    return offset_bounds(options.start_offset, options.end_offset).intersect(
        timestamp_bounds(options.start_timestamp, options.end_timestamp)
    )


def plan_read(
    options: SourceOptions,
    bounds: Bounds = Bounds(),
    streams: Sequence[StreamName] | None = None,
) -> list[StreamPlan]:
    """Plan every stream of ``options`` (or only ``streams``) within ``bounds``."""
    store = connections.object_store(options.object_store, options.store_settings)
    catalog = connections.catalog(options.meta_store)
    plans = []
    for name in options.streams if streams is None else streams:
        record = resolve_stream(catalog, name.vhost, name.name)
        tree = load_tree(catalog, store, options.prefix, record.incarnation)
        plans.append(plan_stream(name.display, tree, store.get, bounds))
    return plans


def read_tasks(plans: Sequence[StreamPlan], bounds: Bounds, target_bytes: int) -> list[ReadTask]:
    return [task for plan in plans for task in coalesce(plan, bounds, target_bytes)]
