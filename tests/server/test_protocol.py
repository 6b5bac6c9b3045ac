"""Protocol robustness against a running server: auth, frame limits, unknown and fuzzed frames."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import Producer

from tests.plugins.tierlog_server import (  # noqa: F401
    RawClient,
    TierlogServerProcess,
    tierlog_server,
)
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command, OffsetType, ResponseCode
from tierlog.formats.protocol.publish import encode_publish

HOST = "127.0.0.1"


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.123", 9))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else str(address)


def metadata_ok(client: RawClient, stream: str = "none") -> bool:
    client.send(c.MetadataRequest(client.next_corr(), [stream]).encode())
    response = client.expect(c.MetadataResponse)
    return isinstance(response, c.MetadataResponse)


def test_bad_password_and_unknown_user_rejected(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    for user, password in (("guest", "nope"), ("mallory", "guest"), ("", "")):
        client = RawClient(HOST, tierlog_server.stream_port)
        assert client.handshake(user, password) == ResponseCode.AUTHENTICATION_FAILURE
        assert client.closed_by_server()
        client.close()


def test_commands_before_open_close_the_connection(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    client = RawClient(HOST, tierlog_server.stream_port)
    client.send(c.CreateRequest(1, "sneaky", {}).encode())
    assert client.closed_by_server()
    client.close()
    healthy = RawClient(HOST, tierlog_server.stream_port)
    assert healthy.handshake() == ResponseCode.OK
    assert metadata_ok(healthy, "sneaky")
    healthy.close()


def test_guest_only_from_loopback(tmp_path: Path) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    server = TierlogServerProcess(
        tmp_path / "data", host="0.0.0.0", env={"TIERLOG_USERS": "guest:guest,alice:secret"}
    ).start()
    try:
        remote_guest = RawClient(address, server.stream_port)
        code = remote_guest.handshake("guest", "guest")
        assert code == ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK
        remote_guest.close()
        alice = RawClient(address, server.stream_port)
        assert alice.handshake("alice", "secret") == ResponseCode.OK
        alice.close()
        local_guest = RawClient("127.0.0.1", server.stream_port)
        assert local_guest.handshake("guest", "guest") == ResponseCode.OK
        local_guest.close()
    finally:
        server.stop()


def test_oversized_frame_closes_only_that_connection(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    healthy = RawClient(HOST, tierlog_server.stream_port)
    assert healthy.handshake() == ResponseCode.OK
    small = RawClient(HOST, tierlog_server.stream_port)
    assert small.handshake(frame_max=4096) == ResponseCode.OK
    big = c.CreateRequest(small.next_corr(), "x", {"k": "v" * 5000}).encode()
    small.send(big)
    assert small.closed_by_server()
    small.close()
    # over the server's own maximum, before any negotiation
    raw = RawClient(HOST, tierlog_server.stream_port)
    raw.send(struct.pack(">IHH", 64 * 1024 * 1024, Command.PEER_PROPERTIES, 1))
    assert raw.closed_by_server()
    raw.close()
    assert metadata_ok(healthy)
    healthy.close()


def test_unknown_command_answered_and_connection_kept(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    client = RawClient(HOST, tierlog_server.stream_port)
    assert client.handshake() == ResponseCode.OK
    client.send(struct.pack(">IHHI", 8, 0x0777, 1, 99))
    client.sock.settimeout(5)
    raw = client.sock.recv(100)  # a bare response the client-side codec does not know
    assert raw == struct.pack(">IHHIH", 10, 0x8777, 1, 99, ResponseCode.UNKNOWN_FRAME)
    client.send(c.RouteRequest(5, "key", "super").encode())
    route = client.expect(c.RouteResponse)
    assert isinstance(route, c.RouteResponse)
    assert route.response_code == ResponseCode.STREAM_DOES_NOT_EXIST  # no such super stream
    # publish for an undeclared publisher → PublishError, connection stays
    client.send(encode_publish(7, [(1, b"x"), (2, b"y")]))
    error = client.expect(c.PublishError)
    assert isinstance(error, c.PublishError)
    assert list(error.errors) == [(1, 0x12), (2, 0x12)]
    # credit for an unknown subscription → CreditResponse
    client.send(c.CreditRequest(9, 1).encode())
    credit = client.expect(c.CreditResponse)
    assert isinstance(credit, c.CreditResponse)
    assert credit.response_code == ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
    assert metadata_ok(client)
    client.close()


# ------------------------------------------------------------------ fuzzing

_VALID_FRAMES = [
    c.PeerPropertiesRequest(1, {"a": "b"}).encode(),
    c.CreateRequest(2, "fuzz", {"max-age": "1h"}).encode(),
    c.DeleteRequest(3, "fuzz").encode(),
    c.MetadataRequest(4, ["fuzz", "other"]).encode(),
    c.DeclarePublisherRequest(5, 1, "ref", "fuzz").encode(),
    encode_publish(1, [(1, b"hello"), (2, b"world")]),
    c.QueryPublisherSequenceRequest(6, "ref", "fuzz").encode(),
    c.SubscribeRequest(7, 1, "fuzz", c.WireOffsetSpec(OffsetType.OFFSET, 3), 10).encode(),
    c.CreditRequest(1, 5).encode(),
    c.StoreOffsetRequest("ref", "fuzz", 9).encode(),
    c.QueryOffsetRequest(8, "ref", "fuzz").encode(),
    c.UnsubscribeRequest(9, 1).encode(),
    c.DeletePublisherRequest(10, 1).encode(),
    c.StreamStatsRequest(11, "fuzz").encode(),
    c.Heartbeat().encode(),
]


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(_VALID_FRAMES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "extend", "size"]))
        if kind == "flip" and len(frame) > 4:
            pos = draw(st.integers(4, len(frame) - 1))
            frame[pos] = draw(st.integers(0, 255))
        elif kind == "truncate" and len(frame) > 8:
            frame = frame[: draw(st.integers(4, len(frame) - 1))]
        elif kind == "extend":
            frame += draw(st.binary(min_size=1, max_size=32))
        elif kind == "size":
            frame[0:4] = struct.pack(">I", draw(st.integers(0, 1 << 20)))
    return bytes(frame)


fuzz_input = st.one_of(
    st.binary(min_size=1, max_size=256),
    mutated_frames(),
    st.lists(mutated_frames(), min_size=2, max_size=4).map(b"".join),
)


class HealthyPublisher:
    """An rstream producer publishing in a background thread for the whole fuzz run."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = 0
        self.confirmed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        try:
            async with Producer(HOST, port=self.port, username="guest", password="guest") as p:
                await p.create_stream("healthy", exists_ok=True)
                while not self._stop.is_set():
                    await p.send_wait("healthy", b"ok %d" % self.sent)
                    self.sent += 1
                    self.confirmed += 1
                    await asyncio.sleep(0.01)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> HealthyPublisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TierlogServerProcess]:
    server = TierlogServerProcess(tmp_path_factory.mktemp("fuzz") / "data").start()
    try:
        yield server
    finally:
        server.stop()


