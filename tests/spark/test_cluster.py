"""The jobs and the data source on a real standalone Spark cluster -- a master and one
worker started here with ``spark-class`` from the installed pyspark, on free loopback
ports, stopped by PID -- against SeaweedFS (object store) and etcd (MetaStore).

The driver is a separate process (one SparkContext per process, and the test session
already has a local one): one PySpark application on the cluster reads with the data
source, runs the Iceberg export, and then runs the ``tierlog spark scrub`` CLI with
``--master spark://...`` in the same driver (each application costs a driver and an
executor JVM, so the module runs one). The master's JSON status shows the application
really ran on the cluster. JVMs run with C1
only and the serial GC: they live seconds, on a small shared machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

import tierlog
from tests.plugins import seaweed as seaweed_plugin
from tests.plugins.etcd import free_port
from tests.plugins.spark import (
    QUICK_JVM,
    SPARK_TIERING,
    TieredBucket,
    TieredStream,
    s3_test_environment,
    s3_uri,
)
from tierlog.remote.catalog import Catalog
from tierlog.storage.meta_store import open_meta_store
from tierlog.storage.object_store import open_object_store
from tierlog.tiering.deletion import DeletionQueue

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.etcd]

SRC = str(Path(tierlog.__file__).resolve().parents[1])  # this checkout's tierlog wins
SPARK_HOME = str(Path(pyspark.__file__).resolve().parent)
JOB_TIMEOUT_S = 120


@dataclass
class Cluster:
    master_url: str
    ui_port: int
    env: dict[str, str]
    logs: Path

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as r:
            return dict(json.loads(r.read()))

    def app_names(self) -> list[str]:
        status = self.status()
        return [a["name"] for a in status.get("activeapps", []) + status.get("completedapps", [])]

    def log_tail(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.logs.glob("*.log")))


def _environment(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=SPARK_HOME,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(work / "logs"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p),
        AWS_ACCESS_KEY_ID=seaweed_plugin.ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=seaweed_plugin.SECRET_KEY,
        AWS_REGION=seaweed_plugin.REGION,
        SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,  # master and worker
        SPARK_SUBMIT_OPTS=QUICK_JVM,  # drivers
    )
    return env


def _spark_class(cls: str, args: list[str], env: dict[str, str], log: Path) -> Any:
    command = [os.path.join(SPARK_HOME, "bin", "spark-class"), cls, *args]
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("standalone")
    (work / "logs").mkdir()
    env = _environment(work)
    port, ui_port = free_port(), free_port()
    master = _spark_class(
        "org.apache.spark.deploy.master.Master",
        ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
        env,
        work / "logs" / "master.log",
    )
    url = f"spark://127.0.0.1:{port}"
    worker = _spark_class(
        "org.apache.spark.deploy.worker.Worker",
        [url, "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port",
         str(free_port()), "--cores", "2", "--memory", "2g", "--work-dir", str(work / "w")],
        env,
        work / "logs" / "worker.log",
    )  # fmt: skip
    state = Cluster(url, ui_port, env, work / "logs")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert master.poll() is None and worker.poll() is None, state.log_tail()
            try:
                if state.status().get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no worker registered:\n" + state.log_tail()
            time.sleep(0.3)
        yield state
    finally:
        stop_quickly(worker)
        stop_quickly(master)


def stop_quickly(proc: Any) -> None:
    """SIGTERM, and SIGKILL after 2 s: a worker's shutdown can take 10 s on a loaded
    machine, and these daemons hold nothing the tests read afterwards."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class RemoteBucket(TieredBucket):
    """A tiered bucket on SeaweedFS with its MetaStore in etcd (shared by every host)."""

    def __init__(self, root: Path, store_uri: str, meta_uri: str) -> None:
        self.root = root
        self.store_uri = store_uri
        self.prefix = "tier"
        self.meta_uri = meta_uri
        self.store = open_object_store(store_uri)
        self.meta = open_meta_store(meta_uri)
        self.catalog = Catalog(self.meta)
        self.deletions = DeletionQueue(self.meta, grace_seconds=0.0)
        self.streams: list[TieredStream] = []


@pytest.fixture(scope="module")
def remote_bucket(
    seaweed: seaweed_plugin.SeaweedServer,
    etcd_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RemoteBucket]:
    s3_test_environment()
    bucket = RemoteBucket(
        tmp_path_factory.mktemp("remote"),
        s3_uri(seaweed),
        f"etcd://{etcd_server}/cluster-{uuid.uuid4().hex}",
    )
    try:
        for name, count in (("orders", 1500), ("clicks", 500)):
            stream = bucket.add_stream(name, tiering=SPARK_TIERING)
            stream.append([b"%s-%05d" % (name.encode(), i) for i in range(count)])
            stream.tier()
        yield bucket
    finally:
        bucket.close()


