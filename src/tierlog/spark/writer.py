"""The Spark writer: ``df.write.format("tierlog").option("stream", ...).save()``.

Each Spark partition is published by one *named producer*, ``{writeId}-{partitionId}``,
through the stream protocol, with publishing id = row index within the partition + 1.
A task first asks the server for the producer's sequence (the highest id it holds) and
skips the rows up to it; the server also drops any id at or below the sequence. So a
retried task, a speculative duplicate, or a whole job re-run with the same ``writeId``
never stores a row twice -- provided the input is deterministic: the same rows in the
same order in every partition on every attempt (sort or checkpoint the input otherwise).

Messages: the ``body`` column (binary or string) is required. By default
(``messageFormat=auto``) a row becomes the raw body bytes when the frame has neither a
``properties`` nor an ``application_properties`` column, and an AMQP 1.0 message (one
data section plus those sections) when it has one; ``messageFormat=amqp`` always wraps
the body in an AMQP 1.0 message (what stream clients publish), ``raw`` never does.

Commit / abort: each task returns a ``TierlogCommitMessage`` with its counts once every
message it sent is confirmed (durable in the local log). ``commit`` only logs totals:
the data is already in the stream. ``abort`` cannot un-publish -- streams are
append-only -- so after a failed job the rows that tasks had confirmed stay in the
stream; re-running the job with the same ``writeId`` (and the same input) publishes
exactly the missing rows. See docs/spark_jobs.md.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from tierlog.errors import ConfigError
from tierlog.formats.amqp import Timestamp, encode_message
from tierlog.logs import get_logger
from tierlog.spark.client import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT_S, StreamClient
from tierlog.spark.errors import WriterError
from tierlog.spark.options import unknown_options

log = get_logger(__name__)

PUBLISHER_ID = 0
MAX_WRITE_ID_BYTES = 200  # leaves room for "-{partition id}" in a 255-byte reference
MESSAGE_FORMATS = ("auto", "raw", "amqp")


@dataclass(frozen=True, slots=True)
class WriterOptions:
    """The writer's options (case-insensitive names as Spark passes them)."""

    stream: str
    host: str
    port: int
    write_id: str
    vhost: str = "/"
    user: str = "guest"
    password: str = "guest"
    body_column: str = "body"
    properties_column: str = "properties"
    application_properties_column: str = "application_properties"
    message_format: str = "auto"
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    timeout: float = DEFAULT_TIMEOUT_S

    @staticmethod
    def from_options(options: Mapping[str, str]) -> WriterOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in options if k.lower() not in _WRITER_KNOWN)
        if unknown:  # a mistyped option must not pass as a no-op
            raise unknown_options(unknown, WRITER_OPTIONS)
        stream = opts.get("stream", "")
        if not stream or "," in stream:
            raise ConfigError("option 'stream' must name exactly one stream")
        server = opts.get("server", "")
        host, sep, port_text = server.rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise ConfigError(f"option 'server' must be host:port, got {server!r}")
        write_id = opts.get("writeid") or uuid.uuid4().hex
        if len(write_id.encode()) > MAX_WRITE_ID_BYTES:
            raise ConfigError(f"option 'writeId' is longer than {MAX_WRITE_ID_BYTES} bytes")
        message_format = opts.get("messageformat", "auto").lower()
        if message_format not in MESSAGE_FORMATS:
            raise ConfigError(f"option 'messageFormat' must be one of {MESSAGE_FORMATS}")
        try:
            max_in_flight = int(opts.get("maxinflight", DEFAULT_MAX_IN_FLIGHT))
            timeout = float(opts.get("timeout", DEFAULT_TIMEOUT_S))
        except ValueError as exc:
            raise ConfigError(f"bad numeric writer option: {exc}") from None
        if max_in_flight < 1 or timeout <= 0:
            raise ConfigError("options 'maxInFlight' and 'timeout' must be positive")
        return WriterOptions(
            stream=stream,
            host=host.strip("[]"),
            port=int(port_text),
            write_id=write_id,
            vhost=opts.get("vhost", "/"),
            user=opts.get("user", "guest"),
            password=opts.get("password", "guest"),
            body_column=opts.get("bodycolumn", "body"),
            properties_column=opts.get("propertiescolumn", "properties"),
            application_properties_column=opts.get(
                "applicationpropertiescolumn", "application_properties"
            ),
            message_format=message_format,
            max_in_flight=max_in_flight,
            timeout=timeout,
        )

    def producer(self, partition_id: int) -> str:
        """The named producer (publisher reference) of one Spark partition."""
        return f"{self.write_id}-{partition_id}"


