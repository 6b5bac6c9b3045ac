"""Resource limits against a real server process: idle and half-sent pre-auth
connections, a publisher that never reads its confirms, connection and per-connection
caps. The oracle: the server's RSS (``/proc/<pid>/status``) stays within idle RSS +
128 MiB and a healthy client keeps publishing and consuming meanwhile."""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.tierlog_server import RawClient, TierlogServerProcess
from tests.server.security_clients import healthy_round_trip, rss_bytes
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish

RSS_HEADROOM = 128 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 8.0


def _raise_nofile(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is below the {wanted} this test needs")


@pytest.fixture
def limited_server(tmp_path: Path) -> Iterator[TierlogServerProcess]:
    _raise_nofile(8192)  # inherited by the server process
    config = f"""
[tier]
enabled = false
[limits]
handshake_timeout_seconds = {HANDSHAKE_TIMEOUT_S}
max_connections = 3000
"""
    server = TierlogServerProcess(tmp_path / "data", config_text=config).start()
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.kill()


def _server_pid(server: TierlogServerProcess) -> int:
    assert server.proc is not None
    return server.proc.pid


def _settled_rss(pid: int) -> int:
    time.sleep(0.5)
    return rss_bytes(pid)


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (reads and discards what it sent)."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def _wait_closed(sockets: list[socket.socket], at_least: int, timeout: float) -> int:
    """How many of ``sockets`` the server closed, polled until ``at_least`` are (or
    ``timeout``): the test waits on the closes, not a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        closed = sum(_closed_by_peer(s) for s in sockets)
        if closed >= at_least or time.monotonic() > deadline:
            return closed
        time.sleep(0.05)


def test_2000_idle_preauth_connections(limited_server: TierlogServerProcess) -> None:
    server = limited_server
    pid = _server_pid(server)
    healthy_round_trip(server.host, server.stream_port)
    idle_rss = _settled_rss(pid)
    sockets: list[socket.socket] = []
    try:
        opened_at = time.monotonic()
        for _ in range(2000):
            sockets.append(socket.create_connection((server.host, server.stream_port), 10))
        healthy_round_trip(server.host, server.stream_port)
        grown = rss_bytes(pid) - idle_rss
        print(f"2000 idle pre-auth connections: RSS +{grown / 2**20:.1f} MiB")
        assert grown < RSS_HEADROOM, f"RSS grew {grown >> 20} MiB"
        assert server.alive()
        # the handshake deadline closes every one of them
        deadline = opened_at + HANDSHAKE_TIMEOUT_S + 20
        pending = list(sockets)
        while pending and time.monotonic() < deadline:
            pending = [s for s in pending if not _closed_by_peer(s)]
            time.sleep(0.2)
        assert not pending, f"{len(pending)} idle connections still open after the deadline"
        assert time.monotonic() - opened_at >= HANDSHAKE_TIMEOUT_S - 1
    finally:
        for s in sockets:
            s.close()
    healthy_round_trip(server.host, server.stream_port)


def test_150_connections_holding_partial_1mib_frames(limited_server: TierlogServerProcess) -> None:
    server = limited_server
    pid = _server_pid(server)
    idle_rss = _settled_rss(pid)
    sockets: list[socket.socket] = []
    chunk = b"\x00" * 65536
    try:
        for _ in range(150):
            s = socket.create_connection((server.host, server.stream_port), 10)
            s.setblocking(False)
            sockets.append(s)
            # a frame header announcing 1 MiB, then part of the body, never finished
            with contextlib.suppress(BlockingIOError, ConnectionResetError, BrokenPipeError):
                s.send(struct.pack(">I", 1024 * 1024))
                for _ in range(15):
                    s.send(chunk)
        healthy_round_trip(server.host, server.stream_port)
        grown = rss_bytes(pid) - idle_rss
        print(f"150 partial 1 MiB frames: RSS +{grown / 2**20:.1f} MiB")
        assert grown < RSS_HEADROOM, f"RSS grew {grown >> 20} MiB"
        # refused at the header: frames before authentication are a few KiB at most
        closed = _wait_closed(sockets, len(sockets), timeout=1.0)
        assert closed == len(sockets)
    finally:
        for s in sockets:
            s.close()
    assert "frame_too_large" in server.log_tail(200_000)


def test_publisher_that_never_reads_confirms(limited_server: TierlogServerProcess) -> None:
    server = limited_server
    pid = _server_pid(server)
    client = RawClient(server.host, server.stream_port)
    assert client.handshake() == ResponseCode.OK
    client.send(c.CreateRequest(client.next_corr(), "flood", {}).encode())
    client.expect(c.SimpleResponse)
    client.send(c.DeclarePublisherRequest(client.next_corr(), 1, "", "flood").encode())
    client.expect(c.SimpleResponse)
    idle_rss = _settled_rss(pid)
    sock = client.sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    # tiny messages: each costs 22 bytes in and 8 bytes of confirm out
    next_id = 1
    sent = 0
    stalled_since: float | None = None
    limit = 400 * 1024 * 1024
    started = time.monotonic()
    pending = b""
    try:
        while sent < limit and time.monotonic() - started < 90:
            if not pending:
                pending = encode_publish(1, [(next_id + i, b"0123456789") for i in range(2000)])
                next_id += 2000
            try:
                n = sock.send(pending)
            except BlockingIOError:
                n = 0
            if n:
                sent += n
                pending = pending[n:]
                stalled_since = None
                continue
            if stalled_since is None:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > 3.0:
                break  # the server stopped reading us: the budget works
            time.sleep(0.05)
        assert sent < limit, "the server kept reading a client that never reads"
        healthy_round_trip(server.host, server.stream_port)
        grown = rss_bytes(pid) - idle_rss
        print(f"never-reading publisher: {sent / 2**20:.1f} MiB read, RSS +{grown / 2**20:.1f} MiB")
        assert grown < RSS_HEADROOM, f"RSS grew {grown >> 20} MiB after {sent >> 20} MiB sent"
        # once it reads its confirms again, the same connection is served again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        last_id = next_id - 1 if not pending else next_id - 2001
        sock.settimeout(0.2)
        deadline = time.monotonic() + 60
        confirmed = 0
        while time.monotonic() < deadline:
            if pending:
                try:
                    n = sock.send(pending)
                    pending = pending[n:]
                except (BlockingIOError, TimeoutError):
                    pass
                if not pending:
                    last_id = next_id - 1
            try:
                data = sock.recv(1 << 20)
            except (BlockingIOError, TimeoutError):
                continue
            assert data, "the server closed the publisher"
            for frame in client.splitter.feed(data):
                decoded = c.decode_server_frame(frame)
                if isinstance(decoded, PublishConfirm):
                    confirmed = max(confirmed, max(decoded.publishing_ids))
            if not pending and confirmed >= last_id:
                break
        assert confirmed == next_id - 1, f"confirmed up to {confirmed} of {next_id - 1}"
    finally:
        client.close()
    healthy_round_trip(server.host, server.stream_port)


def test_connection_and_per_connection_caps(tmp_path: Path) -> None:
    config = """
[tier]
enabled = false
[limits]
max_connections = 20
max_connections_per_user = 3
max_publishers_per_connection = 2
max_subscriptions_per_connection = 1
"""
    server = TierlogServerProcess(tmp_path / "data", config_text=config).start()
    clients: list[RawClient] = []
    try:
        for _ in range(3):
            client = RawClient(server.host, server.stream_port)
            assert client.handshake() == ResponseCode.OK
            clients.append(client)
        fourth = RawClient(server.host, server.stream_port)
        assert fourth.handshake() == ResponseCode.ACCESS_REFUSED
        assert fourth.closed_by_server()
        first = clients[0]
        first.send(c.CreateRequest(first.next_corr(), "capped", {}).encode())
        first.expect(c.SimpleResponse)
        codes = []
        for pid in range(3):
            first.send(c.DeclarePublisherRequest(first.next_corr(), pid, "", "capped").encode())
            response = first.expect(c.SimpleResponse)
            assert isinstance(response, c.SimpleResponse)
            codes.append(response.response_code)
        assert codes == [1, 1, ResponseCode.PRECONDITION_FAILED]
        spec = c.WireOffsetSpec(1)
        codes = []
        for sid in range(2):
            first.send(c.SubscribeRequest(first.next_corr(), sid, "capped", spec, 1).encode())
            response = first.expect(c.SimpleResponse)
            assert isinstance(response, c.SimpleResponse)
            codes.append(response.response_code)
        assert codes == [1, ResponseCode.PRECONDITION_FAILED]
        # total cap: the 21st socket is dropped at once
        extra = [socket.create_connection((server.host, server.stream_port)) for _ in range(20)]
        assert _wait_closed(extra, 3, timeout=0.5) >= 3
        for s in extra:
            s.close()
    finally:
        for client in clients:
            client.close()
        server.stop()