def expected(bucket: RemoteBucket) -> list[tuple[str, int, bytes]]:
    rows = []
    for stream in bucket.streams:
        durable = stream.tierer.durable_next
        rows += [(stream.display, r.offset, r.body) for r in stream.records(0, durable)]
    return sorted(rows)


APPLICATION = """
import json, sys
from pyspark.sql import SparkSession
from tierlog.spark.session import register
from tierlog.spark.jobs.common import RemoteTier
from tierlog.spark.jobs.iceberg_catalog import catalog_config
from tierlog.spark.jobs.iceberg_export import run_iceberg_export
from tierlog.cli import main
master, store, meta, prefix, src, warehouse, jvm, scrub_report = sys.argv[1:9]
spark = (SparkSession.builder.master(master).appName("tierlog-read-export")
         .config("spark.executor.memory", "768m").config("spark.driver.host", "127.0.0.1")
         .config("spark.ui.enabled", "false").config("spark.executorEnv.PYTHONPATH", src)
         .config("spark.executor.extraJavaOptions", jvm)
         .getOrCreate())
register(spark)
df = (spark.read.format("tierlog").option("streams", "orders,clicks")
      .option("objectStore", store).option("metaStore", meta).option("prefix", prefix).load())
rows = df.select("stream", "offset", "body").collect()
read = sorted([r["stream"], r["offset"], bytes(r["body"]).decode()] for r in rows)
tier = RemoteTier.create(store, meta, prefix)
report = run_iceberg_export(spark, tier, catalog_config("sql", warehouse), table="all")
# The scrub CLI in this driver: its session is this one (getOrCreate); it stops it at the end.
scrub = main(["spark", "scrub", "--master", master, "--object-store", store,
              "--meta-store", meta, "--prefix", prefix, "--report", scrub_report])
print(json.dumps({"read": read, "export": report.to_dict(), "scrub_exit": scrub}))
"""


@pytest.fixture(scope="module")
def application(
    cluster: Cluster, remote_bucket: RemoteBucket, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Run the read + export + scrub application once; its output, warehouse, scrub report
    and driver log."""
    b = remote_bucket
    warehouse = tmp_path_factory.mktemp("warehouse")
    scrub_report = warehouse / "scrub.json"
    done = subprocess.run(
        [sys.executable, "-c", APPLICATION, cluster.master_url, b.store_uri, b.meta_uri,
         b.prefix, SRC, str(warehouse), QUICK_JVM, str(scrub_report)],
        env=cluster.env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = dict(json.loads(done.stdout.splitlines()[-1]))
    result["warehouse"] = str(warehouse)
    result["scrub"] = json.loads(scrub_report.read_text())
    result["stderr"] = done.stderr
    return result


def test_scrub_on_the_cluster(cluster: Cluster, application: dict[str, Any]) -> None:
    assert application["scrub_exit"] == 0, application["stderr"][-3000:]
    assert f"[tierlog scrub] spark master {cluster.master_url}" in application["stderr"]
    report = application["scrub"]
    assert report["ok"] is True
    fragments = {s["name"]: s["fragments_checked"] for s in report["streams"]}
    assert set(fragments) == {"orders", "clicks"} and all(n > 0 for n in fragments.values())


def test_read_on_the_cluster(
    cluster: Cluster, remote_bucket: RemoteBucket, application: dict[str, Any]
) -> None:
    rows = [(s, o, body.encode()) for s, o, body in application["read"]]
    assert rows == expected(remote_bucket)
    assert "tierlog-read-export" in cluster.app_names()


def test_iceberg_export_on_the_cluster(
    remote_bucket: RemoteBucket, application: dict[str, Any]
) -> None:
    from tierlog.spark.jobs.iceberg_catalog import catalog_config, open_catalog

    assert application["export"]["tables"][0]["files_added"] > 0
    catalog = open_catalog(catalog_config("sql", application["warehouse"]))
    data = catalog.load_table(("tierlog", "all")).scan().to_arrow()
    rows = sorted(
        zip(
            data.column("stream").to_pylist(),
            data.column("offset").to_pylist(),
            data.column("body").to_pylist(),
            strict=True,
        )
    )
    assert rows == expected(remote_bucket)