WRITER_OPTIONS = (
    "stream",
    "server",
    "writeId",
    "vhost",
    "user",
    "password",
    "bodyColumn",
    "propertiesColumn",
    "applicationPropertiesColumn",
    "messageFormat",
    "maxInFlight",
    "timeout",
)
"""The sink's options as docs/spark.md writes them (Spark hands them over lower-cased)."""

_WRITER_KNOWN = frozenset(name.lower() for name in WRITER_OPTIONS)


@dataclass(frozen=True)
class TierlogCommitMessage(WriterCommitMessage):
    """What one successful task did: every row of the partition is now in the stream."""

    partition_id: int
    attempt: int
    producer: str
    rows: int  # rows in the partition
    skipped: int  # rows already in the stream (sequence found at start)
    published: int  # rows sent by this attempt
    confirmed: int  # confirms received (duplicates the server dropped are confirmed too)


@dataclass(frozen=True, slots=True)
class _Columns:
    """Where the message parts are in the input batches."""

    body: int
    body_is_string: bool
    properties: int | None
    application_properties: int | None
    amqp: bool


def _resolve_columns(schema: StructType, options: WriterOptions) -> _Columns:
    names = [f.name for f in schema.fields]
    if options.body_column not in names:
        raise WriterError(
            f"the DataFrame needs a {options.body_column!r} column (binary or string); "
            f"it has {names}"
        )
    body = names.index(options.body_column)
    body_type = schema.fields[body].dataType
    if not isinstance(body_type, BinaryType | StringType):
        raise WriterError(f"column {options.body_column!r} must be binary or string")
    props = names.index(options.properties_column) if options.properties_column in names else None
    app = (
        names.index(options.application_properties_column)
        if options.application_properties_column in names
        else None
    )
    if props is not None and not isinstance(schema.fields[props].dataType, StructType | MapType):
        raise WriterError(f"column {options.properties_column!r} must be a struct or a map")
    if app is not None and not isinstance(schema.fields[app].dataType, StructType | MapType):
        raise WriterError(
            f"column {options.application_properties_column!r} must be a struct or a map"
        )
    has_sections = props is not None or app is not None
    if options.message_format == "raw" and has_sections:
        raise WriterError("messageFormat=raw cannot carry properties or application_properties")
    amqp = options.message_format == "amqp" or (options.message_format == "auto" and has_sections)
    return _Columns(body, isinstance(body_type, StringType), props, app, amqp)


