"""A service's signals and health probes, on the real ``tierlog serve`` (issue 30, item 8).

SIGHUP reloads users, permissions and TLS certificates (a broken configuration is not
applied and the log says why); SIGTERM and SIGINT stop cleanly; ``/api/health/live`` and
``/api/health/ready`` answer without credentials (degraded tiering: see
``test_s3_faults.py``)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rstream import Producer
from rstream.exceptions import AccessRefused

from tests.plugins.tierlog_server import RawClient, TierlogServerProcess
from tests.server.certificates import make_certificates
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode

BASE = """
[tier]
enabled = false
"""


def _config(users: dict[str, str], extra: str = "") -> str:
    table = ", ".join(f'{u} = "{p}"' for u, p in users.items())
    return f"{BASE}\n[auth]\nusers = {{ {table} }}\nloopback_users = []\n{extra}"


def _config_path(server: TierlogServerProcess) -> Path:
    return server.data_dir.parent / f"{server.data_dir.name}-server.toml"


def _hangup(server: TierlogServerProcess, event: str, timeout: float = 10.0) -> str:
    """Send SIGHUP and wait for the log line ``event`` it causes; return the line."""
    assert server.proc is not None
    seen = server.log_tail(10_000_000).count(f"event={event}")
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [x for x in server.log_tail(10_000_000).splitlines() if f"event={event}" in x]
        if len(lines) > seen:
            return lines[-1]
        assert server.alive(), f"the server died on SIGHUP:\n{server.log_tail()}"
        time.sleep(0.05)
    raise AssertionError(f"no {event} after SIGHUP:\n{server.log_tail()}")


def _login(server: TierlogServerProcess, user: str, password: str) -> int:
    client = RawClient(server.host, server.stream_port)
    try:
        return client.handshake(user, password)
    finally:
        client.close()


def _get(server: TierlogServerProcess, path: str, host: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"{server.admin_url}{path}")
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture
def server(tmp_path: Path) -> Any:
    users = {"alice": "alice-pw", "bob": "bob-pw"}
    process = TierlogServerProcess(tmp_path / "data", config_text=_config(users))
    process.start()
    try:
        yield process
    finally:
        try:
            process.stop()
        finally:
            process.kill()


async def test_sighup_reloads_users_and_permissions(server: TierlogServerProcess) -> None:
    assert _login(server, "alice", "alice-pw") == ResponseCode.OK
    assert _login(server, "carol", "carol-pw") == ResponseCode.AUTHENTICATION_FAILURE
    bob = RawClient(server.host, server.stream_port)
    assert bob.handshake("bob", "bob-pw") == ResponseCode.OK
    async with Producer(
        server.host, port=server.stream_port, username="alice", password="alice-pw"
    ) as p:
        await p.create_stream("before-reload")
    # bob removed, carol added, alice limited to streams named alice-*
    permissions = """
[auth.permissions.alice."/"]
configure = "alice-.*"
write = "alice-.*"
read = "alice-.*"
"""
    users = {"alice": "alice-pw", "carol": "carol-pw"}
    _config_path(server).write_text(_config(users, permissions))
    line = _hangup(server, "config_reloaded")
    assert "connections_closed=1" in line
    assert _login(server, "carol", "carol-pw") == ResponseCode.OK
    assert _login(server, "bob", "bob-pw") == ResponseCode.AUTHENTICATION_FAILURE
    assert bob.closed_by_server(), "the removed user's open connection stays open"
    bob.close()
    async with Producer(
        server.host, port=server.stream_port, username="alice", password="alice-pw"
    ) as p:
        with pytest.raises(AccessRefused):
            await p.create_stream("not-alices")
        await p.create_stream("alice-1")
    assert server.alive()


def test_sighup_with_a_broken_config_keeps_the_running_one(server: TierlogServerProcess) -> None:
    path = _config_path(server)
    good = path.read_text()
    broken = {
        "not TOML": "[auth\nusers = ",
        "a regex that does not compile": _config(
            {"alice": "alice-pw"}, '[auth.permissions.alice."/"]\nconfigure = "("\n'
        ),
        "a certificate file that does not exist": _config(
            {"alice": "alice-pw"}, '[tls]\ncertfile = "/nonexistent.pem"\nkeyfile = "/x.key"\n'
        ),
    }
    for what, text in broken.items():
        path.write_text(text)
        line = _hangup(server, "config_reload_failed")
        assert "kept=" in line and "error=" in line, (what, line)
        assert _login(server, "bob", "bob-pw") == ResponseCode.OK, what
    path.write_text(good)
    _hangup(server, "config_reloaded")
    assert _login(server, "bob", "bob-pw") == ResponseCode.OK


def _served_certificate(port: int, cafile: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def test_sighup_swaps_the_tls_certificate(tmp_path: Path) -> None:
    first = make_certificates(tmp_path / "first")
    second = make_certificates(tmp_path / "second")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(first.server_cert, live / "server.pem")
    shutil.copy(first.server_key, live / "server.key")
    tls = (
        f'[tls]\ncertfile = "{live / "server.pem"}"\nkeyfile = "{live / "server.key"}"\nport = 0\n'
    )
    server = TierlogServerProcess(
        tmp_path / "data", config_text=_config({"alice": "alice-pw"}, tls)
    ).start()
    try:
        assert _served_certificate(server.tls_port, first.ca) == ssl.PEM_cert_to_DER_cert(
            first.server_cert.read_text()
        )
        # a certificate that does not match the key: refused, the old one stays
        shutil.copy(second.server_cert, live / "server.pem")
        assert "error=" in _hangup(server, "config_reload_failed")
        assert _served_certificate(server.tls_port, first.ca)
        shutil.copy(second.server_key, live / "server.key")
        _hangup(server, "config_reloaded")
        served = _served_certificate(server.tls_port, second.ca)
        assert served == ssl.PEM_cert_to_DER_cert(second.server_cert.read_text())
        with pytest.raises(ssl.SSLCertVerificationError):
            _served_certificate(server.tls_port, first.ca)
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_sigterm_and_sigint_stop_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    server = TierlogServerProcess(tmp_path / "data", config_text=BASE).start()
    try:
        async with Producer(
            server.host, port=server.stream_port, username="guest", password="guest"
        ) as p:
            await p.create_stream("kept")
            for i in range(10):
                await p.send_wait("kept", b"m%d" % i)
        assert server.proc is not None
        proc = server.proc
        proc.send_signal(sig)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{sig.name} did not stop it:\n{server.log_tail()}") from None
        assert code == 0, server.log_tail()
        assert "event=server_stopped" in server.log_tail(100_000)
        server.proc = None
        server.start()
        client = RawClient(server.host, server.stream_port, timeout=30)
        assert client.handshake() == ResponseCode.OK
        client.send(c.StreamStatsRequest(client.next_corr(), "kept").encode())
        stats = client.expect(c.StreamStatsResponse)
        assert isinstance(stats, c.StreamStatsResponse)
        assert stats.stats["committed_chunk_id"] >= 0
        client.close()
    finally:
        server.stop()


def test_health_probes_need_no_credentials(server: TierlogServerProcess) -> None:
    assert _get(server, "/api/health/live") == (200, {"status": "live"})
    assert _get(server, "/api/health/ready") == (200, {"status": "ready"})
    # a Kubernetes probe comes by the pod's address, as Host
    assert _get(server, "/api/health/ready", host="10.1.2.3:15672")[0] == 200
    status, _body = _get(server, "/api/health")
    assert status == 401  # the full health route still needs credentials
    assert _get(server, "/api/streams")[0] == 401
