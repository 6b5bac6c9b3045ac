"""Kafka's source progress metrics for a tierlog streaming query.

Spark's Kafka source reports ``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and
``minOffsetsBehindLatest`` in ``sources[i].metrics`` of the query's progress through the
JVM interface ``ReportsSourceMetrics``. A source written with the Python Data Source API
cannot: pyspark's Python streaming reader has no metrics hook and Spark's Python stream
wrapper does not implement that interface, so ``metrics`` stays empty. What a Python source
can report is ``reportLatestOffset``, which Spark puts in the same progress entry as
``latestOffset``; the tierlog source reports there the heads its micro-batch was planned
against, one entry per stream. The figures Kafka computes -- per stream, latest offset minus
the micro-batch's end offset -- follow from that entry alone, and ``source_metrics`` computes
them with Kafka's names and string values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

AVG = "avgOffsetsBehindLatest"
MAX = "maxOffsetsBehindLatest"
MIN = "minOffsetsBehindLatest"


def source_metrics(source: Any) -> dict[str, str]:
    """Kafka's offsets-behind-latest metrics of one ``sources[i]`` progress entry (a
    mapping, or pyspark's ``SourceProgress``); empty when the entry has no latest offset
    (a source that does not report one, or a trigger that planned nothing)."""
    end = _offsets(_field(source, "endOffset"))
    latest = _offsets(_field(source, "latestOffset"))
    if not end or not latest:
        return {}
    behind = [max(0, int(head) - int(end.get(stream, head))) for stream, head in latest.items()]
    return {
        AVG: str(sum(behind) / len(behind)),
        MAX: str(max(behind)),
        MIN: str(min(behind)),
    }


def _field(source: Any, name: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def _offsets(value: Any) -> dict[str, int]:
    """An offset as Spark puts it in a progress entry: JSON text or already parsed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, Mapping):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int)}
