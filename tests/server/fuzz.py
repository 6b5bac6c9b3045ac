"""A protocol fuzzer against a running server: random and mutated valid frames, sent
before and after authentication, while a healthy client keeps publishing and consuming.

Used by the bounded CI test (tests/server/test_protocol_fuzz.py) and by
``scripts/protocol_fuzz.py`` for long runs. Deterministic for a given seed.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.plugins.tierlog_server import RawClient, TierlogServerProcess
from tests.server.security_clients import healthy_round_trip, rss_bytes
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType
from tierlog.formats.protocol.publish import encode_publish

FUZZ_STREAM = "fuzz"
FRAMES_PER_SESSION = 40


@dataclass
class FuzzReport:
    frames: int = 0
    sessions: int = 0
    preauth_sessions: int = 0
    closed_by_server: int = 0
    health_checks: int = 0
    idle_rss: int = 0
    max_rss: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def rss_growth_mib(self) -> float:
        return (self.max_rss - self.idle_rss) / 2**20

    def summary(self) -> str:
        return (
            f"{self.frames} frames in {self.sessions} sessions "
            f"({self.preauth_sessions} before authentication), {self.closed_by_server} "
            f"closed by the server, {self.health_checks} healthy round trips, RSS growth "
            f"{self.rss_growth_mib:.1f} MiB, {self.seconds:.0f} s"
        )


def _name(rng: random.Random) -> str:
    return rng.choice([FUZZ_STREAM, "", "x" * rng.randint(1, 300), "nope", "é" * 3, "/"])


def valid_frame(rng: random.Random) -> bytes:
    """One well-formed client frame with random fields."""
    corr = rng.randint(0, 2**32 - 1)
    small = rng.randint(0, 255)
    makers: list[Callable[[], bytes]] = [
        lambda: c.PeerPropertiesRequest(corr, {"k" * rng.randint(1, 9): "v"}).encode(),
        lambda: c.SaslHandshakeRequest(corr).encode(),
        lambda: c.SaslAuthenticateRequest(
            corr, rng.choice(["PLAIN", "EXTERNAL", "X"]), c.plain_data("guest", "guest")
        ).encode(),
        lambda: c.Tune(rng.choice([0, 1, 1024, 2**20, 2**32 - 1]), rng.randint(0, 99)).encode(),
        lambda: c.OpenRequest(corr, rng.choice(["/", "other", ""])).encode(),
        lambda: c.Heartbeat().encode(),
        lambda: c.CreateRequest(corr, _name(rng), {"max-age": rng.choice(["1D", "x"])}).encode(),
        lambda: c.DeleteRequest(corr, rng.choice(["nope", "zz"])).encode(),
        lambda: c.MetadataRequest(corr, [_name(rng) for _ in range(rng.randint(0, 3))]).encode(),
        lambda: c.StreamStatsRequest(corr, _name(rng)).encode(),
        lambda: c.RouteRequest(corr, "k", _name(rng)).encode(),
        lambda: c.PartitionsRequest(corr, _name(rng)).encode(),
        lambda: c.ExchangeCommandVersionsRequest(corr, []).encode(),
        lambda: c.DeclarePublisherRequest(
            corr, small, rng.choice(["", "ref"]), _name(rng)
        ).encode(),
        lambda: c.QueryPublisherSequenceRequest(corr, "ref", _name(rng)).encode(),
        lambda: c.DeletePublisherRequest(corr, small).encode(),
        lambda: encode_publish(
            small, [(rng.randint(0, 2**63), rng.randbytes(rng.randint(0, 64))) for _ in range(3)]
        ),
        lambda: c.SubscribeRequest(
            corr, small, _name(rng), c.WireOffsetSpec(OffsetType.FIRST), rng.randint(0, 10)
        ).encode(),
        lambda: c.CreditRequest(small, rng.randint(0, 65535)).encode(),
        lambda: c.StoreOffsetRequest("ref", _name(rng), rng.randint(0, 2**63)).encode(),
        lambda: c.QueryOffsetRequest(corr, "ref", _name(rng)).encode(),
        lambda: c.UnsubscribeRequest(corr, small).encode(),
        lambda: c.CloseRequest(corr, 1, "bye").encode(),
    ]
    return rng.choice(makers)()


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not buf:
            break
        pos = rng.randrange(len(buf))
        kind = rng.choice(["flip", "set", "insert", "delete", "truncate"])
        if kind == "flip":
            buf[pos] ^= 1 << rng.randint(0, 7)
        elif kind == "set":
            buf[pos] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
        elif kind == "insert":
            buf[pos:pos] = rng.randbytes(rng.randint(1, 4))
        elif kind == "delete":
            del buf[pos]
        else:
            del buf[pos:]
    if rng.random() < 0.5 and len(buf) >= 8:  # keep the size prefix honest half the time
        buf[:4] = struct.pack(">I", len(buf) - 4)
    return bytes(buf)


def fuzz_frame(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.15:
        body = rng.randbytes(rng.randint(0, 64))
        return struct.pack(">I", len(body)) + body if rng.random() < 0.7 else body
    if roll < 0.55:
        return valid_frame(rng)
    return mutate(rng, valid_frame(rng))


def _drain(sock: socket.socket) -> bool:
    """Read what the server sent; True when it closed the connection."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(1 << 20):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def run_fuzz(
    server: TierlogServerProcess,
    frames: int,
    seed: int = 1,
    health_every: int = 1000,
    log: Callable[[str], None] | None = None,
) -> FuzzReport:
    """Send ``frames`` fuzz frames in sessions of up to FRAMES_PER_SESSION."""
    rng = random.Random(seed)
    assert server.proc is not None
    pid = server.proc.pid
    report = FuzzReport()
    setup = RawClient(server.host, server.stream_port)
    setup.handshake()
    setup.send(c.CreateRequest(setup.next_corr(), FUZZ_STREAM, {}).encode())
    setup.expect(c.SimpleResponse)
    setup.close()
    healthy_round_trip(server.host, server.stream_port)
    time.sleep(0.3)
    report.idle_rss = report.max_rss = rss_bytes(pid)
    started = time.monotonic()
    next_health = health_every
    while report.frames < frames:
        preauth = rng.random() < 0.4
        client = RawClient(server.host, server.stream_port)
        try:
            if not preauth:
                client.handshake()
            report.sessions += 1
            report.preauth_sessions += preauth
            closed = False
            for _ in range(min(FRAMES_PER_SESSION, frames - report.frames)):
                try:
                    client.sock.sendall(fuzz_frame(rng))
                except OSError:
                    closed = True
                    break
                report.frames += 1
            time.sleep(0.01)
            closed = closed or _drain(client.sock)
            report.closed_by_server += closed
        except (OSError, ConnectionError, AssertionError) as exc:
            report.errors.append(f"session {report.sessions}: {exc!r}")
        finally:
            client.close()
        if not server.alive():
            raise AssertionError(f"server died after {report.frames} frames:\n{server.log_tail()}")
        report.max_rss = max(report.max_rss, rss_bytes(pid))
        if report.frames >= next_health:
            next_health += health_every
            healthy_round_trip(server.host, server.stream_port)
            report.health_checks += 1
            if log is not None:
                log(report.summary())
    healthy_round_trip(server.host, server.stream_port)
    report.health_checks += 1
    report.seconds = time.monotonic() - started
    return report
