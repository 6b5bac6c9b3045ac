"""The Kafka source's option names on the tierlog source: each one does what it does in
Kafka (checked against the local log), and names that would do nothing are refused."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from tests.plugins.spark import TieredBucket, TieredStream
from tierlog.errors import ConfigError
from tierlog.spark import connections
from tierlog.spark.batch import TierlogDataSource
from tierlog.spark.options import EARLIEST, LATEST, parse_options
from tierlog.spark.streaming import TierlogStreamReader
from tierlog.tiering.retention import RetentionPolicy

pytestmark = pytest.mark.spark

BASE = {"objectStore": "file:///x", "metaStore": "sqlite:///m.db"}


def bodies(n: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() for i in range(n)]


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[TieredBucket]:
    bucket = TieredBucket(tmp_path, f"file://{tmp_path / 'objects'}")
    yield bucket
    bucket.close()
    connections.close_all()


def test_kafka_names_parse_to_the_same_settings() -> None:
    kafka = parse_options(
        {
            **BASE,
            "subscribe": "a,shop/b",
            "maxOffsetsPerTrigger": "100",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "2m",
            "failOnDataLoss": "false",
            "startingOffsets": '{"a": -2, "shop/b": 7}',
            "endingOffsets": '{"a": 50, "shop/b": -1}',
            "endingTimestamp": "99",
        }
    )
    assert kafka.stream_names == ("a", "shop/b")
    assert kafka.max_records_per_trigger == 100 and kafka.min_offsets_per_trigger == 10
    assert kafka.max_trigger_delay == 120.0 and kafka.on_expired == "skip"
    assert dict(kafka.starting_offsets.offsets) == {"a": EARLIEST, "shop/b": 7}
    assert dict(kafka.ending_offsets) == {"a": 50, "shop/b": LATEST}
    assert kafka.end_timestamp == 99
    assert parse_options({**BASE, "stream": "a", "failOnDataLoss": "true"}).on_expired == "fail"
    assert parse_options({**BASE, "subscribePattern": "ev.*"}).stream_pattern == "ev.*"
    assert parse_options({**BASE, "stream": "a", "maxTriggerDelay": "500ms",
                          "minOffsetsPerTrigger": "1"}).max_trigger_delay == 0.5  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"stream": "a", "kafka.bootstrap.servers": "h:9092"}, "objectStore and metaStore"),
        ({"stream": "a", "assign": "{}"}, "no tierlog equivalent"),
        ({"stream": "a", "includeHeaders": "true"}, "includeAmqp"),
        ({"stream": "a", "groupIdPrefix": "g"}, "consumer groups"),
        ({"stream": "a", "minPartitions": "8"}, "targetPartitionBytes"),
        ({"streams": "a", "subscribe": "b"}, "given twice"),
        ({"subscribe": "a", "subscribePattern": "b"}, "exactly one"),
        ({"subscribePattern": "("}, "not a regex"),
        ({"stream": "a", "maxOffsetsPerTrigger": "1", "maxRecordsPerTrigger": "1"}, "twice"),
        ({"stream": "a", "failOnDataLoss": "true", "onExpired": "skip"}, "disagree"),
        ({"stream": "a", "failOnDataLoss": "perhaps"}, "true or false"),
        ({"stream": "a", "maxTriggerDelay": "1m"}, "only applies with minOffsetsPerTrigger"),
        ({"stream": "a", "minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"}, "duration"),
        ({"stream": "a", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"}, "larger"),
        ({"stream": "a", "startingTimestamp": "5", "startingOffsets": "earliest"}, "not both"),
        ({"stream": "a", "startingOffsets": '{"a": -3}'}, "-2 or -1"),
        ({"stream": "a", "endingOffsets": '{"a": -2}'}, "or -1"),
        ({"stream": "a", "endingOffsets": "earliest"}, "read nothing"),
        ({"stream": "a", "endingOffsets": '{"b": 5}'}, "not read"),
        ({"stream": "a", "startingTimestamp": "-1"}, ">= 0"),
    ],
)
def test_bad_or_ineffective_options_are_refused(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_options({**BASE, **extra})


def test_options_that_do_nothing_in_this_kind_of_read_are_refused() -> None:
    source = TierlogDataSource({**BASE, "stream": "a", "maxOffsetsPerTrigger": "5"})
    with pytest.raises(ConfigError, match="only apply to streaming"):
        source.reader(source.schema())
    source = TierlogDataSource({**BASE, "stream": "a", "endingOffsets": '{"a": 5}'})
    with pytest.raises(ConfigError, match="only apply to batch"):
        source.streamReader(source.schema())
    source = TierlogDataSource({**BASE, "stream": "a", "startingOffsets": "latest"})
    with pytest.raises(ConfigError, match="streaming reads only"):
        source.reader(source.schema())


def fill(bucket: TieredBucket) -> tuple[TieredStream, TieredStream, int]:
    """Two streams; ``events`` gets 300 records, a pause, then 200 more: the timestamp
    returned is between the two parts."""
    events = bucket.add_stream("events")
    other = bucket.add_stream("other", vhost="v")
    events.append(bodies(300, "early"), per_chunk=20)
    time.sleep(0.02)
    cut = int(time.time() * 1000)
    time.sleep(0.02)
    events.append(bodies(200, "late"), per_chunk=20)
    other.append(bodies(120, "o"), per_chunk=20)
    events.tier()
    other.tier()
    return events, other, cut


def rows(spark: SparkSession, options: dict[str, str]) -> list[tuple[str, int, bytes]]:
    df = spark.read.format("tierlog").options(**options).load()
    return sorted((r["stream"], r["offset"], bytes(r["body"])) for r in df.collect())


def reference(stream: TieredStream, start: int = 0, end: int | None = None) -> list[Any]:
    return [(stream.display, r.offset, r.body) for r in stream.records(start, end)]


def test_batch_reads_with_kafka_options(spark: SparkSession, bucket: TieredBucket) -> None:
    events, other, cut = fill(bucket)
    opts = bucket.options(events, other)
    del opts["streams"]
    ranged = {
        **opts,
        "subscribe": "events,v/other",
        "startingOffsets": json.dumps({"events": 37, "v/other": EARLIEST}),
        "endingOffsets": json.dumps({"events": 410, "v/other": 100}),
    }
    assert rows(spark, ranged) == sorted(reference(events, 37, 410) + reference(other, 0, 100))
    pattern = {**opts, "subscribePattern": "ev.*", "startingTimestamp": str(cut)}
    assert rows(spark, pattern) == reference(events, 300)
    nothing = {**opts, "subscribePattern": "nomatch.*"}
    with pytest.raises(Exception, match="matches no stream"):
        rows(spark, nothing)


def test_streaming_start_points_trigger_sizes_and_data_loss(
    bucket: TieredBucket, caplog: pytest.LogCaptureFixture
) -> None:
    events, _other, cut = fill(bucket)
    opts = bucket.options(events)
    at_time = TierlogStreamReader(parse_options({**opts, "startingTimestamp": str(cut)}))
    assert at_time.initialOffset() == {"events": 300}
    future = TierlogStreamReader(parse_options({**opts, "startingTimestamp": str(2**41)}))
    assert future.initialOffset() == {"events": 500}
    mixed = parse_options({**opts, "startingOffsets": '{"events": -1}'})
    assert TierlogStreamReader(mixed).initialOffset() == {"events": 500}

    # minOffsetsPerTrigger: too few new offsets wait, until maxTriggerDelay has passed.
    waiting = TierlogStreamReader(
        parse_options({**opts, "minOffsetsPerTrigger": "150", "maxTriggerDelay": "300ms"})
    )
    assert waiting.latestOffset({"events": 400}, ReadAllAvailable()) == {"events": 400}
    assert waiting.latestOffset({"events": 0}, ReadMaxRows(120)) == {"events": 120}
    assert waiting.latestOffset({"events": 400}, ReadAllAvailable()) == {"events": 400}
    time.sleep(0.35)
    assert waiting.latestOffset({"events": 400}, ReadAllAvailable()) == {"events": 500}
    waiting.prepareForTriggerAvailableNow()  # availableNow never waits
    assert waiting.latestOffset({"events": 450}, ReadAllAvailable()) == {"events": 500}

    # failOnDataLoss=false skips what retention removed, and says how much.
    events.tierer.set_retention(RetentionPolicy(max_bytes=2_000))
    first = events.tierer.apply_retention()
    assert first is not None and first > 0
    strict = TierlogStreamReader(parse_options({**opts, "failOnDataLoss": "true"}))
    with pytest.raises(Exception, match="removed by retention"):
        strict.partitions({"events": 0}, {"events": 500})
    lenient = TierlogStreamReader(parse_options({**opts, "failOnDataLoss": "false"}))
    with caplog.at_level("WARNING"):
        tasks = [p.value for p in lenient.partitions({"events": 0}, {"events": 500})]
    assert tasks[0].fragments[0].first_offset == first
    lost = [r for r in caplog.records if "spark_stream_data_lost" in r.getMessage()]
    assert lost and f"offsets={first}" in lost[0].getMessage().replace(" ", ""), [
        r.getMessage() for r in lost
    ]
