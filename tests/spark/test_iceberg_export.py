"""``tierlog spark export --format iceberg`` with real Spark and pyiceberg's embedded SQL
catalog: exactly once across a crash between the Parquet write and the commit,
incremental runs, one table per stream or one for all, day partitions, compaction; and the
catalog configuration refused clearly (no Spark needed)."""

from __future__ import annotations

import datetime as dt
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.spark import TieredBucket, TieredStream
from tierlog.errors import ConfigError
from tierlog.spark.errors import IcebergCatalogError
from tierlog.spark.jobs.common import RemoteTier
from tierlog.spark.jobs.iceberg_catalog import catalog_config, open_catalog
from tierlog.spark.jobs.iceberg_export import (
    STATE_PROPERTY,
    decode_state,
    run_iceberg_export,
    table_name,
)

pytestmark = pytest.mark.spark
FS_ONLY = pytest.mark.parametrize("tiered_bucket", ["fs"], indirect=True)

Row = tuple[str, int, bytes]


class InjectedCrash(RuntimeError):
    pass


def tier_of(bucket: TieredBucket) -> RemoteTier:
    return RemoteTier.create(bucket.store_uri, bucket.meta_uri, bucket.prefix)


def table_rows(catalog: Any, name: str) -> list[Row]:
    data = catalog.load_table(("tierlog", name)).scan().to_arrow()
    return sorted(
        zip(
            data.column("stream").to_pylist(),
            data.column("offset").to_pylist(),
            data.column("body").to_pylist(),
            strict=True,
        )
    )


def table_files(catalog: Any, name: str) -> list[str]:
    table = catalog.load_table(("tierlog", name))
    return sorted(table.inspect.files().column("file_path").to_pylist())


def tiered_rows(stream: TieredStream) -> list[Row]:
    durable = stream.tierer.durable_next
    return [(stream.display, r.offset, r.body) for r in stream.records(0, durable)]


@FS_ONLY
def test_export_is_exactly_once_across_a_crash_and_incremental(
    spark: Any, tiered_bucket: TieredBucket, tmp_path: Path
) -> None:
    alpha = tiered_bucket.add_stream("alpha")
    beta = tiered_bucket.add_stream("Beta-2")
    alpha.append([b"a%05d" % i for i in range(900)])
    beta.append([b"b%05d" % i for i in range(300)])
    alpha.tier()
    beta.tier()
    tier = tier_of(tiered_bucket)
    config = catalog_config("sql", str(tmp_path / "warehouse"))
    crashed: list[str] = []

    def crash(table: str, files: list[str]) -> None:
        assert files, "the executors wrote no file"
        crashed.extend(files)
        raise InjectedCrash("between the Parquet write and the commit")

    with pytest.raises(InjectedCrash):
        run_iceberg_export(spark, tier, config, before_commit=crash)
    catalog = open_catalog(config)
    assert all(Path(f.removeprefix("file://")).exists() for f in crashed)  # orphans on disk
    assert table_rows(catalog, "alpha") == []  # ... and not in the table

    first = run_iceberg_export(spark, tier, config)
    assert [t.table for t in first.tables] == ["alpha", "beta_2"]
    assert table_rows(catalog, "alpha") == tiered_rows(alpha)
    assert table_rows(catalog, "beta_2") == tiered_rows(beta)
    assert not set(crashed) & set(table_files(catalog, "alpha"))

    table = catalog.load_table(("tierlog", "alpha"))
    assert str(table.schema().find_field("timestamp").field_type) == "timestamptz"
    assert [str(f.transform) for f in table.spec().fields] == ["day"]
    summary = table.current_snapshot().summary.additional_properties
    assert decode_state(summary[STATE_PROPERTY]) == {
        ("/", "alpha"): (alpha.record.incarnation, alpha.tierer.durable_next)
    }
    # Every file holds one day: the partition pyiceberg derived matches the rows' day.
    for record in table.inspect.files().to_pylist():
        lower = record["readable_metrics"]["timestamp"]["lower_bound"]
        upper = record["readable_metrics"]["timestamp"]["upper_bound"]
        assert lower.date() == upper.date()

    alpha_end = alpha.tierer.durable_next
    alpha.append([b"more%05d" % i for i in range(400)])
    alpha.tier()
    second = run_iceberg_export(spark, tier, config)
    assert [(t.table, [s.start_offset for s in t.streams]) for t in second.tables] == [
        ("alpha", [alpha_end])
    ]
    assert table_rows(catalog, "alpha") == tiered_rows(alpha)  # once each, the new ones too
    assert run_iceberg_export(spark, tier, config).tables == []  # nothing new


