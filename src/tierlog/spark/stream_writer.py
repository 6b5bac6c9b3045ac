"""The streaming sink: ``df.writeStream.format("tierlog")``, exactly once per micro-batch.

Each Spark partition of a micro-batch is published by one named producer,
``{writeId}-{partitionId}``, where ``writeId`` defaults to the streaming query's id (kept in
the checkpoint, so a restarted query uses the same producers). Publishing ids are
``batchId * 2**32 + row index + 1``: they grow from one micro-batch to the next, and a
micro-batch that Spark replays after a failure or a restart from the checkpoint gets the
same ids again. A task asks the server for its producer's sequence first and skips the rows
the stream already holds; the server drops any id at or below the sequence too. So a
replayed micro-batch never stores a row twice -- provided the replay has the same rows in
the same partitions in the same order, which Spark gives for a replayable source and a
deterministic query (the source re-reads the checkpointed offsets; the number of shuffle
partitions is pinned by the checkpoint).

A replay with another number of partitions (a ``repartition(n)`` changed before a restart,
file splits of another size, a source that plans the replayed offsets differently) would
put rows under other producers and ids, so the sink refuses it. The partition count of a
micro-batch's first attempt is recorded when that attempt ends (``commit`` or ``abort`` on
the driver, the only places that learn it: pyspark does not tell a task how many partitions
its stage has) in the stream's own tracking data, next to the producers' sequences, under
the reference ``{writeId}-partitions`` (value ``batchId * 2**20 + count``). On a replay, a
task whose partition did not exist in the first attempt refuses before publishing anything,
and ``commit`` refuses a replay whose count differs. The check has one blind spot: in a
replay with fewer partitions, or while a refusing task is still starting, the tasks of
partitions that did exist may have published rows before the query fails; the error says
so. If the driver dies before the first attempt ends, nothing is recorded and the replay
is not checked.

The batch id and query id reach the executors as the local properties Spark's micro-batch
execution sets for every task of the batch (``streaming.sql.batchId``,
``sql.streaming.queryId``). ``commit`` only logs totals: the rows are already durable in
the stream; ``abort`` cannot un-publish, and the replay fills in exactly the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from tierlog.logs import get_logger
from tierlog.spark.client import StreamClient
from tierlog.spark.errors import PartitionCountChangedError
from tierlog.spark.writer import TierlogWriter, WriterError, WriterOptions

log = get_logger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
ROWS_PER_BATCH_BITS = 32
MAX_BATCH_ID = (1 << (63 - ROWS_PER_BATCH_BITS)) - 1
PARTITION_COUNT_BITS = 20
PARTITIONS_SUFFIX = "-partitions"


def partition_record(batch_id: int, count: int) -> int:
    """The tracking value recording ``count`` partitions for micro-batch ``batch_id``."""
    if not 0 < count < 1 << PARTITION_COUNT_BITS:
        raise WriterError(f"a micro-batch of {count} partitions is out of range")
    return (batch_id << PARTITION_COUNT_BITS) | count


def recorded_count(client: StreamClient, stream: str, write_id: str, batch_id: int) -> int | None:
    """The partition count recorded for ``batch_id``'s first attempt (None: none yet)."""
    value = client.query_offset(stream, write_id + PARTITIONS_SUFFIX)
    if value is None or value >> PARTITION_COUNT_BITS != batch_id:
        return None
    return value & ((1 << PARTITION_COUNT_BITS) - 1)


@dataclass(frozen=True)
class TierlogStreamCommitMessage(WriterCommitMessage):
    """What one task of a micro-batch did: every row of its partition is in the stream."""

    batch_id: int
    partition_id: int
    attempt: int
    producer: str
    rows: int
    skipped: int  # rows the stream already held (a replay)
    published: int


def base_publishing_id(batch_id: int) -> int:
    """Publishing ids of micro-batch ``batch_id`` are ``base + 1 ... base + rows``."""
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise WriterError(f"micro-batch id {batch_id} is out of the publishing id range")
    return batch_id << ROWS_PER_BATCH_BITS


class TierlogStreamWriter(DataSourceStreamArrowWriter):
    """Publishes each partition of each micro-batch through its named producer."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise WriterError("streams are append-only: use outputMode('append')")
        given = {k.lower(): v for k, v in options.items()}
        for key in ("checkpointlocation", "path", "queryname"):
            given.pop(key, None)  # Spark's own writeStream options
        self.write_id: str | None = given.get("writeid") or None
        # The query id replaces writeId per task when none is given.
        self.writer = TierlogWriter(WriterOptions.from_options(given), schema, False)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TierlogStreamCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise WriterError("the streaming sink runs inside Spark tasks only")
        batch_text = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        if batch_text is None or (self.write_id is None and not query_id):
            raise WriterError("no micro-batch id / query id in the task: not a streaming write")
        batch_id = int(batch_text)
        partition_id = ctx.partitionId()
        write_id = self.write_id or query_id or ""
        producer = f"{write_id}-{partition_id}"
        stream = self.writer.options.stream

        def check_partition(client: StreamClient) -> None:
            first = recorded_count(client, stream, write_id, batch_id)
            if first is not None and partition_id >= first:
                raise PartitionCountChangedError(
                    batch_id, first, f"at least {partition_id + 1} (partition {partition_id})"
                )

        rows, skipped, published, _confirmed = self.writer.publish(
            iterator, producer, base_publishing_id(batch_id), check_partition
        )
        if rows >= 1 << ROWS_PER_BATCH_BITS:
            raise WriterError(f"partition {partition_id} of a micro-batch has over 2**32 rows")
        return TierlogStreamCommitMessage(
            batch_id, partition_id, ctx.attemptNumber(), producer, rows, skipped, published
        )

    def _record_partitions(
        self, messages: list[WriterCommitMessage | None], batch_id: int
    ) -> int | None:
        """Record ``len(messages)`` as the partition count of ``batch_id`` unless an earlier
        attempt did; return the count recorded before (None: this is the first)."""
        done = [m for m in messages if isinstance(m, TierlogStreamCommitMessage)]
        write_id = self.write_id or (done[0].producer.rsplit("-", 1)[0] if done else None)
        if write_id is None:  # no task finished and no writeId: nothing names the producers
            log.warning("spark_stream_partitions_not_recorded", batch_id=batch_id)
            return None
        stream = self.writer.options.stream
        with self.writer.connect() as client:
            first = recorded_count(client, stream, write_id, batch_id)
            if first is None:
                record = partition_record(batch_id, len(messages))
                client.store_offset(stream, write_id + PARTITIONS_SUFFIX, record)
                client.query_offset(stream, write_id + PARTITIONS_SUFFIX)  # stored now
        return first

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        first = self._record_partitions(messages, batchId)
        if first is not None and first != len(messages):
            raise PartitionCountChangedError(batchId, first, f"{len(messages)} partition(s)")
        done = [m for m in messages if isinstance(m, TierlogStreamCommitMessage)]
        log.info(
            "spark_stream_batch_committed",
            stream=self.writer.options.stream,
            batch_id=batchId,
            partitions=len(done),
            rows=sum(m.rows for m in done),
            published=sum(m.published for m in done),
            skipped=sum(m.skipped for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._record_partitions(messages, batchId)
        done = [m for m in messages if isinstance(m, TierlogStreamCommitMessage)]
        log.warning(
            "spark_stream_batch_aborted",
            stream=self.writer.options.stream,
            batch_id=batchId,
            completed_partitions=len(done),
            rows_kept=sum(m.rows for m in done),
            hint="the replay of this micro-batch publishes the rest without duplicates",
        )
