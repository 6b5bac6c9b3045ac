"""The streaming sink ``writeStream.format("tierlog")`` against a real ``tierlog serve`` and
real Spark: a micro-batch that fails after part of its rows were published, then the query
restarted from its checkpoint, leaves every row in the stream exactly once."""

from __future__ import annotations

import glob
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.tierlog_server import TierlogServerProcess
from tierlog.log.dump import iter_dump
from tierlog.spark.client import StreamClient
from tierlog.spark.stream_writer import base_publishing_id
from tierlog.spark.writer import WriterError

pytestmark = pytest.mark.spark

ROWS_PER_FILE = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TierlogServerProcess]:
    proc = TierlogServerProcess(tmp_path_factory.mktemp("sink") / "data").start()
    try:
        yield proc
    finally:
        try:
            proc.stop()
        finally:
            proc.kill()


def stream_bodies(server: TierlogServerProcess, name: str) -> list[bytes]:
    import base64

    (stream_dir,) = glob.glob(str(server.data_dir / "streams" / f"*_{name}_*"))
    return [base64.b64decode(item["body"]) for item in iter_dump(stream_dir)]


def write_input(directory: Path, index: int) -> list[bytes]:
    lines = [f"f{index}-r{i:04d}" for i in range(ROWS_PER_FILE)]
    (directory / f"part-{index:03d}.txt").write_text("\n".join(lines) + "\n")
    return [line.encode() for line in lines]


def start_query(
    spark: Any, server: TierlogServerProcess, source: Path, checkpoint: Path, fail_marker: Path
) -> Any:
    """Text files -> tierlog, one file per micro-batch, each file split into 2 partitions
    (``spark.sql.files.maxPartitionBytes``, set by the caller); a row of the
    second partition of the second file fails every attempt while ``fail_marker`` exists,
    once the partition has passed its first rows (so part of the batch is published)."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    marker = str(fail_marker)

    def check(value: str) -> str:
        import os

        ctx = TaskContext.get()
        if (
            os.path.exists(marker)
            and value.startswith("f1-")
            and int(value[4:]) >= 250
            and ctx is not None
            and ctx.partitionId() == 1
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
    return (
        df.writeStream.format("tierlog")
        .option("stream", "sunk")
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
    partial = stream_bodies(server, "sunk")
    second = [b for b in partial if b.startswith(b"f1-")]
    # Batch 0 is complete and batch 1 was cut short after some of its rows were stored.
    assert sorted(b for b in partial if b.startswith(b"f0-")) == sorted(expected[:300])
    assert 0 < len(second) < ROWS_PER_FILE, len(second)

    marker.unlink()
    query = start_query(spark, server, source, checkpoint, marker)
    assert query.awaitTermination(240)
    assert query.exception() is None
    bodies = stream_bodies(server, "sunk")
    dups = [b for b, n in Counter(bodies).items() if n > 1]
    assert not dups, f"{len(dups)} duplicated rows, e.g. {dups[:3]}"
    assert sorted(bodies) == sorted(expected)
    # The restart replayed batch 1 with the same producers and the same ids.
    with StreamClient.connect(server.host, server.stream_port) as client:
        sequences = [client.query_publisher_sequence("sunk", f"{query.id}-{p}") for p in range(2)]
    assert all(base_publishing_id(1) < s < base_publishing_id(2) for s in sequences), sequences


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
