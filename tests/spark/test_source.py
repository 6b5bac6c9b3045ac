"""The batch source ``spark.read.format("tierlog")`` on real Spark (local[2]) against tiered
streams on the filesystem store and on SeaweedFS: the read equals what the streams hold,
filter pushdown prunes fragments (counted by marker files the tasks write), fragments removed
after planning fail or are skipped, AMQP columns, and the plan itself (no Spark)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.plugins.spark import Record, TieredBucket, TieredStream
from tierlog.errors import ConfigError
from tierlog.formats.amqp import encode_message
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.manifest_walk import Bounds
from tierlog.spark import connections
from tierlog.spark.options import StreamName, parse_options
from tierlog.spark.planning import (
    coalesce,
    load_tree,
    plan_read,
    plan_stream,
)
from tierlog.spark.reading import traced_reads
from tierlog.spark.session import FILTER_PUSHDOWN_CONF, register

pytestmark = pytest.mark.spark


def bodies(n: int, tag: str, size: int = 100) -> list[bytes]:
    return [f"{tag}-{i:08d}-".encode().ljust(size, b"x") for i in range(n)]


def rows_of(df: DataFrame) -> list[tuple[Any, ...]]:
    """(stream, offset, chunk_id, timestamp ms, epoch, body), sorted."""
    table = df.select("stream", "offset", "chunk_id", "timestamp", "epoch", "body").toArrow()
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()  # UTC microseconds
    out = [
        (s, o, c, t // 1000, e, b)
        for s, o, c, t, e, b in zip(
            table.column("stream").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("chunk_id").to_pylist(),
            ts,
            table.column("epoch").to_pylist(),
            table.column("body").to_pylist(),
            strict=True,
        )
    ]
    return sorted(out)


def expected(stream: TieredStream, records: list[Record]) -> list[tuple[Any, ...]]:
    return sorted(
        (stream.display, r.offset, r.chunk_id, r.timestamp, r.epoch, r.body) for r in records
    )


def read(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    return spark.read.format("tierlog").options(**options).load()


def fragments(bucket: TieredBucket, stream: TieredStream, bounds: Bounds = Bounds()) -> list[int]:
    """First offsets of the fragments a plan with ``bounds`` names (the manifest's view)."""
    tree = load_tree(bucket.catalog, bucket.store, bucket.prefix, stream.record.incarnation)
    plan = plan_stream(stream.display, tree, bucket.store.get, bounds)
    return [f.first_offset for f in plan.fragments]


def traced(trace: Path) -> list[int]:
    return [offset for _, offset in traced_reads(str(trace))]


@pytest.fixture
def two_streams(tiered_bucket: TieredBucket) -> tuple[TieredBucket, TieredStream, TieredStream]:
    orders = tiered_bucket.add_stream("orders")
    clicks = tiered_bucket.add_stream("clicks", vhost="shop")
    for i in range(6):  # distinct chunk timestamps between groups of fragments
        orders.append(bodies(200, f"o{i}"), per_chunk=20, pause=0.004)
    clicks.append(bodies(300, "c", size=40), per_chunk=30)
    orders.tier()
    clicks.tier()
    return tiered_bucket, orders, clicks


def test_batch_read_equals_the_streams(
    spark: SparkSession,
    two_streams: tuple[TieredBucket, TieredStream, TieredStream],
    tmp_path: Path,
) -> None:
    bucket, orders, clicks = two_streams
    trace = tmp_path / "trace"
    trace.mkdir()
    opts = bucket.options(orders, clicks, targetPartitionBytes=40_000, traceDir=trace)
    df = read(spark, opts)
    assert df.rdd.getNumPartitions() > 2  # coalesced runs of ~40 kB, both streams
    got = rows_of(df)
    assert got == expected(orders, orders.records()) + expected(clicks, clicks.records())
    # Every fragment of both manifests was read exactly once.
    total = len(fragments(bucket, orders)) + len(fragments(bucket, clicks))
    assert len(traced(trace)) == total
    # A later append is not in an earlier plan's range, and is in a new read once tiered.
    orders.append(bodies(40, "late"))
    orders.tier()
    assert read(spark, bucket.options(orders)).count() == 1240


def test_pushdown_prunes_fragments(
    spark: SparkSession,
    two_streams: tuple[TieredBucket, TieredStream, TieredStream],
    tmp_path: Path,
) -> None:
    bucket, orders, clicks = two_streams
    all_fragments = fragments(bucket, orders)
    assert len(all_fragments) >= 12
    (tmp_path / "a").mkdir()
    df = read(spark, bucket.options(orders, clicks, traceDir=tmp_path / "a"))
    lo, hi = 410, 530
    narrowed = df.where((F.col("offset") >= lo) & (F.col("offset") < hi))
    narrowed = narrowed.where(F.col("stream") == "orders")
    assert rows_of(narrowed) == expected(orders, orders.records(lo, hi))
    wanted = fragments(bucket, orders, Bounds(min_offset=lo, max_offset=hi - 1))
    assert traced(tmp_path / "a") == wanted  # only those, each once; no clicks fragment
    assert 0 < len(wanted) <= 3 < len(all_fragments)

    # Timestamps: from the 5th group of appends on.
    records = orders.records()
    cut_ms = records[800].timestamp
    cut = dt.datetime.fromtimestamp(cut_ms / 1000, tz=dt.UTC)
    (tmp_path / "b").mkdir()
    later = read(spark, bucket.options(orders, traceDir=tmp_path / "b"))
    got = rows_of(later.where(F.col("timestamp") >= F.lit(cut)))
    assert got == expected(orders, [r for r in records if r.timestamp >= cut_ms])
    wanted = fragments(bucket, orders, Bounds(min_ts=cut_ms))
    assert traced(tmp_path / "b") == wanted
    assert len(wanted) < len(all_fragments)


def test_works_with_pushdown_flag_off(
    spark: SparkSession,
    two_streams: tuple[TieredBucket, TieredStream, TieredStream],
    tmp_path: Path,
) -> None:
    bucket, orders, _ = two_streams
    (tmp_path / "t").mkdir()
    opts = bucket.options(orders, startOffset=400, endOffset=500, traceDir=tmp_path / "t")
    try:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "false")
        # A reader with pushFilters fails every read with the flag off (pyspark's rule) ...
        with pytest.raises(PySparkException, match=r"PUSHDOWN_DISABLED|filterPushdown"):
            read(spark, opts).count()
        # ... so without the flag the plain source is registered, and options prune instead.
        register(spark, filter_pushdown=False)
        df = read(spark, opts).where(F.col("offset") % 2 == 0)
        assert rows_of(df) == expected(orders, orders.records(400, 500)[::2])
        assert traced(tmp_path / "t") == fragments(bucket, orders, Bounds(400, 499))
    finally:
        register(spark)
    assert spark.conf.get(FILTER_PUSHDOWN_CONF) == "true"


