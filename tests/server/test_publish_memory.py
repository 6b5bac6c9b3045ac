"""Memory budgets count what is held, not what arrived (issue 30, finding 6).

Publishers that never read their confirms send frames of 16,000 one-byte messages: 13
bytes each on the wire, ~20x that once decoded into per-message Python objects and
confirms. The oracle is the server process's peak RSS (``/proc/<pid>/status``, sampled
while they publish): at most +32 MiB for one such connection, +256 MiB for 20 at once,
and a healthy client is served meanwhile.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.tierlog_server import RawClient, TierlogServerProcess
from tests.server.security_clients import healthy_round_trip, rss_bytes
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import encode_publish
from tierlog.server.limits import PublishMemory

MIB = 1024 * 1024
MESSAGES_PER_FRAME = 16_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TierlogServerProcess]:
    process = TierlogServerProcess(tmp_path / "data", config_text="[tier]\nenabled = false\n")
    process.start()
    try:
        yield process
    finally:
        try:
            process.stop()
        finally:
            process.kill()


class Flooder:
    """A publisher on a non-blocking socket with a small receive buffer that never reads."""

    def __init__(self, server: TierlogServerProcess, stream: str) -> None:
        client = RawClient(server.host, server.stream_port)
        assert client.handshake() == ResponseCode.OK
        client.send(c.CreateRequest(client.next_corr(), stream, {}).encode())
        client.expect(c.SimpleResponse)
        client.send(c.DeclarePublisherRequest(client.next_corr(), 1, "", stream).encode())
        declared = client.expect(c.SimpleResponse)
        assert isinstance(declared, c.SimpleResponse) and declared.response_code == 1
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        client.sock.setblocking(False)
        self.client = client
        self.next_id = 1
        self.pending = b""
        self.sent = 0
        self.last_progress = time.monotonic()

    def push(self) -> bool:
        """Send what the socket takes; True if it took anything."""
        if not self.pending:
            ids = range(self.next_id, self.next_id + MESSAGES_PER_FRAME)
            self.pending = encode_publish(1, [(i, b"x") for i in ids])
            self.next_id += MESSAGES_PER_FRAME
        try:
            n = self.client.sock.send(self.pending)
        except BlockingIOError:
            return False
        self.pending = self.pending[n:]
        self.sent += n
        self.last_progress = time.monotonic()
        return n > 0

    def close(self) -> None:
        self.client.close()


def _server_rss(server: TierlogServerProcess) -> int:
    assert server.proc is not None
    return rss_bytes(server.proc.pid)


def _flood(server: TierlogServerProcess, flooders: list[Flooder], seconds: float, idle: int) -> int:
    """Push on every flooder for ``seconds`` (or until each took nothing for 3 s);
    return the peak RSS of the server process above ``idle``."""
    assert server.proc is not None
    pid = server.proc.pid
    peak = idle
    started = time.monotonic()
    checked = time.monotonic()
    while time.monotonic() - started < seconds:
        progressed = False
        for flooder in flooders:
            progressed |= flooder.push()
        if time.monotonic() - checked > 0.05:
            peak = max(peak, rss_bytes(pid))
            checked = time.monotonic()
        now = time.monotonic()
        if all(now - f.last_progress > 3.0 for f in flooders):
            break
        if not progressed:
            time.sleep(0.01)
    peak = max(peak, rss_bytes(pid))
    return peak - idle


def test_one_never_reading_publisher_of_tiny_messages(server: TierlogServerProcess) -> None:
    flooder = Flooder(server, "tiny-flood")
    try:
        time.sleep(0.5)
        grown = _flood(server, [flooder], seconds=40, idle=_server_rss(server))
        print(f"one publisher: {flooder.sent / MIB:.1f} MiB read, peak RSS +{grown / MIB:.1f} MiB")
        assert time.monotonic() - flooder.last_progress > 3.0, "the server kept reading it"
        assert grown <= 32 * MIB, f"peak RSS grew {grown / MIB:.0f} MiB for one connection"
        healthy_round_trip(server.host, server.stream_port)
    finally:
        flooder.close()


def test_twenty_never_reading_publishers_at_once(server: TierlogServerProcess) -> None:
    flooders = [Flooder(server, f"tiny-flood-{k}") for k in range(20)]
    try:
        time.sleep(0.5)
        idle = _server_rss(server)
        grown = _flood(server, flooders, seconds=10, idle=idle)
        # other connections are served meanwhile (the flooders still hold their budget)
        healthy_round_trip(server.host, server.stream_port, timeout=30)
        grown = max(grown, _flood(server, flooders, seconds=2, idle=idle))
        sent = sum(f.sent for f in flooders)
        print(f"20 publishers: {sent / MIB:.1f} MiB read, peak RSS +{grown / MIB:.1f} MiB")
        assert grown <= 256 * MIB, f"peak RSS grew {grown / MIB:.0f} MiB for 20 connections"
    finally:
        for flooder in flooders:
            flooder.close()
    healthy_round_trip(server.host, server.stream_port)


class _Waiter:
    def __init__(self) -> None:
        self.relieved = 0

    def memory_relieved(self) -> None:
        self.relieved += 1


def test_node_budget_wakes_waiting_connections_at_half() -> None:
    """The node-wide budget's rule (the server test above measures its effect): over the
    limit connections wait; they are told once the held total is at most half of it."""
    memory = PublishMemory(1000)
    waiter = _Waiter()
    memory.hold(1200)
    assert memory.over()
    memory.waiting.add(waiter)
    memory.release(600)  # 600 held: under the limit, over half
    assert not memory.over() and waiter.relieved == 0
    memory.release(100)  # 500: half
    assert waiter.relieved == 1 and not memory.waiting
    memory.release(500)
    assert memory.used == 0 and waiter.relieved == 1
