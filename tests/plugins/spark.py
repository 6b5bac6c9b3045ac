"""Session-scoped Spark (``local[2,4]``: 2 cores, failed tasks retried up to 4 times, so
retries can be tested) and tiered streams to read with it.

``spark``: ONE SparkSession for the whole test session (starting Spark costs seconds), small
shuffle partitions, Arrow on, UTC, the tierlog source registered with filter pushdown.
S3 credentials of the test SeaweedFS go into the environment before the JVM starts, so the
Python workers Spark forks can open ``s3://`` stores.

``tiered_bucket``: a remote tier (filesystem store and SeaweedFS) with a SQLite MetaStore
and a ``TieredBucket`` helper to create streams, append records, tier them and get the
options a ``spark.read.format("tierlog")`` needs.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.plugins import seaweed
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXECUTOR_KEKS = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
"""The key-encryption keys Spark's executors hold (``TIERLOG_KEKS``: id ``k1``, the bytes
0..31, the key the encrypted streams of the tests use): sealed objects are read on the
executors with the keys of their environment, as in production."""


QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss1m"
"""JVM options for the tests' Spark JVMs: C1 only and the serial GC. They run small jobs
for a minute or two on a small shared machine, where C2's compiler threads and the
parallel GC's workers cost more CPU than they give back (benches keep the defaults)."""


SPARK_TIERING = TieringConfig(
    fragment_bytes=8 * 1024,
    max_fragment_age=0.2,
    max_uploads=3,
    debounce_count=3,
    debounce_seconds=0.05,
    retry_base=0.01,
    retry_max=0.05,
)
SPARK_LOG = LogConfig(max_segment_bytes=60_000)


def s3_test_environment() -> None:
    """Credentials of the test SeaweedFS (constants) for this process and its children."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", seaweed.ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", seaweed.SECRET_KEY)
    os.environ.setdefault("AWS_REGION", seaweed.REGION)


def build_spark(
    app_name: str = "tierlog-tests", master: str = "local[2,4]", java_options: str = ""
) -> SparkSession:
    """A small local SparkSession with the tierlog source registered (tests and benches);
    ``java_options`` for its JVM (the driver, which runs the local executor too)."""
    s3_test_environment()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from tierlog.spark.session import register

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.executorEnv.TIERLOG_KEKS", EXECUTOR_KEKS)
    )
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The session's one SparkSession (local[2])."""
    session = build_spark(java_options=QUICK_JVM)
    try:
        yield session
    finally:
        session.stop()


@dataclass
class Record:
    offset: int
    chunk_id: int
    timestamp: int  # ms
    epoch: int
    body: bytes


class TieredStream:
    """One stream: catalog entry, local log and a tierer on the bucket's store."""

    def __init__(
        self,
        bucket: TieredBucket,
        vhost: str,
        name: str,
        tiering: TieringConfig,
        log_config: LogConfig = SPARK_LOG,
    ) -> None:
        self.bucket = bucket
        self.vhost = vhost
        self.name = name
        self.record: StreamRecord = bucket.catalog.create(vhost, name)
        self.log = StreamLog.create(
            str(bucket.root / "streams"), vhost, name, log_config, created_ns=self.record.created_ns
        )
        self.tierer = StreamTierer(
            self.log,
            bucket.store,
            bucket.catalog,
            bucket.deletions,
            prefix=bucket.prefix,
            config=tiering,
            m=4,
        )
        self.tierer.start()

    @property
    def display(self) -> str:
        return self.name if self.vhost == "/" else f"{self.vhost}/{self.name}"

    def append(self, bodies: Sequence[bytes], per_chunk: int = 20, pause: float = 0.0) -> None:
        for i in range(0, len(bodies), per_chunk):
            self.log.append(list(bodies[i : i + per_chunk]))
            if pause:
                time.sleep(pause)

    def tier(self) -> None:
        """Cut, upload and commit everything committed locally."""
        assert self.tierer.flush(timeout=60), self.tierer.halted

    def records(self, start: int = 0, end: int | None = None) -> list[Record]:
        """Committed user records from the local log (the reference a read is checked with)."""
        out = []
        with LogReader(self.log, OffsetSpec.first()) as reader:
            for chunk in reader.chunks():
                h = chunk.header
                for offset, body in chunk.records():
                    if offset >= start and (end is None or offset < end):
                        out.append(Record(offset, h.chunk_id, h.timestamp, h.epoch, bytes(body)))
        return out

    def close(self) -> None:
        self.tierer.stop(flush=False, timeout=5)
        self.log.close()


class TieredBucket:
    """A remote tier (object store + MetaStore) holding tiered streams."""

    def __init__(self, root: Path, store_uri: str, prefix: str = "tier") -> None:
        self.root = root
        self.store_uri = store_uri
        self.prefix = prefix
        self.meta_uri = f"sqlite://{root / 'meta.db'}"
        self.store: ObjectStore = open_object_store(store_uri)
        self.meta: MetaStore = open_meta_store(self.meta_uri)
        self.catalog = Catalog(self.meta)
        self.deletions = DeletionQueue(self.meta, grace_seconds=0.0)
        self.streams: list[TieredStream] = []

    def add_stream(
        self,
        name: str,
        vhost: str = "/",
        tiering: TieringConfig = SPARK_TIERING,
        log_config: LogConfig = SPARK_LOG,
    ) -> TieredStream:
        stream = TieredStream(self, vhost, name, tiering, log_config)
        self.streams.append(stream)
        return stream

    def options(self, *streams: TieredStream, **extra: Any) -> dict[str, str]:
        """Options of a ``format("tierlog")`` read of ``streams``."""
        opts = {
            "streams": ",".join(s.display for s in streams),
            "objectStore": self.store_uri,
            "metaStore": self.meta_uri,
            "prefix": self.prefix,
        }
        opts.update({k: str(v) for k, v in extra.items()})
        return opts

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
        self.store.close()
        self.meta.close()


def s3_uri(server: seaweed.SeaweedServer) -> str:
    """A fresh key prefix in the session's SeaweedFS bucket, as a store URI."""
    return (
        f"s3://{server.bucket}/t/{uuid.uuid4().hex}"
        f"?endpoint={server.endpoint}&region={server.region}"
    )


@pytest.fixture(params=["fs", pytest.param("s3", marks=pytest.mark.s3)])
def tiered_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TieredBucket]:
    """An empty remote tier on each backend (filesystem store and SeaweedFS)."""
    if request.param == "fs":
        uri = f"file://{tmp_path / 'objects'}"
    else:
        s3_test_environment()
        uri = s3_uri(request.getfixturevalue("seaweed"))
    bucket = TieredBucket(tmp_path, uri)
    try:
        yield bucket
    finally:
        bucket.close()
