"""``spark.readStream.format("tierlog")``: follow streams' committed manifests.

Offsets are JSON ``{stream: next offset to read}``, one entry per stream (the stream
column's value as key). A micro-batch ``(start, end]`` reads offsets ``[start[s], end[s])``
of every stream ``s``, planned straight from the manifest like a batch read, so a restarted
query (Spark replays its checkpointed offsets) reads exactly the same records again. The
head of a stream is its committed manifest's next offset; with a ``server`` option
(``includeTail``) it is the end of the server's committed data instead, and a micro-batch
reads ``[start, manifest next)`` from the remote tier and the rest through the server with
the batch read's tail task (``tierlog.spark.tail``), the manifest's ``next`` taken when the
micro-batch is planned. So the latency is the server's, not the fragment age, and a
micro-batch replayed after tiering moved on reads the same records, split differently.

Read limits (pyspark >= 4.2): ``maxRecordsPerTrigger`` (``ReadMaxRows``: offsets shared
fairly between streams with data) or ``maxBytesPerTrigger`` (``ReadMaxBytes``: whole
fragments round-robin between streams, at least one fragment per micro-batch so a query
always advances). ``Trigger.AvailableNow`` is supported: the heads at its start are the
target, later data waits for the next run.

``minOffsetsPerTrigger`` (Kafka's name): a micro-batch waits until that many new offsets
are there, or ``maxTriggerDelay`` has passed since the last one (``AvailableNow`` ignores it:
it would wait forever at the end).

Retention may remove a position before a micro-batch reads it: with ``onExpired=fail``
(``failOnDataLoss=true``) planning raises ``OffsetOvertakenError``; with ``skip`` the batch
starts at the first offset still held and a ``spark_stream_data_lost`` warning says how
many offsets were skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tierlog.logs import get_logger
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.manifest_walk import Bounds
from tierlog.spark import connections
from tierlog.spark.arrow_batch import fragment_to_record_batch
from tierlog.spark.batch import TailPartition, TaskPartition, read_partition, server_address
from tierlog.spark.errors import StreamUnavailableError
from tierlog.spark.options import EARLIEST, LATEST, SourceOptions, StreamName
from tierlog.spark.planning import (
    coalesce,
    load_tree,
    plan_stream,
    resolve_stream,
)
from tierlog.spark.tail import committed_end, tail_task

log = get_logger(__name__)

Offsets = dict[str, int]


class TierlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Offsets | None = None
        self._incarnations: dict[str, str] = {}
        self._trees: dict[str, tuple[str | None, ManifestTree]] = {}
        self._last_trigger = time.monotonic()
        self._latest: Offsets | None = None  # the heads seen by the last latestOffset

    # -- the manifests ----------------------------------------------------------------------
    def _tree(self, stream: StreamName) -> ManifestTree:
        """The committed tree of ``stream`` now (reloaded only when the pointer moved)."""
        opts = self.options
        catalog = connections.catalog(opts.meta_store)
        record = resolve_stream(catalog, stream.vhost, stream.name)
        known = self._incarnations.setdefault(stream.display, record.incarnation)
        if known != record.incarnation:
            raise StreamUnavailableError(
                f"stream {stream.display!r} was deleted and re-created while being read"
            )
        pointer = catalog.read_pointer(record.incarnation)
        uid = None if pointer is None else pointer.root_uid
        cached = self._trees.get(stream.display)
        if cached is not None and pointer is not None and cached[0] == uid:
            return cached[1]
        store = connections.object_store(opts.object_store, opts.store_settings)
        tree = load_tree(catalog, store, opts.prefix, record.incarnation)
        self._trees[stream.display] = (uid, tree)
        return tree

    def _head(self, stream: StreamName) -> int:
        """Where the stream's readable data ends now: the manifest's next offset, or with
        a server the end of its committed data (never below the manifest)."""
        tiered = self._tree(stream).next_offset
        if self.options.server is None:
            return tiered
        return committed_end(
            server_address(self.options), stream.vhost, stream.name, tiered, streaming=True
        )

    def _heads(self) -> Offsets:
        heads = {s.display: self._head(s) for s in self.options.streams}
        if self._target is not None:
            heads = {s: min(h, self._target.get(s, h)) for s, h in heads.items()}
        return heads

    def _initial(self, stream: StreamName) -> int:
        start = self.options.starting_offsets
        tree = self._tree(stream)
        if self.options.starting_timestamp is not None:
            return self._offset_at(stream, tree, self.options.starting_timestamp)
        given = start.offsets.get(stream.display, EARLIEST)
        if start.mode == "latest" or given == LATEST:
            return self._head(stream)
        if start.mode == "offsets" and given >= 0:
            return given
        return tree.first_offset

    def _offset_at(self, stream: StreamName, tree: ManifestTree, timestamp: int) -> int:
        """The first offset whose chunk timestamp is >= ``timestamp`` (the head if none)."""
        opts = self.options
        store = connections.object_store(opts.object_store, opts.store_settings)
        plan = plan_stream(stream.display, tree, store.get, Bounds(min_ts=timestamp))
        for fragment in plan.fragments:
            batch = fragment_to_record_batch(
                store.get_view(fragment.key), stream.display, min_ts=timestamp
            )
            if batch.num_rows:
                return int(batch.column("offset")[0].as_py())
        return tree.next_offset

    def _positions(self, start: dict[str, int]) -> Offsets:
        """``start`` for every stream read now (streams added to the options start fresh)."""
        return {
            s.display: int(start[s.display]) if s.display in start else self._initial(s)
            for s in self.options.streams
        }

    # -- the DataSourceStreamReader API ------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        return {s.display: self._initial(s) for s in self.options.streams}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._heads()

    def reportLatestOffset(self) -> dict[str, int]:
        """The heads for the query's progress (``sources[i].latestOffset``): Spark asks right
        after ``latestOffset``, so these are the heads that micro-batch was planned against,
        and ``latestOffset - endOffset`` is the backlog Kafka reports as offsets behind
        latest (``tierlog.spark.progress.source_metrics`` derives those figures: a Python
        source has no hook to fill ``sources[i].metrics`` itself)."""
        return self._latest if self._latest is not None else self._heads()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        positions = self._positions(start)
        heads = self._heads()
        self._latest = heads
        if self._waits_for_more(positions, heads):
            return positions
        self._last_trigger = time.monotonic()
        if isinstance(limit, ReadMaxRows):
            return limit_rows(positions, heads, limit.max_rows)
        if isinstance(limit, ReadMaxBytes):
            return self._limit_bytes(positions, heads, limit.max_bytes)
        return {s: max(positions[s], heads[s]) for s in positions}

    def _waits_for_more(self, positions: Offsets, heads: Offsets) -> bool:
        """``minOffsetsPerTrigger``: too few new offsets, and ``maxTriggerDelay`` not over."""
        minimum = self.options.min_offsets_per_trigger
        if minimum is None or self._target is not None:
            return False
        available = sum(max(0, heads[s] - positions[s]) for s in positions)
        if available == 0 or available >= minimum:
            return False
        return time.monotonic() - self._last_trigger < self.options.max_trigger_delay

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        positions = self._positions(start)
        out: list[InputPartition] = []
        for stream in self.options.streams:
            name = stream.display
            lo, hi = positions[name], int(end.get(name, positions[name]))
            if hi <= lo:
                continue
            tree = self._tree(stream)
            if lo < tree.first_offset:
                if self.options.on_expired != "skip":
                    raise OffsetOvertakenError(
                        lo,
                        tree.first_offset,
                        f"stream {name!r}: offset {lo} was removed by retention; the first "
                        f"available offset is {tree.first_offset} (read with onExpired=skip "
                        "to go on there)",
                    )
                log.warning(
                    "spark_stream_data_lost",
                    stream=name,
                    from_offset=lo,
                    to_offset=min(hi, tree.first_offset),
                    offsets=min(hi, tree.first_offset) - lo,
                    reason="removed by retention before it was read (failOnDataLoss=false)",
                )
                lo = tree.first_offset
                if hi <= lo:
                    continue
            tiered = min(hi, tree.next_offset)
            if lo < tiered:
                bounds = Bounds(min_offset=lo, max_offset=tiered - 1)
                store = connections.object_store(
                    self.options.object_store, self.options.store_settings
                )
                plan = plan_stream(name, tree, store.get, bounds)
                tasks = coalesce(plan, bounds, self.options.target_partition_bytes)
                out.extend(TaskPartition(t) for t in tasks)
            if hi > tree.next_offset:
                out.append(self._tail(stream, max(lo, tree.next_offset), hi))
        return out

    def _tail(self, stream: StreamName, lo: int, hi: int) -> InputPartition:
        """``[lo, hi)`` beyond the manifest, through the server."""
        if self.options.server is None:  # the head came from a server in an earlier run
            raise StreamUnavailableError(
                f"stream {stream.display!r}: offsets [{lo}, {hi}) are not tiered yet and the "
                "query has no 'server' option to read them through; add it (includeTail)"
            )
        bounds = Bounds(min_offset=lo, max_offset=hi - 1)
        task = tail_task(stream.display, stream.vhost, stream.name, lo, hi, bounds)
        assert task is not None
        return TailPartition(task)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.options)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the remote tier keeps data by its own retention."""

    # -- limits -------------------------------------------------------------------------------
    def _limit_bytes(self, positions: Offsets, heads: Offsets, max_bytes: int) -> Offsets:
        store = connections.object_store(self.options.object_store, self.options.store_settings)
        queues: dict[str, list[FragmentEntry]] = {}
        for stream in self.options.streams:
            name = stream.display
            lo, hi = positions[name], heads[name]
            if hi <= lo:
                continue
            tree = self._tree(stream)
            tiered = min(hi, tree.next_offset)
            fragments: list[FragmentEntry] = []
            if lo < tiered:
                bounds = Bounds(min_offset=lo, max_offset=tiered - 1)
                fragments = plan_stream(name, tree, store.get, bounds).fragments
            if hi > tree.next_offset:
                fragments.append(tail_unit(fragments, max(lo, tree.next_offset), hi))
            queues[name] = fragments
        return limit_bytes(positions, heads, queues, max_bytes)


