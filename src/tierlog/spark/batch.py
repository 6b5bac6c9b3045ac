"""``spark.read.format("tierlog")``: the batch source on the Spark 4 Python Data Source API.

Planning (on the driver's planning worker) reads the committed manifest of each stream and
makes one input partition per fragment or per coalesced run of fragments; tasks GET whole
fragments and yield Arrow record batches (``tierlog.spark.reading``). With a ``server``
option one more partition reads the un-tiered tail through the server
(``tierlog.spark.tail``).

Filter pushdown: pyspark refuses every read of a reader that overrides ``pushFilters`` while
``spark.sql.python.filterPushdown.enabled`` is off, and the planning worker cannot see the
session conf. So there are two registrations of the same source: ``TierlogDataSource``
(no ``pushFilters``: works whatever the flag; prune with the ``startOffset`` /
``endOffset`` / ``startTimestamp`` / ``endTimestamp`` options) and
``TierlogPushdownDataSource`` (prunes fragments by ``offset``, ``timestamp`` and ``stream``
filters), which ``tierlog.spark.session.register`` installs after turning the flag on.
Pushed filters are used to prune fragments and rows, and are still handed back to Spark,
which re-checks them: correctness never depends on the pruning.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from tierlog.remote.manifest_walk import Bounds
from tierlog.spark import connections
from tierlog.spark.arrow_batch import record_batch_schema
from tierlog.spark.options import (
    SourceOptions,
    StreamName,
    matching_streams,
    parse_options,
    with_streams,
)
from tierlog.spark.planning import (
    ReadTask,
    options_bounds,
    plan_read,
    read_tasks,
    stream_bounds,
)
from tierlog.spark.reading import ReadSettings, read_task
from tierlog.spark.tail import ServerAddress, TailTask, committed_end, read_tail, tail_task
from tierlog.spark.writer import TierlogWriteMixin

SOURCE_NAME = "tierlog"


def spark_schema(include_amqp: bool) -> StructType:
    """The source's schema: ``tierlog.spark.arrow_batch`` columns, timestamps as UTC."""
    converted = _utc_timestamps(from_arrow_schema(record_batch_schema(include_amqp=include_amqp)))
    assert isinstance(converted, StructType)
    return converted


def arrow_schema(include_amqp: bool) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read`` (checked by pyspark)."""
    return to_arrow_schema(spark_schema(include_amqp), timezone="UTC")


def _utc_timestamps(t: DataType) -> DataType:
    if isinstance(t, TimestampNTZType):
        return TimestampType()
    if isinstance(t, StructType):
        return StructType(
            [StructField(f.name, _utc_timestamps(f.dataType), f.nullable) for f in t.fields]
        )
    if isinstance(t, MapType):
        return MapType(
            _utc_timestamps(t.keyType), _utc_timestamps(t.valueType), t.valueContainsNull
        )
    if isinstance(t, ArrayType):
        return ArrayType(_utc_timestamps(t.elementType), t.containsNull)
    return t


class TaskPartition(InputPartition):
    """One Spark input partition: a ``ReadTask`` (consecutive fragments of one stream)."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


def read_settings(options: SourceOptions) -> ReadSettings:
    return ReadSettings(
        object_store=options.object_store,
        store_settings=options.store_settings,
        include_amqp=options.include_amqp,
        skip_expired=options.on_expired == "skip",
        verify_crc=options.verify_crc,
        trace_dir=options.trace_dir,
    )


class TailPartition(InputPartition):
    """The un-tiered tail of one stream, read through the server."""

    def __init__(self, task: TailTask) -> None:
        super().__init__(task)
        self.task = task


def server_address(options: SourceOptions) -> ServerAddress:
    assert options.server is not None
    host, port = options.server
    return ServerAddress(host, port, options.user, options.password)