@FS_ONLY
def test_one_table_for_all_streams_and_compaction(
    spark: Any, tiered_bucket: TieredBucket, tmp_path: Path
) -> None:
    alpha = tiered_bucket.add_stream("alpha")
    beta = tiered_bucket.add_stream("beta", vhost="shop")
    tier = tier_of(tiered_bucket)
    config = catalog_config("sql", str(tmp_path / "warehouse"))
    for round_ in range(3):  # three small exports: at least three files per day
        alpha.append([b"a%d-%04d" % (round_, i) for i in range(200)])
        beta.append([b"b%d-%04d" % (round_, i) for i in range(100)])
        alpha.tier()
        beta.tier()
        report = run_iceberg_export(spark, tier, config, table="events", include_amqp=True)
        assert [t.table for t in report.tables] == ["events"]
    catalog = open_catalog(config)
    expected = sorted(tiered_rows(alpha) + tiered_rows(beta))
    assert table_rows(catalog, "events") == expected
    assert {s for s, _, _ in expected} == {"alpha", "shop/beta"}
    before = table_files(catalog, "events")
    days = {dt.datetime.now(dt.UTC).date()}
    assert len(before) >= 3

    columns = catalog.load_table(("tierlog", "events")).schema().column_names
    assert "application_properties" in columns  # nested columns survive compaction too
    compacted = run_iceberg_export(spark, tier, config, table="events", compact=True)
    (result,) = compacted.tables
    assert result.streams == [] and result.compacted_files == len(before)
    after = table_files(catalog, "events")
    assert len(after) == result.compacted_into <= len(days) + 1  # one per day (a midnight)
    assert not set(after) & set(before)
    assert table_rows(catalog, "events") == expected  # same rows, once each
    # The compaction commit carries the export state on: the next run has nothing to do.
    assert run_iceberg_export(spark, tier, config, table="events").tables == []
    alpha.append([b"late"])
    alpha.tier()
    late = run_iceberg_export(spark, tier, config, table="events", include_amqp=True)
    assert [s.name for s in late.tables[0].streams] == ["alpha"]
    assert table_rows(catalog, "events") == sorted(tiered_rows(alpha) + tiered_rows(beta))


def test_catalog_configuration_is_checked(tmp_path: Path) -> None:
    assert catalog_config("sql", str(tmp_path)).uri == f"sqlite:///{tmp_path}/catalog.db"
    with pytest.raises(ConfigError, match="unknown Iceberg catalog kind"):
        catalog_config("hive", str(tmp_path))
    with pytest.raises(ConfigError, match="needs an output"):
        catalog_config("sql", None)
    with pytest.raises(ConfigError, match="sqlite:///path"):
        catalog_config("sql", str(tmp_path), "mysql://x")
    with pytest.raises(ConfigError, match="local or mounted path"):
        catalog_config("sql", "s3://bucket/wh")
    with pytest.raises(ConfigError, match="needs --catalog-uri"):
        catalog_config("rest", None)
    with pytest.raises(ConfigError, match=r"http\(s\)://host"):
        catalog_config("rest", None, "thrift://metastore:9083")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        catalog_config("rest", None, "http://h:1", properties=["token"])
    with pytest.raises(ConfigError, match="dotted name"):
        catalog_config("sql", str(tmp_path), namespace="a..b")
    assert table_name("shop/Orders-EU") == "shop_orders_eu"

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = "s3cr3t-token"
    rest = catalog_config("rest", None, f"http://127.0.0.1:{port}", properties=[f"token={secret}"])
    assert secret not in repr(rest) and secret not in str(rest.describe())
    started = time.monotonic()
    with pytest.raises(IcebergCatalogError, match=r"rest catalog at http://127\.0\.0\.1") as err:
        open_catalog(rest)
    assert secret not in str(err.value)
    assert time.monotonic() - started < 30


def test_export_command_refuses_iceberg_options_for_parquet(tmp_path: Path) -> None:
    from tierlog.cli import main

    base = ["spark", "export", str(tmp_path / "out"), "--object-store", f"file://{tmp_path}"]
    base += ["--meta-store", f"sqlite://{tmp_path / 'm.db'}"]
    assert main([*base, "--table", "events"]) == 2
    assert main([*base, "--format", "iceberg", "--target-file-bytes", "10"]) == 2
    assert main([*base, "--format", "iceberg", "--catalog", "rest"]) == 2


@FS_ONLY
def test_a_concurrent_export_makes_the_slower_commit_fail(
    spark: Any, tiered_bucket: TieredBucket, tmp_path: Path
) -> None:
    stream = tiered_bucket.add_stream("orders")
    stream.append([b"o%05d" % i for i in range(500)])
    stream.tier()
    tier = tier_of(tiered_bucket)
    config = catalog_config("sql", str(tmp_path / "warehouse"))
    run_iceberg_export(spark, tier, config)  # the table exists
    stream.append([b"p%05d" % i for i in range(300)])
    stream.tier()
    raced: list[int] = []

    def other_export_first(table: str, files: list[str]) -> None:
        if not raced:  # the same range, exported and committed by another run meanwhile
            raced.append(1)
            run_iceberg_export(spark, tier, config)

    with pytest.raises(IcebergCatalogError, match="changed while this export ran"):
        run_iceberg_export(spark, tier, config, before_commit=other_export_first)
    catalog = open_catalog(config)
    assert table_rows(catalog, "orders") == tiered_rows(stream)  # once each, not twice
    assert run_iceberg_export(spark, tier, config).tables == []
