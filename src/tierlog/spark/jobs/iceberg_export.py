"""``tierlog spark export --format iceberg``: streams -> Iceberg tables, exactly once.

Per run and table: the executors read the new offsets of each stream with the tierlog
batch source and write Parquet files (one UTC day per file, timestamps as INT64
TIMESTAMP_MICROS) into a directory of their own under the table's ``data/`` location,
named after the run; the driver then commits exactly those files with pyiceberg's
``add_files`` in one transaction whose snapshot carries the export state -- per stream its
incarnation and the next offset to export -- as the snapshot property
``tierlog.export-state``. The next run starts where the table's newest state says.

So the table and its state change together or not at all: a run that dies after writing
its Parquet files and before the commit leaves files no snapshot references (orphans in
their run's directory, never added later: each run adds only its own directory's files),
and the next run exports the same range again. The commit is optimistic: when another
writer committed to the table in between, the commit fails and nothing is added (the
tables have ``commit.retry.num-retries=0``: pyiceberg would otherwise re-apply the append
on top of a concurrent export of the same range).

Tables: one per stream (named after the stream, ``[a-z0-9_]``), or one table for all
streams with ``table=NAME`` (the ``stream`` column tells them apart). Schema: the tierlog
batch source's columns; partition spec ``day(timestamp)``.

Compaction (``compact=True``): afterwards, per table and day, the data files smaller than
``target_file_bytes`` are rewritten by Spark into one file per day and swapped for the
old ones in one overwrite commit (same rows, same state), so frequent small exports do not
leave a table of thousands of tiny files.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierlog.errors import ConfigError
from tierlog.remote.catalog import Catalog
from tierlog.spark.errors import IcebergCatalogError
from tierlog.spark.jobs.common import Progress, RemoteTier, select_streams
from tierlog.spark.jobs.export import (
    DATE_COLUMN,
    StreamExport,
    display_name,
    plan_exports,
    read_exports,
)
from tierlog.spark.jobs.iceberg_catalog import IcebergCatalogConfig, open_catalog

STATE_PROPERTY = "tierlog.export-state"
RUN_PROPERTY = "tierlog.export-run"
PARTITION_FIELD = "timestamp_day"
# pyiceberg retries a failed append on the new table state: after a concurrent export of
# the same range that would add the rows twice. The export's tables do not retry: a commit
# that lost the race fails and the next run starts from the winner's state.
NO_RETRIES = {"commit.retry.num-retries": "0"}
DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
_TABLE_NAME = re.compile(r"[^a-z0-9_]+")

# (vhost, name) -> (incarnation, next offset)
ExportState = dict[tuple[str, str], tuple[str, int]]


@dataclass
class TableExport:
    """What one run did to one table."""

    table: str
    streams: list[StreamExport] = field(default_factory=list)
    files_added: int = 0
    snapshot_id: int | None = None
    compacted_files: int = 0
    compacted_into: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "streams": [s.to_dict() for s in self.streams],
            "files_added": self.files_added,
            "snapshot_id": self.snapshot_id,
            "compacted_files": self.compacted_files,
            "compacted_into": self.compacted_into,
        }


@dataclass
class IcebergExportReport:
    catalog: dict[str, str | None]
    run_id: str
    tables: list[TableExport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": "export",
            "format": "iceberg",
            "catalog": self.catalog,
            "run_id": self.run_id,
            "tables": [t.to_dict() for t in self.tables],
        }


def table_name(stream: str) -> str:
    """A stream's table name: lower case, runs of other characters as ``_``."""
    return _TABLE_NAME.sub("_", stream.lower()).strip("_") or "stream"


def encode_state(state: ExportState) -> str:
    return json.dumps(
        {
            display_name(vhost, name): {"incarnation": inc, "next_offset": nxt}
            for (vhost, name), (inc, nxt) in sorted(state.items())
        },
        sort_keys=True,
    )


def decode_state(text: str) -> ExportState:
    out: ExportState = {}
    for display, entry in json.loads(text).items():
        vhost, sep, name = display.rpartition("/")
        out[(vhost if sep else "/", name)] = (entry["incarnation"], int(entry["next_offset"]))
    return out


