"""A real etcd server for the tests, plus the ``meta_store`` fixtures over every backend.

``etcd_server`` (session scope) finds the ``etcd`` binary, installing the Debian package
``etcd-server`` when it is missing (CI must run these tests, never skip them), starts it
on free loopback ports with a temporary data dir, waits until it is healthy, yields its
endpoint ``host:port`` and stops it by PID at session end.

``meta_store_uri`` / ``meta_store`` (function scope) are parametrized over the SQLite and
etcd backends and give each test a fresh, empty namespace.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

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


def _healthy(client_port: int, context: ssl.SSLContext | None = None) -> bool:
    scheme = "https" if context is not None else "http"
    url = f"{scheme}://127.0.0.1:{client_port}/health"
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as r:
            # with auth enabled /health may say false for want of a token; up is enough
            return r.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code in (401, 503) and context is not None
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


def start_etcd(
    binary: str, data_dir: Path, tls: TlsFiles | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """Start one etcd member on free loopback ports; retry if a port was taken meanwhile.
    With ``tls`` its client port speaks TLS only and wants client certificates."""
    last_log = ""
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls.ca))
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    for attempt in range(3):
        client_port, peer_port = free_port(), free_port()
        member_dir = data_dir / f"member-{attempt}"
        log_path = data_dir / f"etcd-{attempt}.log"
        client_url = f"{'https' if tls else 'http'}://127.0.0.1:{client_port}"
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
        if tls is not None:
            args += [
                f"--cert-file={tls.server_cert}",
                f"--key-file={tls.server_key}",
                f"--trusted-ca-file={tls.ca}",
                "--client-cert-auth",
            ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _healthy(client_port, context):
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


class TlsFiles(Protocol):
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


ETCD_ROOT_PASSWORD = "root-password-for-the-tests"


def enable_etcd_auth(endpoint: str, tls: TlsFiles) -> None:
    """Add etcd's ``root`` user (with a password) and turn authentication on."""
    import grpc
    from aetcd import rpc

    async def enable() -> None:
        credentials = grpc.ssl_channel_credentials(
            tls.ca.read_bytes(), tls.client_key.read_bytes(), tls.client_cert.read_bytes()
        )
        async with grpc.aio.secure_channel(endpoint, credentials) as channel:
            auth = rpc.AuthStub(channel)
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=ETCD_ROOT_PASSWORD))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.AuthEnable(rpc.AuthEnableRequest())

    asyncio.run(enable())


@pytest.fixture(scope="session")
def etcd_tls_server() -> Iterator[tuple[str, TlsFiles]]:
    """A second real etcd: TLS only, client certificates required, authentication on
    (user ``root``, password ``ETCD_ROOT_PASSWORD``). Yields its endpoint and the
    certificate files (CA, server, a client certificate for ``root``)."""
    from tests.server.certificates import make_certificates

    binary = find_or_install_etcd()
    data_dir = Path(tempfile.mkdtemp(prefix="tierlog-etcd-tls-"))
    certs = make_certificates(data_dir / "certs", client_cn="root")
    proc, client_port = start_etcd(binary, data_dir, certs)
    endpoint = f"127.0.0.1:{client_port}"
    try:
        enable_etcd_auth(endpoint, certs)
        yield endpoint, certs
    finally:
        stop_process(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def etcd_tls_uri(endpoint: str, tls: TlsFiles, namespace: str) -> str:
    """A MetaStore URI for ``etcd_tls_server``: user, password, CA and client certificate."""
    query = f"cacert={tls.ca}&cert={tls.client_cert}&key={tls.client_key}"
    return f"etcd://root:{ETCD_ROOT_PASSWORD}@{endpoint}/{namespace}?{query}"


META_BACKENDS = [
    "sqlite",
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("etcd-tls-auth", marks=pytest.mark.etcd),
]


@pytest.fixture(params=META_BACKENDS)
def meta_store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URI of a fresh, empty MetaStore namespace on each backend."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'meta.db'}"
    if request.param == "etcd-tls-auth":
        endpoint, tls = request.getfixturevalue("etcd_tls_server")
        return etcd_tls_uri(endpoint, tls, f"t-{uuid.uuid4().hex}")
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
