"""A real etcd server for the tests, plus the ``meta_store`` fixtures over every backend.

``etcd_server`` (session scope) finds the ``etcd`` binary, installing the Debian package
``etcd-server`` when it is missing (CI must run these tests, never skip them), starts it
on free loopback ports with a temporary data dir, waits until it is healthy, yields its
endpoint ``host:port`` and stops it by PID at session end.

``meta_store_uri`` / ``meta_store`` (function scope) are parametrized over the SQLite and
etcd backends and give each test a fresh, empty namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierlog.storage.meta_store import MetaStore, open_meta_store

ETCD_PACKAGE = "etcd-server"
HEALTH_TIMEOUT_S = 30.0


def find_or_install_etcd() -> str:
    """Path of the ``etcd`` binary; installs ``etcd-server`` with apt-get when missing."""
    found = shutil.which("etcd") or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None
    )
    if found:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", ETCD_PACKAGE],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    found = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(found, os.X_OK):
        raise RuntimeError(f"installed {ETCD_PACKAGE} but found no etcd binary")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(client_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/health", timeout=1) as r:
            return b'"true"' in r.read()
    except OSError:
        return False


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process we started, by its PID: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def start_etcd(binary: str, data_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start one etcd member on free loopback ports; retry if a port was taken meanwhile."""
    last_log = ""
    for attempt in range(3):
        client_port, peer_port = free_port(), free_port()
        member_dir = data_dir / f"member-{attempt}"
        log_path = data_dir / f"etcd-{attempt}.log"
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        args = [
            binary,
            "--name=tierlog-test",
            f"--data-dir={member_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=tierlog-test={peer_url}",
            "--initial-cluster-state=new",
            # Short raft timings lower etcd's minimum lease TTL to 1 s for the lease tests.
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--quota-backend-bytes=268435456",
            "--logger=zap",
            "--log-level=warn",
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _healthy(client_port):
                return proc, client_port
            time.sleep(0.1)
        stop_process(proc)
        last_log = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"etcd did not become healthy; last log:\n{last_log}")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[str]:
    """Endpoint ``127.0.0.1:PORT`` of a real etcd server, for the whole test session."""
    binary = find_or_install_etcd()
    data_dir = Path(tempfile.mkdtemp(prefix="tierlog-etcd-"))
    proc, client_port = start_etcd(binary, data_dir)
    try:
        yield f"127.0.0.1:{client_port}"
    finally:
        stop_process(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


META_BACKENDS = ["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)]


@pytest.fixture(params=META_BACKENDS)
def meta_store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URI of a fresh, empty MetaStore namespace on each backend."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'meta.db'}"
    endpoint = request.getfixturevalue("etcd_server")
    return f"etcd://{endpoint}/t-{uuid.uuid4().hex}"


@pytest.fixture
def meta_store(meta_store_uri: str) -> Iterator[MetaStore]:
    """A fresh, empty MetaStore on each backend, closed after the test."""
    store = open_meta_store(meta_store_uri)
    try:
        yield store
    finally:
        store.close()
