"""The everything-on soak: three ``tierlog serve`` nodes on tmpfs data directories, etcd,
SeaweedFS behind the S3 fault proxy, about twenty streams of every kind, producers,
consumers and Spark, under a seeded schedule of faults; the oracle at the end.

    PYTHONPATH=src python scripts/soak.py --minutes 30 [--seed 7] [--faults a,b] [--no-fault kind]
    PYTHONPATH=src python scripts/soak.py --ci          # the test suite's bounded profile

Needs root (tmpfs mounts). Prints the per-fault table, the failed oracles and one final
line ``soak hours=.. nodes=3 streams=.. confirmed=.. lost=0 ...``; exits 1 when any
oracle failed (the work directory with every node's log is then kept).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.plugins.etcd import find_or_install_etcd, start_etcd, stop_process
from tests.plugins.seaweed import start_seaweed
from tests.plugins.spark import QUICK_JVM, build_spark
from tests.soak.mounts import MARK
from tests.soak.profile import FAULT_KINDS, ci_profile, long_profile, parse_faults
from tests.soak.run import run_soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--ci", action="store_true", help="the bounded CI profile")
    parser.add_argument(
        "--faults", help=f"comma-separated kinds (default all: {','.join(FAULT_KINDS)})"
    )
    parser.add_argument("--no-fault", action="append", default=[], help="leave this kind out")
    parser.add_argument("--spark", choices=("batch", "streaming", "off"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.CRITICAL)  # rstream logs its reconnects at ERROR
    try:
        faults = parse_faults(args.faults, args.no_fault)
    except ValueError as exc:
        parser.error(str(exc))
    profile = (
        ci_profile(args.seed, faults) if args.ci else long_profile(args.minutes, args.seed, faults)
    )
    if args.ci and args.minutes != parser.get_default("minutes"):
        profile.minutes = args.minutes
    if args.spark:
        profile.spark = args.spark
    workdir = Path(tempfile.mkdtemp(prefix=MARK))
    (workdir / "etcd").mkdir()
    etcd, etcd_port = start_etcd(find_or_install_etcd(), workdir / "etcd")
    s3 = start_seaweed(workdir / "seaweed")
    spark_box: list[object] = []

    def spark_factory() -> object:
        spark_box.append(build_spark("tierlog-soak", java_options=QUICK_JVM))
        return spark_box[0]

    try:
        result, text = asyncio.run(
            run_soak(profile, workdir, f"127.0.0.1:{etcd_port}", s3, spark_factory, _progress)
        )
    finally:
        for spark in spark_box:
            spark.stop()  # type: ignore[attr-defined]
        s3.stop()
        stop_process(etcd)
    print(text, flush=True)
    if result.failures or args.keep:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if result.failures else 0


def _progress(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