def table_state(table: Any) -> ExportState:
    """The export state of the newest snapshot that has one (snapshots by other writers,
    which carry none, are walked past)."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        text = None if summary is None else summary.additional_properties.get(STATE_PROPERTY)
        if text is not None:
            return decode_state(text)
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.snapshot_by_id(parent)
    return {}


def run_iceberg_export(
    spark: Any,
    tier: RemoteTier,
    catalog_config: IcebergCatalogConfig,
    streams: list[str] | None = None,
    *,
    vhost: str = "/",
    include_amqp: bool = False,
    table: str | None = None,
    compact: bool = False,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    progress: Progress | None = None,
    before_commit: Callable[[str, list[str]], None] | None = None,
) -> IcebergExportReport:
    """Export the new offsets of the named streams of ``vhost`` (default: every stream)
    to Iceberg. ``before_commit(table, files)`` runs between the write and the commit
    (tests inject crashes there)."""
    if target_file_bytes <= 0:
        raise ConfigError(f"target file bytes must be positive, got {target_file_bytes}")
    if table is not None and table_name(table) != table:
        raise ConfigError(f"table name {table!r} must be lower case [a-z0-9_]")
    say = progress or Progress("export")
    catalog = open_catalog(catalog_config)
    report = IcebergExportReport(catalog_config.describe(), uuid.uuid4().hex)
    groups = _table_groups(catalog, catalog_config, tier, streams, vhost, table, say)
    for name, plans, state in groups:
        result = TableExport(name, plans)
        if plans:
            _export_table(
                spark, tier, catalog, catalog_config, result, state, include_amqp, report.run_id,
                say, before_commit,
            )  # fmt: skip
        if compact:
            _compact(spark, catalog, catalog_config, result, target_file_bytes, say)
        if plans or result.compacted_files:
            report.tables.append(result)
    if not report.tables:
        say("nothing new to export")
    return report


def _table_groups(
    catalog: Any,
    config: IcebergCatalogConfig,
    tier: RemoteTier,
    streams: list[str] | None,
    vhost: str,
    table: str | None,
    say: Progress,
) -> list[tuple[str, list[StreamExport], ExportState]]:
    """(table, planned ranges, state) per table, each planned from that table's state."""
    if table is not None:
        state = _state_of(catalog, config, table)
        return [(table, plan_exports(tier, streams, vhost, state, say), state)]
    with tier.open_meta() as meta:
        records = select_streams(Catalog(meta), streams, vhost)
    names: dict[str, str] = {}
    for record in records:
        stream = display_name(record.vhost, record.name)
        other = names.setdefault(table_name(stream), stream)
        if other != stream:
            raise ConfigError(
                f"streams {other!r} and {stream!r} both map to Iceberg table "
                f"{table_name(stream)!r}: export them into one table (--table)"
            )
    out = []
    by_display = {display_name(r.vhost, r.name): r for r in records}
    for name, stream in sorted(names.items()):
        state = _state_of(catalog, config, name)
        record = by_display[stream]
        out.append((name, plan_exports(tier, [record.name], record.vhost, state, say), state))
    return out


def _state_of(catalog: Any, config: IcebergCatalogConfig, name: str) -> ExportState:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return table_state(catalog.load_table((config.namespace, name)))
    except NoSuchTableError:
        return {}


def _export_table(
    spark: Any,
    tier: RemoteTier,
    catalog: Any,
    config: IcebergCatalogConfig,
    result: TableExport,
    state: ExportState,
    include_amqp: bool,
    run_id: str,
    say: Progress,
    before_commit: Callable[[str, list[str]], None] | None,
) -> None:
    from pyiceberg.exceptions import CommitFailedException

    df = read_exports(spark, tier, result.streams, include_amqp)
    iceberg_table = _ensure_table(catalog, config, result.table, df)
    staging = f"{iceberg_table.location().rstrip('/')}/data/tierlog-{run_id}"
    say(f"writing {len(result.streams)} stream range(s) of table {result.table} as Parquet")
    spark.sparkContext.setJobDescription(f"tierlog export: iceberg {result.table}")
    write_parquet(spark, df, staging)
    files = list_parquet_files(spark, staging)
    if before_commit is not None:
        before_commit(result.table, files)
    new_state = dict(state)
    for plan in result.streams:
        new_state[(plan.vhost, plan.name)] = (plan.incarnation, plan.end_offset)
    properties = {STATE_PROPERTY: encode_state(new_state), RUN_PROPERTY: run_id}
    say(f"committing {len(files)} file(s) to {config.namespace}.{result.table}")
    try:
        with iceberg_table.transaction() as tx:
            # The run's directory is new, so no file can already be in the table.
            tx.add_files(files, snapshot_properties=properties, check_duplicate_files=False)
    except CommitFailedException as exc:
        raise IcebergCatalogError(
            f"table {config.namespace}.{result.table} changed while this export ran (another "
            f"writer committed); nothing was added, run the export again ({exc})"
        ) from None
    except ValueError as exc:  # pyiceberg's schema compatibility check
        raise IcebergCatalogError(
            f"table {config.namespace}.{result.table} does not take these files: {exc}"
        ) from None
    spark.sparkContext.setJobDescription(None)
    committed = catalog.load_table((config.namespace, result.table)).current_snapshot()
    result.files_added = len(files)
    result.snapshot_id = None if committed is None else committed.snapshot_id