def read_partition(partition: InputPartition, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """What every reader's ``read`` does (an empty plan gives Spark a value-less partition)."""
    schema = arrow_schema(options.include_amqp)
    if isinstance(partition, TailPartition):
        batches = read_tail(
            partition.task, server_address(options), options.include_amqp, options.verify_crc
        )
        return (b.cast(schema) for b in batches)
    if not isinstance(partition, TaskPartition):
        return iter(())
    return read_task(partition.task, read_settings(options), schema)


class TierlogBatchReader(DataSourceReader):
    """Reads the committed manifest's ``[first, next)`` (within the options' ranges)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.bounds = options_bounds(options)
        self.streams: tuple[StreamName, ...] = options.streams

    def partitions(self) -> list[InputPartition]:
        out: list[InputPartition] = []
        for stream in self.streams:
            bounds = self.bounds.intersect(stream_bounds(self.options, stream.display))
            plans = plan_read(self.options, bounds, [stream])
            tasks = read_tasks(plans, bounds, self.options.target_partition_bytes)
            out += [TaskPartition(t) for t in tasks]
            if self.options.server is not None:
                out += self._tail(stream, plans[0].next_offset, bounds)
        return out

    def _tail(self, stream: StreamName, start: int, bounds: Bounds) -> list[InputPartition]:
        """The tail partition ``[manifest next, end of the server's committed data)``."""
        end = committed_end(server_address(self.options), stream.vhost, stream.name, start)
        task = tail_task(stream.display, stream.vhost, stream.name, start, end, bounds)
        return [] if task is None else [TailPartition(task)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.options)


class TierlogPushdownBatchReader(TierlogBatchReader):
    """The batch reader with filter pushdown on ``offset``, ``timestamp`` and ``stream``."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            self._narrow(f)
        return filters  # Spark re-checks every filter: pruning only needs to be a superset

    def _narrow(self, f: Filter) -> None:
        column = getattr(f, "attribute", None)
        value: Any = getattr(f, "value", None)
        if column == ("offset",):
            self.bounds = self.bounds.intersect(_offset_filter(f, value))
        elif column == ("timestamp",):
            self.bounds = self.bounds.intersect(_timestamp_filter(f, value))
        elif column == ("stream",):
            wanted = _stream_filter(f, value)
            if wanted is not None:
                self.streams = tuple(s for s in self.streams if s.display in wanted)


def _offset_filter(f: Filter, value: Any) -> Bounds:
    if isinstance(f, In):
        ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
        if len(ints) != len(value):
            return Bounds()
        return Bounds(min_offset=min(ints), max_offset=max(ints)) if ints else _nothing()
    if not isinstance(value, int) or isinstance(value, bool):
        return Bounds()
    if isinstance(f, EqualTo):
        return Bounds(min_offset=value, max_offset=value)
    if isinstance(f, GreaterThan):
        return Bounds(min_offset=value + 1)
    if isinstance(f, GreaterThanOrEqual):
        return Bounds(min_offset=value)
    if isinstance(f, LessThan):
        return Bounds(max_offset=value - 1)
    if isinstance(f, LessThanOrEqual):
        return Bounds(max_offset=value)
    return Bounds()


def _timestamp_filter(f: Filter, value: Any) -> Bounds:
    """Chunk timestamps are whole ms; bounds round outwards (a superset is enough)."""
    if isinstance(f, In):
        times = [_micros(v) for v in value]
        if not times:
            return _nothing()
        known = [t for t in times if t is not None]
        if len(known) != len(times):
            return Bounds()
        return Bounds(min_ts=min(known) // 1000, max_ts=math.ceil(max(known) / 1000))
    micros = _micros(value)
    if micros is None:
        return Bounds()
    low, high = micros // 1000, -(-micros // 1000)
    if isinstance(f, EqualTo):
        return Bounds(min_ts=low, max_ts=high)
    if isinstance(f, GreaterThan | GreaterThanOrEqual):
        return Bounds(min_ts=low)
    if isinstance(f, LessThan | LessThanOrEqual):
        return Bounds(max_ts=high)
    return Bounds()


def _micros(value: Any) -> int | None:
    """Microseconds since the epoch of a timestamp literal (naive means UTC)."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _stream_filter(f: Filter, value: Any) -> set[str] | None:
    if isinstance(f, EqualTo) and isinstance(value, str):
        return {value}
    if isinstance(f, In) and all(isinstance(v, str) for v in value):
        return set(value)
    return None


def _nothing() -> Bounds:
    return Bounds(min_offset=1, max_offset=0)


class TierlogDataSource(TierlogWriteMixin, DataSource):
    """``spark.read.format("tierlog")``, ``spark.readStream.format("tierlog")`` and
    ``df.write.format("tierlog")``. Read options are parsed on first use, so a write
    (which has its own options) never trips over them."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed: SourceOptions | None = None

    @property
    def parsed(self) -> SourceOptions:
        if self._parsed is None:
            self._parsed = parse_options(self.options)
        return self._parsed

    def resolved(self, mode: Literal["batch", "stream"]) -> SourceOptions:
        """The options checked for this kind of read, a ``subscribePattern`` resolved
        against the catalog (the streams that exist when the query starts)."""
        options = self.parsed
        options.check_mode(mode)
        if options.stream_pattern is None:
            return options
        records = connections.catalog(options.meta_store).list()
        displays = [StreamName(r.vhost, r.name).display for r in records]
        return with_streams(options, matching_streams(options.stream_pattern, displays))

    def schema(self) -> StructType:
        return spark_schema(self.parsed.include_amqp)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TierlogBatchReader(self.resolved("batch"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tierlog.spark.streaming import TierlogStreamReader

        return TierlogStreamReader(self.resolved("stream"))


class TierlogPushdownDataSource(TierlogDataSource):
    """The same source, with filter pushdown (needs the session flag on)."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return TierlogPushdownBatchReader(self.resolved("batch"))
