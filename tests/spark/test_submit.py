"""The Spark jobs on whatever Spark the user set up: spark-submit's master and ``--conf``
win over any default, and stores that are missing, mistyped or host-local on a cluster
master are refused (one line, typed exit code) before a session starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.spark import QUICK_JVM, TieredBucket
from tierlog.cli import EXIT_CONFIG, EXIT_STORE, main
from tierlog.errors import ConfigError
from tierlog.spark import connections
from tierlog.spark.errors import StoreMissingError
from tierlog.spark.jobs.common import RemoteTier, check_cluster, parse_conf, resolve_master
from tierlog.spark.stores import check_master, require_existing
from tierlog.storage.meta_store import open_meta_store

pytestmark = pytest.mark.spark


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[TieredBucket]:
    bucket = TieredBucket(tmp_path, f"file://{tmp_path / 'objects'}")
    stream = bucket.add_stream("alpha")
    stream.append([b"r%04d" % i for i in range(300)])
    stream.tier()
    yield bucket
    bucket.close()


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_missing_paths_are_refused_and_never_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket: TieredBucket
) -> None:
    missing_dir = tmp_path / "no-such-objects"
    missing_db = tmp_path / "no-such.db"
    code, err = run_cli(
        capsys, "spark", "scrub", "--object-store", f"file://{missing_dir}",
        "--meta-store", bucket.meta_uri, "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code == EXIT_STORE and err.count("\n") == 1
    assert "no directory" in err and str(missing_dir) in err
    code, err = run_cli(
        capsys, "spark", "gc", "--object-store", bucket.store_uri,
        "--meta-store", f"sqlite://{missing_db}", "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code == EXIT_STORE and "no database file" in err
    assert not missing_dir.exists() and not missing_db.exists()
    # What every executor does when it opens a store for a read.
    with pytest.raises(StoreMissingError):
        connections.object_store(f"file://{missing_dir}")
    with pytest.raises(StoreMissingError):
        connections.meta_store(f"sqlite://{missing_db}")
    with pytest.raises(StoreMissingError):
        RemoteTier.create(f"file://{missing_dir}", bucket.meta_uri).open_store()
    assert not missing_dir.exists() and not missing_db.exists()


def test_mistyped_stores_are_refused_not_reported_healthy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bucket: TieredBucket
) -> None:
    empty_dir = tmp_path / "empty-objects"
    empty_dir.mkdir()
    code, err = run_cli(
        capsys, "spark", "scrub", "--object-store", f"file://{empty_dir}",
        "--meta-store", bucket.meta_uri, "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code == EXIT_STORE and "no committed manifest root" in err, err
    code, err = run_cli(
        capsys, "spark", "scrub", "--object-store", bucket.store_uri,
        "--meta-store", bucket.meta_uri, "--prefix", "tierr",
    )  # fmt: skip
    assert code == EXIT_STORE and "wrong --object-store or --prefix" in err, err
    other_db = tmp_path / "other.db"
    open_meta_store(f"sqlite://{other_db}").close()  # exists, but holds no streams
    code, err = run_cli(
        capsys, "spark", "gc", "--apply", "--object-store", bucket.store_uri,
        "--meta-store", f"sqlite://{other_db}", "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code == EXIT_STORE and "holds no streams" in err, err
    code, err = run_cli(
        capsys, "spark", "scrub", "--stream", "nope", "--object-store", bucket.store_uri,
        "--meta-store", bucket.meta_uri, "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code != 0 and "nope" in err


def test_host_local_stores_are_refused_on_a_cluster_master(
    capsys: pytest.CaptureFixture[str], bucket: TieredBucket
) -> None:
    code, err = run_cli(
        capsys, "spark", "scrub", "--master", "spark://10.0.0.1:7077",
        "--object-store", bucket.store_uri, "--meta-store", bucket.meta_uri,
        "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code == EXIT_CONFIG and "runs executors on other hosts" in err, err
    assert "--shared-paths" in err
    code, err = run_cli(
        capsys, "spark", "scrub", "--conf", "spark.master=yarn",
        "--object-store", bucket.store_uri, "--meta-store", bucket.meta_uri,
        "--prefix", bucket.prefix,
    )  # fmt: skip
    assert code == EXIT_CONFIG and "'yarn'" in err
    tier = RemoteTier.create(bucket.store_uri, bucket.meta_uri)
    check_cluster("spark://h:7077", tier, shared_paths=True)  # the user vouches for the paths
    check_cluster("local[4]", tier, shared_paths=False)
    check_master("k8s://h", {"objectStore": "s3://b/p", "metaStore": "etcd://h:2379/p"}, False)
    code, err = run_cli(capsys, "spark", "gc", "--conf", "novalue", "--meta-store", "x")
    assert code == EXIT_CONFIG and "KEY=VALUE" in err


def test_conf_and_master_resolution() -> None:
    assert parse_conf(["a.b=1", "c=x=y", "a.b=2"]) == {"a.b": "2", "c": "x=y"}
    with pytest.raises(ConfigError):
        parse_conf(["=1"])
    assert resolve_master("local[3]", {"spark.master": "yarn"}) == "local[3]"
    assert resolve_master(None, {"spark.master": "local[1]"}) == "local[1]"
    require_existing("s3://bucket/p", "objectStore")  # remote stores: checked by first use


def test_spark_submit_master_and_conf_win(tmp_path: Path, bucket: TieredBucket) -> None:
    """Run under the real spark-submit: the job takes spark-submit's master and --conf
    (not a local[*] default) and does its work there; with a damaged fragment in one
    stream, scrub reports it in the JSON report, logs its stages and exits non-zero (one
    driver JVM for both, to keep the area's CI time down)."""
    import pyspark

    from tests.spark.test_jobs import flip_byte, walk

    beta = bucket.add_stream("beta")
    beta.append([b"b%05d" % i + os.urandom(90) for i in range(400)])
    beta.tier()
    flip_byte(bucket, walk(bucket, beta).fragments[0].key, 8 + 48 + 10)

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    script = tmp_path / "job.py"
    script.write_text(
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "from tierlog.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "conf = SparkSession.builder.getOrCreate().sparkContext.getConf()\n"
        "print('CONF', conf.get('spark.tierlog.probe', 'unset'), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    report = tmp_path / "report.json"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "SPARK_SUBMIT_OPTS": QUICK_JVM,  # the driver JVM lives seconds
    }
    cmd = [
        str(submit), "--master", "local[2]", "--conf", "spark.tierlog.probe=from-submit",
        "--conf", "spark.ui.enabled=false",
        str(script), "spark", "scrub", "--object-store", bucket.store_uri,
        "--meta-store", bucket.meta_uri, "--prefix", bucket.prefix, "--report", str(report),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    output = done.stdout + done.stderr  # spark-submit sends the driver's stderr to stdout
    assert done.returncode == 1, output[-3000:]
    assert "[tierlog scrub] spark master local[2]" in output
    assert "[tierlog scrub] stage" in output
    assert "CONF from-submit" in output
    result = json.loads(report.read_text())
    assert result["ok"] is False
    kinds = {s["name"]: [p["kind"] for p in s["problems"]] for s in result["streams"]}
    assert kinds == {"alpha": [], "beta": ["corrupt-fragment"]}
