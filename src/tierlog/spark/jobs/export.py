"""``tierlog spark export``: streams -> Parquet, partitioned by date, incrementally.

Each run exports, per stream, the offsets ``[from, next)`` where ``next`` is the
committed manifest's next offset at planning time and ``from`` is where the previous
run stopped (the manifest's first offset for a new stream, a re-created stream -- new
incarnation -- or when retention already removed the offsets after the last export,
which the report flags as ``gap``). The rows are read with the tierlog batch source
(``spark.read.format("tierlog")``) and appended to ``{output}/date=YYYY-MM-DD/`` (UTC
date of the record's chunk timestamp).

State: one row per stream and run, appended to ``{output}/_tierlog_export_state/`` only
after the Parquet write succeeded; the newest row per stream (highest next offset of
its current incarnation) is where the next run starts. A crash between the Parquet
write and the state write re-exports that range next time: the export is at-least-once,
and ``(stream, offset)`` identifies a record for consumers that must drop repeats.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tierlog.formats.manifest import decode_node
from tierlog.remote.catalog import Catalog
from tierlog.remote.committed import read_committed_root
from tierlog.spark.jobs.common import Progress, RemoteTier, select_streams

STATE_DIR = "_tierlog_export_state"
DATE_COLUMN = "date"


@dataclass
class StreamExport:
    vhost: str
    name: str
    incarnation: str
    start_offset: int
    end_offset: int
    gap: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "incarnation": self.incarnation,
            "from_offset": self.start_offset,
            "to_offset": self.end_offset,
            "gap": self.gap,
        }


@dataclass
class ExportReport:
    output: str
    run_id: str
    streams: list[StreamExport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": "export",
            "output": self.output,
            "run_id": self.run_id,
            "streams": [s.to_dict() for s in self.streams],
        }


def _manifest_range(
    tier: RemoteTier, store: Any, catalog: Catalog, incarnation: str
) -> tuple[int, int] | None:
    """(first, next) of the committed manifest; None when nothing is tiered yet."""
    _pointer, data = read_committed_root(catalog, store, tier.prefix, incarnation)
    if data is None:
        return None
    header = decode_node(data).header
    return header.first_offset, header.next_offset


def _path_exists(spark: Any, path: str) -> bool:
    jvm = spark._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark._jsc.hadoopConfiguration())
    return bool(fs.exists(hpath))


def load_state(spark: Any, output: str) -> dict[tuple[str, str], tuple[str, int]]:
    """(vhost, name) -> (incarnation, next offset) of the newest committed export."""
    state_path = f"{output.rstrip('/')}/{STATE_DIR}"
    if not _path_exists(spark, state_path):
        return {}
    best: dict[tuple[str, str], tuple[str, int, float]] = {}
    for row in spark.read.parquet(state_path).collect():
        k = (row["vhost"], row["name"])
        current = best.get(k)
        candidate = (row["incarnation"], int(row["next_offset"]), float(row["committed_at"]))
        if current is None or candidate[2] > current[2]:
            best[k] = candidate
    return {k: (v[0], v[1]) for k, v in best.items()}


def plan_exports(
    tier: RemoteTier,
    streams: list[str] | None,
    vhost: str,
    state: dict[tuple[str, str], tuple[str, int]],
    say: Progress,
) -> list[StreamExport]:
    """Per stream with new data: ``[where the last export stopped, manifest next)``.
    ``state`` maps (vhost, name) to the (incarnation, next offset) of the last export."""
    with tier.open_meta() as meta, tier.open_store() as store:
        catalog = Catalog(meta)
        records = select_streams(catalog, streams, vhost)
        say(f"planning {len(records)} stream(s) from their committed manifests")
        plans: list[StreamExport] = []
        for record in records:
            bounds = _manifest_range(tier, store, catalog, record.incarnation)
            if bounds is None:
                continue
            first, nxt = bounds
            previous = state.get((record.vhost, record.name))
            start = first
            if previous is not None and previous[0] == record.incarnation:
                start = previous[1]
            gap = start < first
            start = max(start, first)
            if start >= nxt:
                continue
            plans.append(
                StreamExport(record.vhost, record.name, record.incarnation, start, nxt, gap)
            )
    return plans


def display_name(vhost: str, name: str) -> str:
    """The stream column's value: ``name`` for vhost ``/``, else ``vhost/name``."""
    return name if vhost == "/" else f"{vhost}/{name}"


def read_exports(
    spark: Any, tier: RemoteTier, plans: list[StreamExport], include_amqp: bool
) -> Any:
    """One DataFrame of every planned range (tierlog batch source columns) plus the
    ``date`` column (UTC day of the chunk timestamp)."""
    from pyspark.sql import functions as F

    frames = []
    for plan in plans:
        reader = spark.read.format("tierlog").options(
            stream=display_name(plan.vhost, plan.name),
            objectStore=tier.object_store,
            metaStore=tier.meta_store,
            prefix=tier.prefix,
            startOffset=str(plan.start_offset),
            endOffset=str(plan.end_offset),
            includeAmqp=str(include_amqp).lower(),
            **{f"objectStore.{k}": v for k, v in tier.store_options.items()},
        )
        frames.append(reader.load())
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    day = F.expr("date_from_unix_date(cast(floor(unix_millis(timestamp) / 86400000) as int))")
    return df.withColumn(DATE_COLUMN, day)


def run_export(
    spark: Any,
    tier: RemoteTier,
    output: str,
    streams: list[str] | None = None,
    *,
    vhost: str = "/",
    include_amqp: bool = False,
    progress: Progress | None = None,
) -> ExportReport:
    """Export the new offsets of the named streams of ``vhost`` (default: every stream)."""
    say = progress or Progress("export")
    report = ExportReport(output, uuid.uuid4().hex)
    state = load_state(spark, output)
    plans = plan_exports(tier, streams, vhost, state, say)
    if not plans:
        say("nothing new to export")
        return report
    df = read_exports(spark, tier, plans, include_amqp)
    say(f"writing {len(plans)} stream range(s) as Parquet to {output}")
    spark.sparkContext.setJobDescription("tierlog export: parquet")
    df.write.mode("append").partitionBy(DATE_COLUMN).parquet(output)
    now = time.time()
    rows = [
        (p.vhost, p.name, p.incarnation, p.start_offset, p.end_offset, report.run_id, now)
        for p in plans
    ]
    schema = (
        "vhost string, name string, incarnation string, from_offset long, next_offset long, "
        "run_id string, committed_at double"
    )
    say("committing the export state")
    spark.sparkContext.setJobDescription("tierlog export: state")
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("append").parquet(
        f"{output.rstrip('/')}/{STATE_DIR}"
    )
    spark.sparkContext.setJobDescription(None)
    report.streams = plans
    say(f"done: {len(plans)} stream(s) exported")
    return report