def tail_unit(fragments: list[FragmentEntry], lo: int, hi: int) -> FragmentEntry:
    """The un-tiered tail ``[lo, hi)`` as one more unit for ``maxBytesPerTrigger``, its
    size estimated from the tiered fragments' bytes per offset (the server's chunks are
    the same bytes)."""
    offsets = sum(f.next_offset - f.first_offset for f in fragments)
    per_offset = sum(f.data_size for f in fragments) / offsets if offsets else 1.0
    return FragmentEntry("", lo, hi, 0, 0, max(1, int((hi - lo) * per_offset)), 0)


def limit_rows(positions: Offsets, heads: Offsets, max_rows: int) -> Offsets:
    """End offsets covering at most ``max_rows`` offsets in all, shared fairly."""
    end = dict(positions)
    available = {s: heads[s] - positions[s] for s in positions if heads[s] > positions[s]}
    budget = max_rows
    while budget > 0 and available:
        share = max(1, budget // len(available))
        for stream in list(available):
            take = min(share, available[stream], budget)
            end[stream] += take
            available[stream] -= take
            budget -= take
            if not available[stream]:
                del available[stream]
            if not budget:
                break
    return end


def limit_bytes(
    positions: Offsets,
    heads: Offsets,
    queues: dict[str, list[FragmentEntry]],
    max_bytes: int,
) -> Offsets:
    """End offsets at fragment boundaries, about ``max_bytes`` of fragments round-robin
    across streams; always at least one fragment when there is data."""
    end = dict(positions)
    used = 0
    index = dict.fromkeys(queues, 0)
    progress = True
    while progress:
        progress = False
        for stream, fragments in queues.items():
            i = index[stream]
            if i >= len(fragments):
                continue
            fragment = fragments[i]
            if used and used + fragment.data_size > max_bytes:
                continue
            used += fragment.data_size
            end[stream] = min(fragment.next_offset, heads[stream])
            index[stream] = i + 1
            progress = True
    return end
