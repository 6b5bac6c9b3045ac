"""The streaming source ``spark.readStream.format("tierlog")`` on real Spark (local[2]):
several triggers under read limits, restart from the checkpoint, several streams, and (without
Spark) the offset arithmetic and retention overtaking a query's position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from tests.plugins.spark import TieredBucket, TieredStream
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.remote.fragments import FragmentEntry
from tierlog.spark import connections
from tierlog.spark.options import parse_options
from tierlog.spark.progress import AVG, MAX, MIN, source_metrics
from tierlog.spark.streaming import TierlogStreamReader, limit_bytes, limit_rows
from tierlog.tiering.retention import RetentionPolicy

pytestmark = pytest.mark.spark


def bodies(n: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i:06d}".encode().ljust(100, b".") for i in range(n)]


Batch = list[tuple[str, int, bytes]]


def run_available_now(
    spark: SparkSession,
    options: dict[str, str],
    checkpoint: Path,
    progress: list[dict[str, Any]] | None = None,
) -> list[Batch]:
    """Run the query with Trigger.AvailableNow until it stops; the rows of each micro-batch
    (and into ``progress`` the source's progress entry of each micro-batch with rows)."""
    batches: list[Batch] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        rows = df.select("stream", "offset", "body").collect()
        batches.append(sorted((r["stream"], r["offset"], bytes(r["body"])) for r in rows))

    query = (
        spark.readStream.format("tierlog")
        .options(**options)
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the availableNow query did not finish"
    finally:
        query.stop()
    assert query.exception() is None
    if progress is not None:
        for entry in query.recentProgress:
            (source,) = json.loads(entry.json)["sources"]
            if source["numInputRows"]:
                progress.append(source)
    return [b for b in batches if b]


def expected(stream: TieredStream, start: int = 0) -> Batch:
    return [(stream.display, r.offset, r.body) for r in stream.records(start)]


def test_triggers_limits_and_restart(
    spark: SparkSession, tiered_bucket: TieredBucket, tmp_path: Path
) -> None:
    stream = tiered_bucket.add_stream("events")
    stream.append(bodies(1000, "a"), per_chunk=20)
    stream.tier()
    opts = tiered_bucket.options(stream, maxRecordsPerTrigger=300)
    checkpoint = tmp_path / "checkpoint"
    progress: list[dict[str, Any]] = []
    first = run_available_now(spark, opts, checkpoint, progress)
    assert [len(b) for b in first] == [300, 300, 300, 100]
    # A known backlog: 1000 offsets read 300 per trigger are 700, 400, 100, 0 behind latest.
    assert [p["latestOffset"] for p in progress] == [{"events": 1000}] * 4
    assert not any(p.get("metrics") for p in progress)  # no metrics hook for Python sources
    assert [source_metrics(p) for p in progress] == [
        {AVG: f"{n}.0", MAX: str(n), MIN: str(n)} for n in (700, 400, 100, 0)
    ]
    assert [row for batch in first for row in batch] == expected(stream)
    # Offsets in the checkpoint are {stream: next offset}.
    logs = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    offsets = sorted(logs, key=lambda p: int(p.name))
    assert json.loads(offsets[-1].read_text().splitlines()[-1]) == {"events": 1000}

    # More data arrives; the restarted query reads only the new records.
    stream.append(bodies(450, "b"), per_chunk=30)
    stream.tier()
    second = run_available_now(spark, opts, checkpoint)
    assert [len(b) for b in second] == [300, 150]
    assert [row for batch in second for row in batch] == expected(stream, 1000)
    # Nothing new: a restart reads nothing.
    assert run_available_now(spark, opts, checkpoint) == []


def test_byte_limit_and_several_streams_from_latest(
    spark: SparkSession, tiered_bucket: TieredBucket, tmp_path: Path
) -> None:
    a = tiered_bucket.add_stream("a")
    b = tiered_bucket.add_stream("b", vhost="v")
    a.append(bodies(100, "old"))
    a.tier()
    checkpoint = tmp_path / "cp"
    opts = tiered_bucket.options(a, b, maxBytesPerTrigger=20_000, startingOffsets="latest")
    assert run_available_now(spark, opts, checkpoint) == []  # latest: old data is not read
    a.append(bodies(600, "new-a"), per_chunk=20)
    b.append(bodies(300, "new-b"), per_chunk=20)
    a.tier()
    b.tier()
    progress: list[dict[str, Any]] = []
    batches = run_available_now(spark, opts, checkpoint, progress)
    assert len(batches) >= 3  # ~90 kB of fragments in ~20 kB micro-batches
    # Offsets behind latest per stream, their min / max / mean over the streams.
    assert all(p["latestOffset"] == {"a": 700, "v/b": 300} for p in progress), progress
    first_end = progress[0]["endOffset"]
    behind = [700 - first_end["a"], 300 - first_end["v/b"]]
    assert max(behind) > 0, first_end
    assert source_metrics(progress[0]) == {
        AVG: str(sum(behind) / 2),
        MAX: str(max(behind)),
        MIN: str(min(behind)),
    }
    assert source_metrics(progress[-1]) == {AVG: "0.0", MAX: "0", MIN: "0"}
    rows = [row for batch in batches for row in batch]
    assert sorted(rows) == sorted(expected(a, 100) + expected(b))
    assert len(rows) == len(set(rows))
    assert {r[0] for r in batches[0]} == {"a", "v/b"}  # round-robin between the streams


# -- no Spark: offsets, limits, retention -----------------------------------------------------


def test_limit_rows_shares_fairly() -> None:
    pos = {"a": 0, "b": 10, "c": 5}
    heads = {"a": 1000, "b": 12, "c": 5}
    assert limit_rows(pos, heads, 100) == {"a": 98, "b": 12, "c": 5}
    assert limit_rows(pos, heads, 1) == {"a": 1, "b": 10, "c": 5}
    assert limit_rows(pos, heads, 10_000) == {"a": 1000, "b": 12, "c": 5}
    assert limit_rows(pos, {"a": 0, "b": 10, "c": 5}, 7) == pos


def test_limit_bytes_whole_fragments_round_robin() -> None:
    def frag(first: int, nxt: int, size: int) -> FragmentEntry:
        return FragmentEntry(f"k{first}", first, nxt, 0, 0, size, 1)

    queues = {
        "a": [frag(0, 10, 100), frag(10, 20, 100), frag(20, 30, 100)],
        "b": [frag(5, 8, 500)],
    }
    pos, heads = {"a": 3, "b": 5}, {"a": 30, "b": 8}
    assert limit_bytes(pos, heads, queues, 250) == {"a": 20, "b": 5}
    assert limit_bytes(pos, heads, queues, 700) == {"a": 20, "b": 8}
    assert limit_bytes(pos, heads, queues, 800) == {"a": 30, "b": 8}
    # A fragment larger than the limit is still read, alone: the query always advances.
    assert limit_bytes(pos, heads, {"b": queues["b"]}, 10) == {"a": 3, "b": 8}
    assert limit_bytes(pos, heads, {}, 10) == pos


def test_reader_offsets_and_retention_overtaking(tiered_bucket: TieredBucket) -> None:
    stream = tiered_bucket.add_stream("kept")
    stream.append(bodies(600, "r"), per_chunk=20)
    stream.tier()
    opts: dict[str, Any] = tiered_bucket.options(stream)
    reader = TierlogStreamReader(parse_options(opts))
    assert reader.initialOffset() == {"kept": 0}
    assert reader.latestOffset({"kept": 0}, ReadAllAvailable()) == {"kept": 600}
    assert reader.latestOffset({"kept": 0}, ReadMaxRows(50)) == {"kept": 50}
    assert reader.latestOffset({"kept": 590}, ReadMaxBytes(1)) == {"kept": 600}
    assert reader.partitions({"kept": 600}, {"kept": 600}) == []
    tasks = [p.value for p in reader.partitions({"kept": 0}, {"kept": 600})]
    assert tasks[0].fragments[0].first_offset == 0
    assert tasks[-1].fragments[-1].next_offset == 600
    # availableNow: data committed after the trigger started is not read.
    reader.prepareForTriggerAvailableNow()
    stream.append(bodies(40, "after"))
    stream.tier()
    assert reader.latestOffset({"kept": 0}, ReadAllAvailable()) == {"kept": 600}
    assert TierlogStreamReader(parse_options(opts)).reportLatestOffset() == {"kept": 640}

    # Retention removes the oldest fragments under a running query's position.
    stream.tierer.set_retention(RetentionPolicy(max_bytes=20_000))
    first = stream.tierer.apply_retention()
    assert first is not None and first > 0
    with pytest.raises(OffsetOvertakenError, match="removed by retention"):
        reader.partitions({"kept": 0}, {"kept": 640})
    skipping = TierlogStreamReader(parse_options({**opts, "onExpired": "skip"}))
    tasks = [p.value for p in skipping.partitions({"kept": 0}, {"kept": 640})]
    assert tasks[0].fragments[0].first_offset == first
    assert skipping.initialOffset() == {"kept": first}
    latest = TierlogStreamReader(parse_options({**opts, "startingOffsets": "latest"}))
    assert latest.initialOffset() == {"kept": 640}
    connections.close_all()


def test_source_metrics_of_progress_entries() -> None:
    """Offsets as JSON text (pyspark's ``SourceProgress``) or parsed (``lastProgress``
    JSON), a stream ahead of ``latestOffset`` counted as 0, nothing without a latest."""
    text = {"endOffset": '{"a": 10, "b": 4}', "latestOffset": '{"a": 25, "b": 4}'}
    assert source_metrics(text) == {AVG: "7.5", MAX: "15", MIN: "0"}
    parsed = {"endOffset": {"a": 30}, "latestOffset": {"a": 25}}
    assert source_metrics(parsed) == {AVG: "0.0", MAX: "0", MIN: "0"}
    assert source_metrics({"endOffset": {"a": 1}, "latestOffset": None}) == {}
    assert source_metrics({"endOffset": "not json", "latestOffset": {"a": 1}}) == {}