class TierlogWriter(DataSourceArrowWriter):
    """Publishes each partition's rows through one named producer (see module doc)."""

    def __init__(self, options: WriterOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise WriterError("streams are append-only: use mode('append'), not overwrite")
        self.options = options
        self.columns = _resolve_columns(schema, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TierlogCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition_id = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        producer = self.options.producer(partition_id)
        rows, skipped, published, confirmed = self.publish(iterator, producer, 0)
        return TierlogCommitMessage(
            partition_id, attempt, producer, rows, skipped, published, confirmed
        )

    def connect(self) -> StreamClient:
        """A connection to the server the rows go to."""
        o = self.options
        return StreamClient.connect(
            o.host,
            o.port,
            user=o.user,
            password=o.password,
            vhost=o.vhost,
            timeout=o.timeout,
            max_in_flight=o.max_in_flight,
        )

    def publish(
        self,
        iterator: Iterator[pa.RecordBatch],
        producer: str,
        base_id: int,
        check: Callable[[StreamClient], None] | None = None,
    ) -> tuple[int, int, int, int]:
        """Publish the rows through ``producer`` with publishing ids ``base_id + 1, ...``
        in row order, skipping the rows whose id the server already holds for it;
        ``check`` runs on the connection before anything is published.
        Returns (rows, skipped, published, confirmed)."""
        o = self.options
        rows = skipped = published = 0
        with self.connect() as client:
            if check is not None:
                check(client)
            client.declare_publisher(PUBLISHER_ID, o.stream, producer)
            sequence = client.query_publisher_sequence(o.stream, producer) - base_id
            for batch in iterator:
                n = batch.num_rows
                first = rows  # row index of the batch's first row
                rows += n
                skip = min(n, max(0, sequence - first))
                skipped += skip
                if skip == n:
                    continue
                part = batch.slice(skip) if skip else batch
                offsets, data = self._message_buffers(part)
                ids = np.arange(first + skip + 1, first + n + 1, dtype=np.uint64)
                client.publish(PUBLISHER_ID, ids + np.uint64(base_id), offsets, data)
                published += n - skip
            confirmed = client.wait_for_confirms(PUBLISHER_ID)
            client.delete_publisher(PUBLISHER_ID)
        return rows, skipped, published, confirmed

    def _message_buffers(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, data) of the messages of ``batch``, without per-row Python objects
        unless AMQP sections must be encoded."""
        cols = self.columns
        body = batch.column(cols.body)
        if body.null_count:
            raise WriterError(f"column {self.options.body_column!r} holds nulls")
        if cols.amqp:
            body = _amqp_messages(batch, cols)
        elif cols.body_is_string:
            body = body.cast(
                pa.large_binary() if pa.types.is_large_string(body.type) else pa.binary()
            )
        return _binary_buffers(body)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, TierlogCommitMessage)]
        log.info(
            "spark_write_committed",
            write_id=self.options.write_id,
            stream=self.options.stream,
            partitions=len(done),
            rows=sum(m.rows for m in done),
            published=sum(m.published for m in done),
            skipped=sum(m.skipped for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, TierlogCommitMessage)]
        log.warning(
            "spark_write_aborted",
            write_id=self.options.write_id,
            stream=self.options.stream,
            completed_partitions=len(done),
            rows_kept=sum(m.rows for m in done),
            hint="re-run with the same writeId to publish the rest without duplicates",
        )


def _binary_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and data of a (large_)binary array, zero-copy where Arrow allows."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    _validity, offsets_buf, data_buf = array.buffers()
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    # A slice (a replay skipping the rows already held) starts ``array.offset`` entries in.
    count = array.offset + len(array) + 1
    offsets = np.frombuffer(offsets_buf, dtype=offset_type, count=count)[array.offset :]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8)
        if data_buf is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return offsets, data


def _amqp_messages(batch: pa.RecordBatch, cols: _Columns) -> pa.Array:
    """Encode each row as an AMQP 1.0 message (this path is per row by nature)."""
    bodies = batch.column(cols.body).to_pylist()
    props = _mappings(batch, cols.properties, _property_value)
    app = _mappings(batch, cols.application_properties, _application_value)
    out = [
        encode_message(
            b.encode() if isinstance(b, str) else b,
            properties=props[i] if props else None,
            application_properties=app[i] if app else None,
        )
        for i, b in enumerate(bodies)
    ]
    return pa.array(out, type=pa.binary())


def _mappings(
    batch: pa.RecordBatch, index: int | None, convert: Any
) -> list[dict[str, object] | None] | None:
    if index is None:
        return None
    out: list[dict[str, object] | None] = []
    for value in batch.column(index).to_pylist():
        if value is None:
            out.append(None)
            continue
        items = value.items() if isinstance(value, dict) else value  # map: list of pairs
        out.append({str(k): convert(v) for k, v in items if v is not None})
    return out


def _ms(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


def _property_value(value: object) -> object:
    return _ms(value) if isinstance(value, dt.datetime) else value


def _application_value(value: object) -> object:
    return Timestamp(_ms(value)) if isinstance(value, dt.datetime) else value


class TierlogWriteMixin:
    """Gives a DataSource the tierlog writer (the full source mixes this in)."""

    options: Any

    def writer(self, schema: StructType, overwrite: bool) -> TierlogWriter:
        return TierlogWriter(WriterOptions.from_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from tierlog.spark.stream_writer import TierlogStreamWriter

        return TierlogStreamWriter(self.options, schema, overwrite)


class TierlogWriteSource(TierlogWriteMixin, DataSource):
    """A write-only ``tierlog`` source, for sessions without the full tierlog source."""

    @classmethod
    def name(cls) -> str:
        return "tierlog"