def test_fragment_removed_after_planning(
    spark: SparkSession, two_streams: tuple[TieredBucket, TieredStream, TieredStream]
) -> None:
    bucket, orders, _ = two_streams
    tree = load_tree(bucket.catalog, bucket.store, bucket.prefix, orders.record.incarnation)
    plan = plan_stream("orders", tree, bucket.store.get)
    gone = plan.fragments[3]
    # Retention deletes the object while the manifest this read planned from still names it.
    bucket.store.delete(gone.key)
    with pytest.raises(Exception, match="removed after the read was planned") as info:
        read(spark, bucket.options(orders)).count()
    assert "FragmentExpiredError" in str(info.value)
    df = read(spark, bucket.options(orders, onExpired="skip"))
    kept = [r for r in orders.records() if not gone.first_offset <= r.offset < gone.next_offset]
    assert rows_of(df) == expected(orders, kept)


def test_amqp_columns(spark: SparkSession, tiered_bucket: TieredBucket) -> None:
    stream = tiered_bucket.add_stream("amqp")
    created = 1_700_000_000_123
    messages = [
        encode_message(b"plain body"),
        encode_message(
            b"with props",
            properties={"message_id": "m-1", "subject": "s", "creation_time": created},
            application_properties={"region": "eu", "n": 7, "ok": True},
        ),
        b"raw bytes, not a message",
    ]
    stream.append(messages * 5, per_chunk=3)
    stream.tier()
    df = read(spark, tiered_bucket.options(stream, includeAmqp=True)).where(F.col("offset") < 3)
    rows = sorted(df.collect(), key=lambda r: r["offset"])
    plain, props, raw = rows
    assert plain["message_body"] == b"plain body" and plain["properties"] is None
    assert props["message_body"] == b"with props"
    assert props["properties"]["message_id"] == "m-1"
    assert props["properties"]["subject"] == "s"
    created_at = props["properties"]["creation_time"].replace(tzinfo=dt.UTC)
    assert created_at == dt.datetime.fromtimestamp(created / 1000, tz=dt.UTC)
    assert props["application_properties"] == {"region": "eu", "n": "7", "ok": "true"}
    assert raw["message_body"] is None and raw["body"] == messages[2]
    assert [r["body"] for r in rows] == messages


def test_unknown_stream_and_bad_options_fail_at_planning(
    spark: SparkSession, tiered_bucket: TieredBucket
) -> None:
    opts = tiered_bucket.options()
    opts["streams"] = "missing"
    with pytest.raises(Exception, match="no stream 'missing'"):
        read(spark, opts).count()
    opts["stream"] = opts.pop("streams")
    opts["onExpired"] = "ignore"
    with pytest.raises(Exception, match="onExpired"):
        read(spark, opts).count()


# -- no Spark: options and planning -----------------------------------------------------------


def test_a_mistyped_option_is_refused_with_the_closest_name() -> None:
    base = {"objectStore": "file:///x", "metaStore": "sqlite:///m.db", "stream": "a"}
    with pytest.raises(ConfigError) as typo:
        parse_options({**base, "startingoffset": "earliest"})
    assert "'startingoffset' (did you mean 'startingOffsets'?)" in str(typo.value)
    with pytest.raises(ConfigError) as unlike:
        parse_options({**base, "zzz": "1"})
    assert "'zzz'" in str(unlike.value) and "did you mean" not in str(unlike.value)


