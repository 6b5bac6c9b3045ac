"""Plan a read of the remote tier straight from the committed manifest (no Spark in here).

``plan_stream`` reads the catalog pointer and the root it names, then walks the manifest
tree with the remote tier's walker, descending only into branches whose offset and
timestamp ranges overlap the wanted ``Bounds``; ``coalesce`` groups consecutive fragments
into ``ReadTask``\\ s of about a target size, which become Spark input partitions.
Everything here is picklable plain data, reused by the batch source, the streaming source
and the Spark jobs.

Offsets are record offsets; timestamps are chunk timestamps in ms since the epoch (what the
manifest and the chunk headers hold). A read covers the committed manifest's
``[first, next)`` as of planning time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.committed import read_committed_root
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.manifest_walk import Bounds, Loader, ManifestWalker
from tierlog.spark import connections
from tierlog.spark.errors import StreamUnavailableError
from tierlog.spark.options import EARLIEST, LATEST, SourceOptions, StreamName
from tierlog.storage.object_store import ObjectStore


def offset_bounds(start: int | None, end: int | None) -> Bounds:
    """Bounds for the offsets ``[start, end)`` (end exclusive, as options give it)."""
    return Bounds(min_offset=start, max_offset=None if end is None else end - 1)


def timestamp_bounds(start: int | None, end: int | None) -> Bounds:
    """Bounds for the chunk timestamps ``[start, end)`` in ms (end exclusive)."""
    return Bounds(min_ts=start, max_ts=None if end is None else end - 1)


@dataclass(frozen=True, slots=True)
class ReadTask:
    """Consecutive fragments of one stream read by one task, with the rows to keep."""

    stream: str  # the stream column's value
    incarnation: str
    fragments: tuple[FragmentEntry, ...]
    bounds: Bounds
    sealed: bool = False  # the manifest is sealed: so must every fragment and segment be

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
    fragments: list[FragmentEntry] = field(default_factory=list)
    branch_loads: int = 0
    sealed: bool = False  # read from a pointer saying the manifest is sealed


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
    return ManifestTree.from_root(data, prefix, sealed=pointer.sealed)


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
        sealed=tree.sealed,
    )
    if tree.is_empty or bounds.is_empty:
        return plan
    walker = ManifestWalker(tree.prefix, tree.stream_dir, load, bounds, require_sealed=tree.sealed)
    plan.fragments = list(walker.walk(tree.root_entries(), tree.next_offset))
    plan.branch_loads = walker.loads
    return plan


def coalesce(
    plan: StreamPlan, bounds: Bounds, target_bytes: int, max_fragments: int = 4096
) -> list[ReadTask]:
    """Group consecutive fragments into tasks of about ``target_bytes`` (0: one each).

    A task closes once it reaches the target, so a task is at most one fragment over it.
    An offloaded segment (hundreds of MB, read block by block) is always a task of its own.
    """

    def task(fragments: tuple[FragmentEntry, ...]) -> ReadTask:
        return ReadTask(plan.stream, plan.incarnation, fragments, bounds, plan.sealed)

    tasks: list[ReadTask] = []
    run: list[FragmentEntry] = []
    size = 0
    for fragment in plan.fragments:
        if fragment.is_segment:
            if run:
                tasks.append(task(tuple(run)))
                run, size = [], 0
            tasks.append(task((fragment,)))
            continue
        run.append(fragment)
        size += fragment.data_size
        if size >= target_bytes or len(run) >= max_fragments:
            tasks.append(task(tuple(run)))
            run, size = [], 0
    if run:
        tasks.append(task(tuple(run)))
    return tasks


def options_bounds(options: SourceOptions) -> Bounds:
    """The offset and timestamp ranges the options ask for (every stream)."""
    start_ts = options.start_timestamp
    if options.starting_timestamp is not None:  # timestamps never go backwards in a stream
        start_ts = options.starting_timestamp
    return offset_bounds(options.start_offset, options.end_offset).intersect(
        timestamp_bounds(start_ts, options.end_timestamp)
    )


def stream_bounds(options: SourceOptions, stream: str) -> Bounds:
    """A batch read's offsets of one stream from ``startingOffsets`` / ``endingOffsets``
    JSON (``EARLIEST`` / ``LATEST`` leave that side open)."""
    start = options.starting_offsets.offsets.get(stream, EARLIEST)
    end = options.ending_offsets.get(stream, LATEST)
    return offset_bounds(None if start < 0 else start, None if end < 0 else end)


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