def _ensure_table(catalog: Any, config: IcebergCatalogConfig, name: str, df: Any) -> Any:
    """The table, created from the DataFrame's schema and partitioned by day if new."""
    import pyarrow as pa
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.transforms import DayTransform
    from pyspark.sql.pandas.types import to_arrow_schema

    identifier = (config.namespace, name)
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        table = None
    if table is not None:
        if table.metadata.properties.get("commit.retry.num-retries") != "0":
            with table.transaction() as tx:
                tx.set_properties(**NO_RETRIES)
            table = catalog.load_table(identifier)
        return table
    # Every column optional: Spark reads Parquet back as nullable, so files it rewrites
    # (compaction) declare every column optional, and a required table column refuses them.
    arrow = to_arrow_schema(df.drop(DATE_COLUMN).schema, timezone="UTC")
    schema = pa.schema([_optional(f) for f in arrow])
    table = catalog.create_table_if_not_exists(identifier, schema=schema, properties=NO_RETRIES)
    if not table.spec().fields:
        with table.update_spec() as spec:
            spec.add_field("timestamp", DayTransform(), PARTITION_FIELD)
    return catalog.load_table(identifier)


def _optional(f: Any) -> Any:
    """``f`` and every field nested in it nullable."""
    import pyarrow as pa

    t = f.type
    if pa.types.is_struct(t):
        t = pa.struct([_optional(t.field(i)) for i in range(t.num_fields)])
    elif pa.types.is_map(t):
        t = pa.map_(t.key_type, _optional(t.item_field).type)
    elif pa.types.is_list(t):
        t = pa.list_(_optional(t.value_field))
    return f.with_type(t).with_nullable(True)


def write_parquet(spark: Any, df: Any, path: str) -> None:
    """Spark writes ``df`` as Parquet, one directory (so one file per task) per day,
    timestamps as INT64 micros (Iceberg's ``timestamptz``, not Spark's default INT96)."""
    key = "spark.sql.parquet.outputTimestampType"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        df.write.mode("errorifexists").partitionBy(DATE_COLUMN).parquet(path)
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def list_parquet_files(spark: Any, path: str) -> list[str]:
    """Every ``*.parquet`` file under ``path`` (Spark's committed output only), as URIs."""
    jvm = spark._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(hpath):
        return []
    found = fs.listFiles(hpath, True)
    out = []
    while found.hasNext():
        uri = str(found.next().getPath().toUri().toString())
        if uri.endswith(".parquet"):
            out.append("file:///" + uri[len("file:/") :].lstrip("/") if _bare_file(uri) else uri)
    return sorted(out)


def _bare_file(uri: str) -> bool:
    """Hadoop writes local files as ``file:/path``; pyiceberg wants ``file:///path``."""
    return uri.startswith("file:/") and not uri.startswith("file:///")


def _compact(
    spark: Any,
    catalog: Any,
    config: IcebergCatalogConfig,
    result: TableExport,
    target_file_bytes: int,
    say: Progress,
) -> None:
    """Rewrite each day's small files into one, swapped in one overwrite commit."""
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    try:
        table = catalog.load_table((config.namespace, result.table))
    except NoSuchTableError:
        return
    snapshot = table.current_snapshot()
    if snapshot is None:
        return
    by_day: dict[Any, list[Any]] = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.file_size_in_bytes < target_file_bytes:
                by_day.setdefault(tuple(data_file.partition), []).append(data_file)
    small = [f for files in by_day.values() if len(files) > 1 for f in files]
    if not small:
        return
    say(f"compacting {len(small)} small file(s) of table {result.table}")
    target = f"{table.location().rstrip('/')}/data/tierlog-compact-{uuid.uuid4().hex}"
    spark.sparkContext.setJobDescription(f"tierlog export: compact {result.table}")
    from pyspark.sql import functions as F

    day = F.expr("date_from_unix_date(cast(floor(unix_millis(timestamp) / 86400000) as int))")
    df = spark.read.parquet(*[f.file_path for f in small]).withColumn(DATE_COLUMN, day)
    write_parquet(spark, df.repartition(DATE_COLUMN), target)
    spark.sparkContext.setJobDescription(None)
    new_files = list_parquet_files(spark, target)
    properties = {STATE_PROPERTY: encode_state(table_state(table)), RUN_PROPERTY: "compaction"}
    try:
        with table.transaction() as tx:
            rewrite = tx.update_snapshot(snapshot_properties=properties).overwrite()
            with rewrite:
                for data_file in small:
                    rewrite.delete_data_file(data_file)
                for path in new_files:
                    added = parquet_file_to_data_file(table.io, tx.table_metadata, path)
                    rewrite.append_data_file(added)
    except CommitFailedException as exc:
        raise IcebergCatalogError(
            f"table {config.namespace}.{result.table} changed while it was compacted; nothing "
            f"was replaced, compact again ({exc})"
        ) from None
    result.compacted_files = len(small)
    result.compacted_into = len(new_files)
