"""Benchmark: ``spark.read.format("tierlog")`` against Parquet holding the same rows.

2,000,000 records of 100 bytes (random bytes, 1,000 per chunk, appended at a steady pace so
chunk timestamps spread evenly) are tiered with 1 MiB fragments twice, as two identical
streams: one on SeaweedFS (started here on loopback, stopped at the end), one on the
filesystem store. The same rows (stream, offset, chunk_id, timestamp, epoch, body; written by
Spark from a tierlog read, snappy) go to Parquet.

Spark's Parquet reader needs the S3A connector (hadoop-aws + the AWS SDK jars), which is not
available offline here, so the Parquet files are written into the filesystem store's
directory and read from local disk, and the like-for-like ratio uses the tierlog stream on
that same filesystem store. The SeaweedFS stream's figures are printed too.

Measured in one Spark session (local[2]), each figure the best of ``--repeat`` runs after a
warm-up (Python workers started): ``count()`` and a full scan to the ``noop`` sink for
tierlog (fs and SeaweedFS) and Parquet; a query selecting 1 % of the time range on the
SeaweedFS stream with filter pushdown, counting the fragments its tasks read.

The tail-inclusive read: a ``tierlog serve`` (started here, filesystem store) gets
``--tail-records`` 100-byte records in two streams, published over the stream protocol. One
stream is tiered completely; the other has its last 10 % published after its tiering was
slowed to an hour (``PATCH /api/streams``, then a server restart: a running tierer keeps
its settings), so they stay in the server's local log. Both are
scanned to ``noop`` with the ``server`` option, alternating, the median of ``--tail-rounds``
each: the second read takes 90 % from the remote tier and 10 % through the server.

Last line: ``scan_ratio=<tierlog rows/s ÷ parquet rows/s> pruned_fraction=<fragments read ÷
fragments total for the 1 % query> tail_ratio=<rows/s with 10 % in the un-tiered tail ÷
rows/s fully tiered>``.

    .venv/bin/python benches/spark_read.py [--records 2000000] [--tail-records 1000000]
        [--repeat 2] [--tail-rounds 7]
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tests.plugins.seaweed import start_seaweed
from tests.plugins.spark import TieredBucket, build_spark, s3_test_environment, s3_uri
from tests.plugins.tierlog_server import TierlogServerProcess

from tierlog.log.config import LogConfig
from tierlog.spark.client import StreamClient
from tierlog.spark.options import parse_options
from tierlog.spark.planning import load_tree, plan_read, plan_stream
from tierlog.spark.reading import traced_reads
from tierlog.tiering.state import TieringConfig

RECORD_SIZE = 100
PER_CHUNK = 1000
LOG = LogConfig(max_segment_bytes=128 * 1024 * 1024)
FRAGMENT = TieringConfig(fragment_bytes=1024 * 1024, max_fragment_age=5.0, max_uploads=4)


def fill(bucket: TieredBucket, records: int, pace_s: float) -> int:
    """Append and tier ``records`` random 100-byte records; the number of fragments."""
    stream = bucket.add_stream("bench", tiering=FRAGMENT, log_config=LOG)
    started = time.perf_counter()
    for n in range(records // PER_CHUNK):
        data = os.urandom(RECORD_SIZE * PER_CHUNK)
        chunk = [data[i * RECORD_SIZE : (i + 1) * RECORD_SIZE] for i in range(PER_CHUNK)]
        stream.log.append_records(chunk)
        wait = started + (n + 1) * pace_s - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
    stream.tier()
    tree = load_tree(bucket.catalog, bucket.store, bucket.prefix, stream.record.incarnation)
    return tree.header().total_fragments


def best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


TAIL_ARGS = {
    "x-tierlog-fragment-bytes": str(1024 * 1024),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.1",
}
PUBLISH_BATCH = 1000


def publish(server: TierlogServerProcess, stream: str, count: int, publisher: int) -> None:
    """``count`` random 100-byte records, ``PUBLISH_BATCH`` per confirm round."""
    offsets = np.arange(PUBLISH_BATCH + 1, dtype=np.int64) * RECORD_SIZE
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.declare_publisher(publisher, stream)
        for lo in range(0, count, PUBLISH_BATCH):
            n = min(PUBLISH_BATCH, count - lo)
            data = np.frombuffer(os.urandom(RECORD_SIZE * n), dtype=np.uint8)
            ids = np.arange(lo + 1, lo + n + 1, dtype=np.uint64)
            client.publish(publisher, ids, offsets[: n + 1], data)
        client.wait_for_confirms(publisher)


def server_options(server: TierlogServerProcess, stream: str) -> dict[str, str]:
    data = server.data_dir
    return {
        "stream": stream,
        "objectStore": f"file://{data / 'objects'}",
        "metaStore": f"sqlite://{data / 'meta.db'}",
    }


def tiered_next(server: TierlogServerProcess, stream: str) -> int:
    plans = plan_read(parse_options(server_options(server, stream)))
    return plans[0].next_offset


def wait_tiered(server: TierlogServerProcess, stream: str, count: int) -> None:
    deadline = time.monotonic() + 600
    while tiered_next(server, stream) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stream}: only {tiered_next(server, stream)} of {count} tiered")
        time.sleep(0.5)


def slow_down_tiering(server: TierlogServerProcess, stream: str) -> None:
    body = {"arguments": {"x-tierlog-max-fragment-age": "3600s"}}
    body["arguments"]["x-tierlog-fragment-bytes"] = str(1 << 30)
    request = urllib.request.Request(
        f"{server.admin_url}/api/streams/{stream}",
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, response.read()


def tail_bench(spark, work: Path, records: int, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """rows/s of a read with 10 % of its rows in the un-tiered tail ÷ fully tiered."""
    server = TierlogServerProcess(work / "server" / "data").start()
    try:
        with StreamClient.connect(server.host, server.stream_port) as client:
            client.create_stream("tiered", TAIL_ARGS)
            client.create_stream("tailed", TAIL_ARGS)
        started = time.perf_counter()
        publish(server, "tiered", records, 1)
        head = records - records // 10
        publish(server, "tailed", head, 2)
        wait_tiered(server, "tiered", records)
        wait_tiered(server, "tailed", head)
        slow_down_tiering(server, "tailed")
        server.restart()  # a running stream's tierer keeps its settings until reopened
        publish(server, "tailed", records - head, 3)
        in_tier = tiered_next(server, "tailed")
        print(
            f"tail bench: {records} records published twice in "
            f"{time.perf_counter() - started:.1f}s; 'tailed' has {in_tier} tiered, "
            f"{records - in_tier} in the un-tiered tail"
        )
        address = f"{server.host}:{server.stream_port}"

        def read(stream: str):  # type: ignore[no-untyped-def]
            opts = server_options(server, stream)
            return spark.read.format("tierlog").options(**opts, server=address).load()

        assert read("tiered").count() == records == read("tailed").count()  # warm-up
        times: dict[str, list[float]] = {"tiered": [], "tailed": []}
        for _ in range(rounds):  # alternating: load from other processes hits both alike
            for stream in times:
                times[stream].append(
                    best(1, lambda s=stream: read(s).write.format("noop").mode("overwrite").save())
                )
        rates = {stream: records / statistics.median(t) for stream, t in times.items()}
        assert tiered_next(server, "tailed") == in_tier, "the tail was tiered during the bench"
        for stream, rate in rates.items():
            spread = " ".join(f"{x:.2f}" for x in times[stream])
            print(
                f"tierlog via server, {stream:6s} scan  median {rate / 1e6:5.2f} M rows/s "
                f"(rounds: {spread} s)"
            )
        return rates["tailed"] / rates["tiered"]
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--tail-records", type=int, default=1_000_000)
    parser.add_argument("--tail-rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    records = args.records
    s3_test_environment()
    work = Path(tempfile.mkdtemp(prefix="tierlog-spark-bench-"))
    server = start_seaweed(work / "seaweed")
    spark = None
    buckets: list[TieredBucket] = []
    try:
        (work / "s3").mkdir()
        (work / "fs").mkdir()
        s3 = TieredBucket(work / "s3", s3_uri(server))
        fs = TieredBucket(work / "fs", f"file://{work / 'fs' / 'objects'}")
        buckets += [s3, fs]
        pace = 0.004  # 2,000 chunks over ~8 s: timestamps spread evenly
        t0 = time.perf_counter()
        s3_fragments = fill(s3, records, pace)
        fs_fragments = fill(fs, records, pace)
        print(
            f"tiered {records} records twice in {time.perf_counter() - t0:.1f}s: "
            f"{s3_fragments} fragments on SeaweedFS, {fs_fragments} on the filesystem store"
        )
        spark = build_spark("tierlog-spark-bench")

        def tierlog(bucket: TieredBucket, **extra: object):  # type: ignore[no-untyped-def]
            opts = bucket.options(bucket.streams[0], **extra)
            return spark.read.format("tierlog").options(**opts).load()

        parquet_dir = work / "fs" / "objects" / "parquet"
        tierlog(fs).write.mode("overwrite").parquet(str(parquet_dir))
        parquet_bytes = sum(p.stat().st_size for p in parquet_dir.glob("*.parquet"))
        files = len(list(parquet_dir.glob("*.parquet")))
        print(f"parquet: {files} files, {parquet_bytes / 1e6:.1f} MB in {parquet_dir}")

        def scan(df) -> None:  # type: ignore[no-untyped-def]
            df.write.format("noop").mode("overwrite").save()

        def parquet():  # type: ignore[no-untyped-def]
            return spark.read.parquet(str(parquet_dir))

        assert tierlog(fs).count() == records == parquet().count()  # warm-up
        results: dict[str, float] = {}
        results["tierlog_fs_count"] = best(args.repeat, lambda: tierlog(fs).count())
        results["tierlog_fs_scan"] = best(args.repeat, lambda: scan(tierlog(fs)))
        results["parquet_count"] = best(args.repeat, lambda: parquet().count())
        results["parquet_scan"] = best(args.repeat, lambda: scan(parquet()))
        results["tierlog_s3_count"] = best(args.repeat, lambda: tierlog(s3).count())
        results["tierlog_s3_scan"] = best(args.repeat, lambda: scan(tierlog(s3)))
        for name, seconds in results.items():
            rate = records / seconds
            print(f"{name:18s} {seconds:7.2f} s  {rate / 1e6:6.2f} M rows/s")
        partitions = tierlog(fs).rdd.getNumPartitions()
        print(
            f"tierlog input partitions: {partitions}; parquet: {parquet().rdd.getNumPartitions()}"
        )

        # 1 % of the time range, on the SeaweedFS stream, with pushdown.
        stream = s3.streams[0]
        tree = load_tree(s3.catalog, s3.store, s3.prefix, stream.record.incarnation)
        header = tree.header()
        span = header.max_timestamp - header.min_timestamp
        lo_ms = header.min_timestamp + span // 2
        hi_ms = lo_ms + max(1, span // 100)
        lo = dt.datetime.fromtimestamp(lo_ms / 1000, tz=dt.UTC)
        hi = dt.datetime.fromtimestamp(hi_ms / 1000, tz=dt.UTC)
        trace = work / "trace"
        trace.mkdir()
        from pyspark.sql import functions as F

        query = tierlog(s3, traceDir=trace).where(
            (F.col("timestamp") >= F.lit(lo)) & (F.col("timestamp") < F.lit(hi))
        )
        started = time.perf_counter()
        selected = query.count()
        elapsed = time.perf_counter() - started
        read = len(traced_reads(str(trace)))
        manifest_view = plan_stream("bench", tree, s3.store.get)
        total = len(manifest_view.fragments)
        print(
            f"1% time range: {selected} rows in {elapsed:.2f} s, {read} of {total} fragments read"
        )
        scan_ratio = (records / results["tierlog_fs_scan"]) / (records / results["parquet_scan"])
        s3_ratio = (records / results["tierlog_s3_scan"]) / (records / results["parquet_scan"])
        print(f"tierlog on SeaweedFS vs parquet on local disk: {s3_ratio:.3f}")
        tail_ratio = tail_bench(spark, work, args.tail_records, args.tail_rounds)
        print(
            f"scan_ratio={scan_ratio:.3f} pruned_fraction={read / total:.4f} "
            f"tail_ratio={tail_ratio:.3f}"
        )
    finally:
        if spark is not None:
            spark.stop()
        for bucket in buckets:
            bucket.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