def _fuzz_once(port: int, data: bytes, authenticate: bool) -> None:
    client = RawClient(HOST, port, timeout=2.0)
    try:
        if authenticate:
            assert client.handshake() == ResponseCode.OK
        client.send(data)
        client.sock.settimeout(0.2)
        try:
            while client.recv_frame() is not None:
                pass
        except (TimeoutError, OSError):
            pass
        except Exception:
            pass  # the server may answer with frames our decoder rejects: not our concern
    finally:
        client.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=fuzz_input, authenticate=st.booleans())
def test_fuzzed_frames_never_hurt_the_server(
    fuzz_server: TierlogServerProcess, data: bytes, authenticate: bool
) -> None:
    _fuzz_once(fuzz_server.stream_port, data, authenticate)
    assert fuzz_server.alive()


def test_healthy_client_keeps_working_while_fuzzed(fuzz_server: TierlogServerProcess) -> None:
    import random

    rng = random.Random(7)
    with HealthyPublisher(fuzz_server.stream_port) as healthy:
        for n in range(150):
            frame = bytearray(rng.choice(_VALID_FRAMES))
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(4, len(frame))
                frame[pos] = rng.randrange(256)
            if n % 5 == 0:
                frame = bytearray(rng.randbytes(rng.randint(1, 64)))
            _fuzz_once(fuzz_server.stream_port, bytes(frame), authenticate=n % 2 == 0)
    assert healthy.error is None, repr(healthy.error)
    assert healthy.confirmed > 0
    assert fuzz_server.alive()
    checker = RawClient(HOST, fuzz_server.stream_port)
    assert checker.handshake() == ResponseCode.OK
    assert metadata_ok(checker, "healthy")
    checker.close()
    log_text = fuzz_server.log_tail(10_000_000)
    assert "Traceback" not in log_text, log_text[-3000:]
    assert "event=frame_error" not in log_text