def test_parse_options() -> None:
    base = {"objectStore": "file:///x", "metaStore": "sqlite:///m.db"}
    opts = parse_options({**base, "STREAMS": "a, shop/b, /c/d", "includeAmqp": "TRUE"})
    assert opts.streams == (
        StreamName("/", "a"),
        StreamName("shop", "b"),
        StreamName("/c", "d"),
    )
    assert opts.stream_names == ("a", "shop/b", "/c/d")
    assert opts.include_amqp and opts.on_expired == "fail"
    assert opts.target_partition_bytes == 64 * 1024 * 1024
    assert (
        parse_options({**base, "stream": "a", "targetPartitionBytes": "0"}).target_partition_bytes
        == 0
    )
    settings = parse_options({**base, "stream": "a", "objectStore.max_concurrency": "4"})
    assert settings.store_settings == (("max_concurrency", "4"),)
    start = parse_options({**base, "streams": "a,b", "startingOffsets": '{"b": 5}'})
    assert start.starting_offsets.mode == "offsets" and dict(start.starting_offsets.offsets) == {
        "b": 5
    }
    bad: list[dict[str, str]] = [
        {**base},
        {**base, "stream": "a", "streams": "b"},
        {"stream": "a", "metaStore": "sqlite:///m.db"},
        {**base, "stream": "a", "typo": "1"},
        {**base, "stream": "a", "maxRecordsPerTrigger": "0"},
        {**base, "stream": "a", "maxRecordsPerTrigger": "5", "maxBytesPerTrigger": "5"},
        {**base, "stream": "a/../b"},
        {**base, "streams": "a,a"},
        {**base, "stream": "a", "startingOffsets": '{"zz": 1}'},
        {**base, "stream": "a", "startingOffsets": "soon"},
        {**base, "stream": "a", "verifyCrc": "maybe"},
        {**base, "stream": "a", "startOffset": "-1"},
    ]
    for raw in bad:
        with pytest.raises(ConfigError):
            parse_options(raw)


def test_plan_descends_only_into_needed_branches(tiered_bucket: TieredBucket) -> None:
    stream = tiered_bucket.add_stream("deep")
    stream.append(bodies(2400, "d"), per_chunk=20)
    stream.tier()
    store, catalog = tiered_bucket.store, tiered_bucket.catalog
    tree = load_tree(catalog, store, tiered_bucket.prefix, stream.record.incarnation)
    assert tree.height >= 3  # m=4: fragments fold into groups and kgroups
    full = plan_stream("deep", tree, store.get)
    assert [f.first_offset for f in full.fragments] == sorted(
        f.first_offset for f in full.fragments
    )
    assert full.fragments[0].first_offset == 0 and full.fragments[-1].next_offset == 2400
    assert all(a.next_offset == b.first_offset for a, b in itertools.pairwise(full.fragments))
    assert len(full.fragments) == full.total_fragments
    # One offset: one path from the root down (at most one branch per level).
    one = plan_stream("deep", tree, store.get, Bounds(min_offset=1234, max_offset=1234))
    assert len(one.fragments) == 1
    assert one.fragments[0].first_offset <= 1234 < one.fragments[0].next_offset
    assert one.branch_loads <= tree.height - 1 < full.branch_loads
    # Nothing at all: no branch is loaded.
    none = plan_stream("deep", tree, store.get, Bounds(min_offset=5000))
    assert none.fragments == [] and none.branch_loads == 0
    # Coalescing keeps order and covers every fragment once.
    tasks = coalesce(full, Bounds(), target_bytes=30_000)
    flat: list[FragmentEntry] = [f for t in tasks for f in t.fragments]
    assert flat == full.fragments
    assert all(t.data_size - t.fragments[-1].data_size < 30_000 for t in tasks)
    assert len(coalesce(full, Bounds(), target_bytes=0)) == len(full.fragments)


def test_plan_read_of_an_empty_and_a_deleted_stream(tiered_bucket: TieredBucket) -> None:
    empty = tiered_bucket.add_stream("empty")
    opts = parse_options(tiered_bucket.options(empty))
    (plan,) = plan_read(opts)
    assert plan.fragments == [] and plan.next_offset == 0
    tiered_bucket.catalog.delete("/", "empty")
    with pytest.raises(Exception, match="no stream 'empty'"):
        plan_read(opts)
    connections.close_all()


def test_trace_dir_is_written_per_fragment(tmp_path: Path) -> None:
    from tierlog.spark.reading import _trace

    fragment = FragmentEntry("k", 7, 9, 0, 0, 1, 1)
    _trace(str(tmp_path), "inc_1", fragment)
    _trace(str(tmp_path), "inc_1", fragment)
    assert traced_reads(str(tmp_path)) == [("inc_1", 7), ("inc_1", 7)]
    assert len(os.listdir(tmp_path)) == 2
