"""The streaming sink ``writeStream.format("tierlog")`` against a real ``tierlog serve`` and
real Spark: a micro-batch that fails after part of its rows were published, then the query
restarted from its checkpoint, leaves every row in the stream exactly once; a restart that
replays it with another number of partitions is refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.tierlog_server import TierlogServerProcess, stored_bodies
from tierlog.spark.client import StreamClient
from tierlog.spark.stream_writer import base_publishing_id
from tierlog.spark.writer import WriterError

pytestmark = pytest.mark.spark

ROWS_PER_FILE = 300


@pytest.fixture
def server(session_tierlog_server: TierlogServerProcess) -> TierlogServerProcess:
    """The session's server: this module's streams are named apart from other modules'."""
    return session_tierlog_server


def write_input(directory: Path, index: int) -> list[bytes]:
    lines = [f"f{index}-r{i:04d}" for i in range(ROWS_PER_FILE)]
    (directory / f"part-{index:03d}.txt").write_text("\n".join(lines) + "\n")
    return [line.encode() for line in lines]


def start_query(
    spark: Any,
    server: TierlogServerProcess,
    source: Path,
    checkpoint: Path,
    fail_marker: Path,
    stream: str = "sunk",
    failing: tuple[str, int] = ("f1-", 1),
    write_id: str | None = None,
) -> Any:
    """Text files -> tierlog, one file per micro-batch, each file split into 2 partitions
    (``spark.sql.files.maxPartitionBytes``, set by the caller); a row of the
    second partition (``failing``) of the second file fails every attempt while
    ``fail_marker`` exists, once the partition has passed its first rows (so part of the
    batch is published)."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    marker = str(fail_marker)
    prefix, failing_partition = failing

    def check(value: str) -> str:
        import os

        ctx = TaskContext.get()
        if (
            os.path.exists(marker)
            and value.startswith(prefix)
            and int(value[4:]) >= 250
            and ctx is not None
            and ctx.partitionId() == failing_partition
        ):
            raise RuntimeError("injected failure")
        return value

    checked = F.udf(check, "string")
    df = (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
        .select(checked("value").alias("body"))
    )
    writer = df.writeStream.format("tierlog")
    if write_id is not None:
        writer = writer.option("writeId", write_id)
    return (
        writer.option("stream", stream)
        .option("server", f"{server.host}:{server.stream_port}")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_replayed_micro_batch_after_restart_stores_each_row_once(
    spark: Any, server: TierlogServerProcess, tmp_path: Path
) -> None:
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.create_stream("sunk")
    source = tmp_path / "in"
    source.mkdir()
    expected = write_input(source, 0) + write_input(source, 1)
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "fail"
    marker.touch()
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1600")  # ~2.7 kB files: 2 splits
    try:
        run_failing_then_restart(spark, server, source, checkpoint, marker, expected)
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)


def run_failing_then_restart(
    spark: Any,
    server: TierlogServerProcess,
    source: Path,
    checkpoint: Path,
    marker: Path,
    expected: list[bytes],
) -> None:
    query = start_query(spark, server, source, checkpoint, marker)
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination(240)
    partial = stored_bodies(server, "sunk")
    second = [b for b in partial if b.startswith(b"f1-")]
    # Batch 0 is complete and batch 1 was cut short after some of its rows were stored.
    assert sorted(b for b in partial if b.startswith(b"f0-")) == sorted(expected[:300])
    assert 0 < len(second) < ROWS_PER_FILE, len(second)

    marker.unlink()
    query = start_query(spark, server, source, checkpoint, marker)
    assert query.awaitTermination(240)
    assert query.exception() is None
    bodies = stored_bodies(server, "sunk")
    dups = [b for b, n in Counter(bodies).items() if n > 1]
    assert not dups, f"{len(dups)} duplicated rows, e.g. {dups[:3]}"
    assert sorted(bodies) == sorted(expected)
    # The restart replayed batch 1 with the same producers and the same ids.
    with StreamClient.connect(server.host, server.stream_port) as client:
        sequences = [client.query_publisher_sequence("sunk", f"{query.id}-{p}") for p in range(2)]
    assert all(base_publishing_id(1) < s < base_publishing_id(2) for s in sequences), sequences


def test_replay_with_more_partitions_is_refused(
    spark: Any, server: TierlogServerProcess, tmp_path: Path
) -> None:
    """A micro-batch first written as 1 partition (failing after part of its rows) and
    replayed as 2 file splits: the task of the partition the first attempt did not have
    refuses before publishing; the query fails with the reason; a restart with the first
    partitioning finishes it exactly once. (Partition 0 of the replay holds the first
    attempt's rows in the same order, so what it may publish before the query stops is
    new: the stream stays free of duplicates throughout.)"""
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.create_stream("resplit")
    source = tmp_path / "in"
    source.mkdir()
    expected = write_input(source, 0)
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "fail"
    marker.touch()
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")

    def run(split_bytes: int) -> Any:
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
        query = start_query(
            spark, server, source, checkpoint, marker, "resplit", ("f0-", 0), "resplit"
        )
        try:
            query.awaitTermination(240)
        except Exception as exc:  # the failure is what is checked
            return exc
        return None

    try:
        assert "injected failure" in str(run(4000))  # one partition
        first = stored_bodies(server, "resplit")
        assert len(first) < ROWS_PER_FILE and first == expected[: len(first)]
        marker.unlink()
        refused = run(1600)  # two partitions
        assert refused is not None
        assert "micro-batch 0 was first written with 1 partition" in str(refused), refused
        assert "replayed with at least 2 (partition 1)" in str(refused), refused
        after = stored_bodies(server, "resplit")
        assert after == expected[: len(after)]  # a prefix: no duplicate, no gap
        final = run(4000)  # the first attempt's partitioning finishes the batch
        assert final is None, str(final)[:3000]
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    assert stored_bodies(server, "resplit") == expected


def test_commit_refuses_a_replay_with_another_partition_count(
    server: TierlogServerProcess,
) -> None:
    """The driver's side of the check: the first attempt's count is recorded once (by its
    abort or commit) and a later commit of the same micro-batch with another count fails
    (the case tasks cannot see: a replay with fewer partitions)."""
    from tierlog.spark.stream_writer import (
        PartitionCountChangedError,
        TierlogStreamCommitMessage,
        TierlogStreamWriter,
        recorded_count,
    )

    with StreamClient.connect(server.host, server.stream_port) as client:
        client.create_stream("counted")
    from pyspark.sql.types import BinaryType, StructField, StructType

    options = {"stream": "counted", "server": f"{server.host}:{server.stream_port}"}
    schema = StructType([StructField("body", BinaryType())])
    writer = TierlogStreamWriter(options, schema, False)

    def messages(batch: int, count: int, done: int) -> list[Any]:
        return [
            TierlogStreamCommitMessage(batch, p, 0, f"q-{p}", 1, 0, 1) if p < done else None
            for p in range(count)
        ]

    writer.abort(messages(7, 4, 1), 7)  # first attempt: 4 partitions, one finished
    writer.abort(messages(7, 2, 2), 7)  # a later attempt does not overwrite the record
    with StreamClient.connect(server.host, server.stream_port) as client:
        assert recorded_count(client, "counted", "q", 7) == 4
        assert recorded_count(client, "counted", "q", 8) is None
    with pytest.raises(PartitionCountChangedError, match="first written with 4 partition"):
        writer.commit(messages(7, 3, 3), 7)
    writer.commit(messages(7, 4, 4), 7)  # the same count commits
    writer.commit(messages(8, 2, 2), 8)  # the next micro-batch records its own
    with StreamClient.connect(server.host, server.stream_port) as client:
        assert recorded_count(client, "counted", "q", 8) == 2


def test_sink_refuses_complete_mode_and_bad_options(
    spark: Any, server: TierlogServerProcess
) -> None:
    from tierlog.spark.stream_writer import TierlogStreamWriter

    with pytest.raises(WriterError, match="append-only"):
        TierlogStreamWriter({"stream": "s", "server": "h:1"}, spark.range(1).schema, True)
    with pytest.raises(Exception, match="server"):
        TierlogStreamWriter({"stream": "s", "server": "nope"}, spark.range(1).schema, False)
    with pytest.raises(WriterError):
        base_publishing_id(1 << 40)
