"""Spark's part of the soak, as the Spark user: a batch read of a stream (remote tier plus
the tail through a server) at the end, and in the long profile a streaming query that
follows a stream all along (restarted from its checkpoint when a micro-batch fails, as an
operator would); its rows are kept per micro-batch id, so a replayed batch replaces its
first attempt rather than adding to it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.cluster.nodes import HOST
from tests.soak.consumers import Delivery, id_of_raw
from tests.soak.world import SPARK, SoakWorld


def options(world: SoakWorld, stream: str, node: str) -> dict[str, str]:
    return {
        "stream": stream,
        "objectStore": world.direct_object_uri,
        "metaStore": world.cluster.meta_uri,
        "server": f"{HOST}:{world.cluster.node(node).process.stream_port}",
        "user": SPARK[0],
        "password": SPARK[1],
    }


def _deliveries(rows: list[Any]) -> list[Delivery]:
    return [
        Delivery(int(r["offset"]), id_of_raw(bytes(r["body"])), 0)
        for r in sorted(rows, key=lambda r: int(r["offset"]))
    ]


def batch_read(spark: Any, world: SoakWorld, stream: str, node: str) -> list[Delivery]:
    df = spark.read.format("tierlog").options(**options(world, stream, node)).load()
    return _deliveries(df.select("offset", "body").collect())


class StreamingRead:
    """A streaming query on ``stream`` collecting (offset, body) per micro-batch."""

    def __init__(self, spark: Any, world: SoakWorld, stream: str, checkpoint: Path) -> None:
        self.spark, self.world, self.stream = spark, world, stream
        self.checkpoint = checkpoint
        self.batches: dict[int, list[Any]] = {}
        self.restarts = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.query: Any = None

    def _node(self) -> str:
        live = self.world.cluster.live()
        return live[self.restarts % len(live)].name if live else "n1"

    def start(self) -> None:
        def keep(df: Any, batch_id: int) -> None:
            rows = df.select("offset", "body").collect()
            with self._lock:
                self.batches[batch_id] = rows

        self.query = (
            self.spark.readStream.format("tierlog")
            .options(**options(self.world, self.stream, self._node()))
            .option("maxOffsetsPerTrigger", "20000")
            .load()
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime="2 seconds")
            .start()
        )

    def poll(self) -> None:
        """Restart a query that failed (from its checkpoint)."""
        if self.query is not None and not self.query.isActive:
            error = self.query.exception()
            self.errors.append(str(error)[:300] if error else "stopped")
            self.restarts += 1
            self.start()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            rows = [r for b in sorted(self.batches) for r in self.batches[b]]
        return [Delivery(int(r["offset"]), id_of_raw(bytes(r["body"])), 0) for r in rows]

    def caught_up_to(self) -> int:
        got = self.deliveries()
        return max((d.id for d in got), default=0)
