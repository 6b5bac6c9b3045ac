"""Benchmark: ``tierlog spark export`` (Iceberg and Parquet) against Spark writing the same
rows to Parquet.

2,000,000 records of 100 random bytes, 1,000 per chunk, are tiered with 1 MiB fragments to
the filesystem store (SQLite MetaStore). In one Spark session (local[2]), rounds alternate:

* ``iceberg``: ``run_iceberg_export`` into a fresh embedded SQL catalog (read the stream,
  write day-partitioned Parquet, commit with pyiceberg ``add_files``),
* ``parquet``: ``run_export`` into a fresh directory (read, write, export state),
* ``spark``: the same rows, already in a cached DataFrame (the tierlog columns plus the day
  column, materialised before the rounds), written by Spark to Parquet as is,
* ``spark_by_day``: the same, partitioned by day like the exports (``partitionBy``).

Each figure is the median of ``--rounds`` rounds after a warm-up round. The tierlog exports
include reading the stream from the remote tier; the Spark baseline does not.

Last line: ``export_ratio=<Iceberg export rows/s ÷ Spark Parquet write rows/s>``, against
the faster of the two Spark writes; the lines before it give the Parquet export's ratio and
both against the day-partitioned write.

    .venv/bin/python benches/spark_export.py [--records 2000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.plugins.spark import TieredBucket, build_spark

from tierlog.log.config import LogConfig
from tierlog.spark.jobs.common import Progress, RemoteTier
from tierlog.spark.jobs.export import DATE_COLUMN, run_export
from tierlog.spark.jobs.iceberg_catalog import catalog_config, open_catalog
from tierlog.spark.jobs.iceberg_export import run_iceberg_export
from tierlog.tiering.state import TieringConfig

RECORD_SIZE = 100
PER_CHUNK = 1000
LOG = LogConfig(max_segment_bytes=128 * 1024 * 1024)
FRAGMENT = TieringConfig(fragment_bytes=1024 * 1024, max_fragment_age=5.0, max_uploads=4)


def fill(bucket: TieredBucket, records: int) -> None:
    stream = bucket.add_stream("bench", tiering=FRAGMENT, log_config=LOG)
    for _ in range(records // PER_CHUNK):
        data = os.urandom(RECORD_SIZE * PER_CHUNK)
        stream.log.append_records(
            [data[i * RECORD_SIZE : (i + 1) * RECORD_SIZE] for i in range(PER_CHUNK)]
        )
    stream.tier()


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    records = args.records
    work = Path(tempfile.mkdtemp(prefix="tierlog-export-bench-"))
    spark = None
    bucket = None
    try:
        (work / "fs").mkdir()
        bucket = TieredBucket(work / "fs", f"file://{work / 'fs' / 'objects'}")
        started = time.perf_counter()
        fill(bucket, records)
        print(f"tiered {records} records in {time.perf_counter() - started:.1f}s")
        spark = build_spark("tierlog-export-bench")
        tier = RemoteTier.create(bucket.store_uri, bucket.meta_uri, bucket.prefix)
        quiet = Progress("export", out=open(os.devnull, "w"))  # noqa: SIM115

        from pyspark.sql import functions as F

        day = F.expr("date_from_unix_date(cast(floor(unix_millis(timestamp) / 86400000) as int))")
        cached = (
            spark.read.format("tierlog")
            .options(**bucket.options(bucket.streams[0]))
            .load()
            .withColumn(DATE_COLUMN, day)
            .cache()
        )
        assert cached.count() == records

        counter = iter(range(1_000_000))

        def iceberg() -> None:
            config = catalog_config("sql", str(work / f"iceberg-{next(counter)}"))
            report = run_iceberg_export(spark, tier, config, progress=quiet)
            table = open_catalog(config).load_table(("tierlog", "bench"))
            assert report.tables and table.current_snapshot() is not None

        def parquet() -> None:
            out = work / f"parquet-{next(counter)}"
            assert run_export(spark, tier, str(out), progress=quiet).streams

        def spark_parquet() -> None:
            cached.write.parquet(str(work / f"spark-{next(counter)}"))

        def spark_by_day() -> None:
            cached.write.partitionBy(DATE_COLUMN).parquet(str(work / f"spark-{next(counter)}"))

        runs = {
            "iceberg": iceberg,
            "parquet": parquet,
            "spark": spark_parquet,
            "spark_by_day": spark_by_day,
        }
        for run in runs.values():  # warm-up (Python workers, JIT, catalog code)
            run()
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                times[name].append(timed(run))
        rates = {name: records / statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            spread = " ".join(f"{x:.2f}" for x in t)
            print(
                f"{name:12s} median {statistics.median(t):6.2f} s  "
                f"{rates[name] / 1e6:5.2f} M rows/s  (rounds: {spread})"
            )
        baseline = max(rates["spark"], rates["spark_by_day"])
        by_day = rates["spark_by_day"]
        print(
            f"against the day-partitioned Spark write: iceberg {rates['iceberg'] / by_day:.3f}, "
            f"parquet {rates['parquet'] / by_day:.3f}"
        )
        print(f"parquet_export_ratio={rates['parquet'] / baseline:.3f}")
        print(f"export_ratio={rates['iceberg'] / baseline:.3f}")
    finally:
        if spark is not None:
            spark.stop()
        if bucket is not None:
            bucket.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
