"""Set a SparkSession up for tierlog: register the data source, with filter pushdown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierlog.spark.batch import TierlogDataSource, TierlogPushdownDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession, *, filter_pushdown: bool = True) -> None:
    """Register ``format("tierlog")`` on ``spark``.

    With ``filter_pushdown`` (the default) this turns ``spark.sql.python.filterPushdown.enabled``
    on and registers the source whose reader prunes fragments by offset, timestamp and stream
    filters. Do not turn the flag off afterwards: pyspark then fails every read of a reader
    with pushdown. Without it, the flag is left alone and the plain source is registered
    (prune with the ``startOffset`` / ``endOffset`` / ``startTimestamp`` / ``endTimestamp``
    options instead).
    """
    if filter_pushdown:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
        spark.dataSource.register(TierlogPushdownDataSource)
    else:
        spark.dataSource.register(TierlogDataSource)


def filter_pushdown_enabled(spark: SparkSession) -> bool:
    return str(spark.conf.get(FILTER_PUSHDOWN_CONF, "false")).lower() == "true"
