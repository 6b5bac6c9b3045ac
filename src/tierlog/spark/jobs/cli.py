"""The ``tierlog spark`` subcommands. Spark is imported only when a job runs."""

from __future__ import annotations

import argparse
from typing import Any


def add_job_parsers(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tierlog.spark.jobs.common import add_tier_arguments

    export = jobs.add_parser(
        "export", help="streams -> Parquet by date or Iceberg tables, from the last export"
    )
    add_tier_arguments(export)
    export.add_argument(
        "output",
        nargs="?",
        help="output directory (parquet: any path Spark's Parquet writer takes; iceberg: the "
        "warehouse directory of the embedded catalog, optional with a REST catalog)",
    )
    export.add_argument("--format", choices=("parquet", "iceberg"), default="parquet")
    iceberg = export.add_argument_group("iceberg (with --format iceberg)")
    iceberg.add_argument("--catalog", choices=("sql", "rest"), help="catalog kind (sql)")
    iceberg.add_argument(
        "--catalog-uri", help="sql: sqlite:///path (OUTPUT/catalog.db); rest: http(s)://host:port"
    )
    iceberg.add_argument(
        "--catalog-prop", action="append", metavar="KEY=VALUE", help="catalog property"
    )
    iceberg.add_argument("--namespace", help="Iceberg namespace (tierlog)")
    iceberg.add_argument("--table", help="one table for all streams (default: one per stream)")
    iceberg.add_argument(
        "--compact", action="store_true", help="rewrite each day's small files into one"
    )
    iceberg.add_argument(
        "--target-file-bytes", type=int, help="files below this are compacted (128 MiB)"
    )
    export.add_argument("--stream", action="append", help="only this stream (repeatable)")
    export.add_argument("--vhost", default="/", help="vhost of --stream names (/)")
    export.add_argument("--include-amqp", action="store_true", help="add decoded AMQP columns")
    export.add_argument("--report", help="also write the JSON report to this file")
    export.set_defaults(func=cmd_export)

    scrub = jobs.add_parser("scrub", help="verify every fragment's CRCs and the manifests")
    add_tier_arguments(scrub)
    scrub.add_argument("--stream", action="append", help="only this stream (repeatable)")
    scrub.add_argument("--vhost", default="/", help="vhost of --stream names (/)")
    scrub.add_argument(
        "--task-bytes", type=int, default=256 * 1024 * 1024, help="fragment bytes per task"
    )
    scrub.add_argument("--report", help="also write the JSON report to this file")
    scrub.set_defaults(func=cmd_scrub)

    gc = jobs.add_parser("gc", help="delete objects no live manifest references (dry run)")
    add_tier_arguments(gc)
    gc.add_argument(
        "--grace", type=float, default=24 * 3600.0, help="only objects older than this (s)"
    )
    gc.add_argument("--apply", action="store_true", help="delete (default: only report)")
    gc.add_argument("--report", help="also write the JSON report to this file")
    gc.set_defaults(func=cmd_gc)

    kidx = jobs.add_parser(
        "key-index", aliases=["index"], help="build key index files of complete time windows"
    )
    add_tier_arguments(kidx)
    kidx.add_argument("--stream", action="append", help="only this stream (repeatable)")
    kidx.add_argument("--vhost", default="/", help="vhost of --stream names (/)")
    kidx.add_argument("--window", type=float, default=3600.0, help="window length (s)")
    kidx.add_argument("--report", help="also write the JSON report to this file")
    kidx.set_defaults(func=cmd_key_index)


def _run(args: argparse.Namespace, name: str, job: Any) -> int:
    """Check the stores and the master before the session starts, then run ``job``."""
    import sys

    from tierlog.spark.jobs.common import (
        check_cluster,
        check_tier,
        parse_conf,
        resolve_master,
        spark_session,
        tier_from_args,
    )

    tier = tier_from_args(args)
    conf = parse_conf(args.conf)
    check_tier(tier, getattr(args, "stream", None), getattr(args, "vhost", "/"))
    master = resolve_master(args.master, conf)
    check_cluster(master, tier, args.shared_paths)
    print(f"[tierlog {name}] spark master {master}", file=sys.stderr, flush=True)
    spark = spark_session(f"tierlog-{name}", master, conf)
    try:
        return int(job(spark, tier))
    finally:
        spark.stop()


_ICEBERG_ONLY = ("catalog", "catalog_uri", "catalog_prop", "namespace", "table", "compact")


def cmd_export(args: argparse.Namespace) -> int:
    from tierlog.errors import ConfigError
    from tierlog.spark.jobs.common import write_json

    if args.format == "parquet":
        given = [f"--{n.replace('_', '-')}" for n in _ICEBERG_ONLY if getattr(args, n)]
        if given or args.target_file_bytes is not None:
            raise ConfigError(f"{given or ['--target-file-bytes']} only apply to --format iceberg")
        if not args.output:
            raise ConfigError("export to Parquet needs an OUTPUT directory")
        return _run(args, "export", _parquet_job(args))
    from tierlog.spark.jobs.iceberg_catalog import catalog_config, open_catalog
    from tierlog.spark.jobs.iceberg_export import DEFAULT_TARGET_FILE_BYTES, run_iceberg_export

    config = catalog_config(
        args.catalog or "sql",
        args.output,
        args.catalog_uri,
        args.namespace or "tierlog",
        args.catalog_prop,
    )
    if args.target_file_bytes is not None and not args.compact:
        raise ConfigError("--target-file-bytes only applies with --compact")
    open_catalog(config)  # an unreachable catalog fails before Spark starts

    def job(spark: Any, tier: Any) -> int:
        from tierlog.spark.session import register

        register(spark)
        report = run_iceberg_export(
            spark,
            tier,
            config,
            args.stream,
            vhost=args.vhost,
            include_amqp=args.include_amqp,
            table=args.table,
            compact=args.compact,
            target_file_bytes=args.target_file_bytes or DEFAULT_TARGET_FILE_BYTES,
        )
        write_json(report.to_dict(), args.report)
        return 0

    return _run(args, "export", job)


def _parquet_job(args: argparse.Namespace) -> Any:
    from tierlog.spark.jobs.common import write_json
    from tierlog.spark.jobs.export import run_export

    def job(spark: Any, tier: Any) -> int:
        from tierlog.spark.session import register

        register(spark)
        report = run_export(
            spark, tier, args.output, args.stream, vhost=args.vhost, include_amqp=args.include_amqp
        )
        write_json(report.to_dict(), args.report)
        return 0

    return job


def cmd_scrub(args: argparse.Namespace) -> int:
    from tierlog.spark.jobs.common import write_json
    from tierlog.spark.jobs.scrub import run_scrub

    def job(spark: Any, tier: Any) -> int:
        report = run_scrub(spark, tier, args.stream, vhost=args.vhost, target_bytes=args.task_bytes)
        write_json(report.to_dict(), args.report)
        return 0 if report.ok else 1

    return _run(args, "scrub", job)


def cmd_gc(args: argparse.Namespace) -> int:
    from tierlog.spark.jobs.common import write_json
    from tierlog.spark.jobs.gc import run_gc

    def job(spark: Any, tier: Any) -> int:
        report = run_gc(spark, tier, grace_seconds=args.grace, apply=args.apply)
        write_json(report.to_dict(), args.report)
        return 0 if report.ok else 1

    return _run(args, "gc", job)


def cmd_key_index(args: argparse.Namespace) -> int:
    from tierlog.spark.jobs.common import write_json
    from tierlog.spark.jobs.key_index import run_key_index

    def job(spark: Any, tier: Any) -> int:
        report = run_key_index(
            spark, tier, args.stream, vhost=args.vhost, window_seconds=args.window
        )
        write_json(report.to_dict(), args.report)
        return 0

    return _run(args, "key-index", job)
