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
from tierlog.spark.writer import TierlogWriter, WriterError, WriterOptions

log = get_logger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
ROWS_PER_BATCH_BITS = 32
MAX_BATCH_ID = (1 << (63 - ROWS_PER_BATCH_BITS)) - 1


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
        producer = f"{self.write_id or query_id}-{partition_id}"
        rows, skipped, published, _confirmed = self.writer.publish(
            iterator, producer, base_publishing_id(batch_id)
        )
        if rows >= 1 << ROWS_PER_BATCH_BITS:
            raise WriterError(f"partition {partition_id} of a micro-batch has over 2**32 rows")
        return TierlogStreamCommitMessage(
            batch_id, partition_id, ctx.attemptNumber(), producer, rows, skipped, published
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
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
        done = [m for m in messages if isinstance(m, TierlogStreamCommitMessage)]
        log.warning(
            "spark_stream_batch_aborted",
            stream=self.writer.options.stream,
            batch_id=batchId,
            completed_partitions=len(done),
            rows_kept=sum(m.rows for m in done),
            hint="the replay of this micro-batch publishes the rest without duplicates",
        )
