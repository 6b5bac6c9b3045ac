"""Issue 30's acceptance walk: every client command and every admin route, by users with
write-only, read-only and pattern-limited permissions (and the full-access administrator
and an administrator without stream permissions), against a real ``tierlog serve`` with a
delayed stream and its system stream. Every reserved name — the system stream, a made-up
``__tierlog`` stream, super stream, producer reference and consumer name — is refused, and
nothing reaches the system stream or the dispatcher's producer.

Clients: a raw-frame client for every command (one answer per request, by correlation
id), rstream for the commands it has, urllib for the admin API."""

from __future__ import annotations

import asyncio
import glob
import time
import urllib.parse
from pathlib import Path
from typing import Any

from rstream import AMQPMessage
from rstream.exceptions import ServerError
from rstream.schema import (
    QueryPublisherSequence,
    QueryPublisherSequenceResponse,
    SuperStreamPartitions,
    SuperStreamPartitionsResponse,
    SuperStreamRoute,
    SuperStreamRouteResponse,
)

from tests.plugins.tierlog_server import RawClient, TierlogServerProcess, running_server
from tests.server.reserved_clients import (
    HOST,
    PASSWORDS,
    USERS_TOML,
    admin,
    consumer,
    create_delayed,
    producer,
    schedule,
    wait_scheduler,
)
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType
from tierlog.formats.protocol.constants import ResponseCode as R
from tierlog.formats.protocol.publish import encode_publish
from tierlog.log.dump import iter_dump
from tierlog.log.names import is_reserved
from tierlog.log.reader import LogView
from tierlog.server.admin_security import (
    ADMINISTRATOR,
    METRICS,
    PUBLIC,
    ROUTE_PERMISSIONS,
    USER,
)
from tierlog.server.delayed_intake import DISPATCHER_REFERENCE, system_stream_name

STREAM = "orders"
SYSTEM = system_stream_name(STREAM)
MADE_UP = "__tierlog_made_up"
RESERVED_STREAMS = (SYSTEM, MADE_UP)
CONSUMER = "__tierlog_consumer"
ADMINS = ("guest", "ops")
MAY_WRITE = {"guest", "writer", "limited"}
MAY_READ = {"guest", "reader", "limited"}


def _answer(client: RawClient, request: Any) -> int:
    """Send a request; the response code of the answer with its correlation id."""
    client.send(request.encode())
    while True:
        frame = client.recv_frame()
        assert frame is not None, "connection closed"
        if getattr(frame, "correlation_id", None) == request.correlation_id:
            return int(frame.response_code)  # type: ignore[attr-defined]


def _refused_unless(allowed: bool) -> int:
    """The code for a reserved reference / consumer name: PRECONDITION_FAILED (an invalid
    argument) once the user may use the stream at all, else the permission's refusal."""
    return R.PRECONDITION_FAILED if allowed else R.ACCESS_REFUSED


def _walk_raw(server: TierlogServerProcess, user: str) -> None:
    client = RawClient(HOST, server.stream_port, timeout=10)
    try:
        assert client.handshake(user, PASSWORDS[user]) == R.OK
        n = client.next_corr
        for name in RESERVED_STREAMS:
            assert _answer(client, c.CreateRequest(n(), name, {})) == R.PRECONDITION_FAILED
            assert _answer(client, c.DeleteRequest(n(), name)) == R.ACCESS_REFUSED
            assert _answer(client, c.StreamStatsRequest(n(), name)) == R.ACCESS_REFUSED
            for reference in ("p", ""):
                declare = c.DeclarePublisherRequest(n(), 7, reference, name)
                assert _answer(client, declare) == R.ACCESS_REFUSED
            sequence = c.QueryPublisherSequenceRequest(n(), "p", name)
            assert _answer(client, sequence) == R.ACCESS_REFUSED
            spec = c.WireOffsetSpec(OffsetType.FIRST)
            assert _answer(client, c.SubscribeRequest(n(), 3, name, spec, 10)) == R.ACCESS_REFUSED
            client.send(c.StoreOffsetRequest("c", name, 1).encode())  # no answer: ignored
            assert _answer(client, c.QueryOffsetRequest(n(), "c", name)) == R.ACCESS_REFUSED
            assert _answer(client, c.RouteRequest(n(), "k", name)) == R.ACCESS_REFUSED
            assert _answer(client, c.PartitionsRequest(n(), name)) == R.ACCESS_REFUSED
            # as the super stream or as a partition of one: refused before permissions
            for super_stream, partition in ((name, "ss-part"), ("ss", name)):
                ss = c.CreateSuperStreamRequest(n(), super_stream, [partition], ["k"], {})
                assert _answer(client, ss) == R.PRECONDITION_FAILED
            ss_delete = c.DeleteSuperStreamRequest(n(), name)
            assert _answer(client, ss_delete) == R.ACCESS_REFUSED
        # the publisher was never declared: a Publish for it reaches nothing
        client.send(encode_publish(7, [(1, b"forged")]))
        error = client.expect(c.PublishError)
        assert list(error.errors) == [(1, R.PUBLISHER_DOES_NOT_EXIST)]  # type: ignore[attr-defined]
        metadata = c.MetadataRequest(n(), [*RESERVED_STREAMS, STREAM])
        client.send(metadata.encode())
        answer = client.expect(c.MetadataResponse)
        codes = {s.name: s.response_code for s in answer.streams}  # type: ignore[attr-defined]
        assert codes == {SYSTEM: R.ACCESS_REFUSED, MADE_UP: R.ACCESS_REFUSED, STREAM: R.OK}
        # reserved producer references and consumer names on the ordinary stream
        declare = c.DeclarePublisherRequest(n(), 8, DISPATCHER_REFERENCE, STREAM)
        assert _answer(client, declare) == _refused_unless(user in MAY_WRITE)
        sequence = c.QueryPublisherSequenceRequest(n(), DISPATCHER_REFERENCE, STREAM)
        assert _answer(client, sequence) == _refused_unless(user in MAY_WRITE | MAY_READ)
        spec = c.WireOffsetSpec(OffsetType.FIRST)
        subscribe = c.SubscribeRequest(n(), 4, STREAM, spec, 10, {"name": CONSUMER})
        assert _answer(client, subscribe) == _refused_unless(user in MAY_READ)
        client.send(c.StoreOffsetRequest(CONSUMER, STREAM, 1).encode())  # ignored
        query = c.QueryOffsetRequest(n(), CONSUMER, STREAM)
        assert _answer(client, query) == _refused_unless(user in MAY_READ)
        client.send(encode_publish(8, [(1, b"forged")]))
        error = client.expect(c.PublishError)
        assert list(error.errors) == [(1, R.PUBLISHER_DOES_NOT_EXIST)]  # type: ignore[attr-defined]
    finally:
        client.close()


async def _expect_refusal(call: Any, code: int) -> None:
    try:
        await call
    except ServerError as exc:
        assert exc.code == code, f"{type(exc).__name__} instead of code {code}"
        return
    raise AssertionError(f"not refused (wanted code {code})")


async def _walk_rstream(server: TierlogServerProcess, user: str) -> None:
    async with producer(server, user) as p:
        for name in RESERVED_STREAMS:
            client = await p.default_client  # (create / delete close the one before)
            await _expect_refusal(client.declare_publisher(name, "p", 9), R.ACCESS_REFUSED)
            await _expect_refusal(client.query_offset(name, "c"), R.ACCESS_REFUSED)
            for request, response in (
                # rstream's own methods for these do not look at the code: ask the same
                (QueryPublisherSequence(0, "p", name), QueryPublisherSequenceResponse),
                (SuperStreamRoute(0, "k", name), SuperStreamRouteResponse),
                (SuperStreamPartitions(0, name), SuperStreamPartitionsResponse),
            ):
                request.correlation_id = client._corr_id_seq.next()
                answer = await asyncio.wait_for(
                    client.sync_request(request, resp_schema=response, raise_exception=False), 10
                )
                assert answer.response_code == R.ACCESS_REFUSED, (request, answer)
            await _expect_refusal(p.create_stream(name), R.PRECONDITION_FAILED)
            await _expect_refusal(p.delete_stream(name), R.ACCESS_REFUSED)
        client = await p.default_client
        await _expect_refusal(
            client.declare_publisher(STREAM, DISPATCHER_REFERENCE, 10),
            _refused_unless(user in MAY_WRITE),
        )
        await _expect_refusal(p.send_wait(SYSTEM, AMQPMessage(body=b"forged")), R.ACCESS_REFUSED)
    async with consumer(server, user) as cons:

        async def ignore(*_args: Any) -> None:
            return None

        await _expect_refusal(cons.subscribe(SYSTEM, ignore), R.ACCESS_REFUSED)
        await _expect_refusal(
            cons.query_offset(STREAM, CONSUMER), _refused_unless(user in MAY_READ)
        )


def _admin_calls(method: str, path: str) -> list[tuple[str, Any]]:
    """(path, body) of each call of one route with a reserved name in it (or in its
    body); node routes name this server's node."""
    body = {
        ("PUT", "/api/streams/{name}/offload"): {"before": 0},
        ("POST", "/api/streams/{name}/delayed/cancel"): {"reference": "app", "publishing_id": 1},
        ("POST", "/api/streams/{name}/members"): {"add": "n2"},
        ("PATCH", "/api/streams/{name}"): {"settings": {"max_bytes": 10**9}},
        ("POST", "/api/nodes/{name}/retire"): {},
    }.get((method, path))
    if path == "/api/streams" and method == "POST":
        return [("/api/streams", {"name": name}) for name in RESERVED_STREAMS]
    if path == "/api/super-streams" and method == "POST":  # as the super stream or partition
        named = [{"name": name, "partitions": 1} for name in RESERVED_STREAMS]
        parts = [{"name": "ss", "partitions": [n], "binding_keys": ["k"]} for n in RESERVED_STREAMS]
        return [(path, body) for body in named + parts]
    if "{name}" in path and path.startswith(("/api/streams/", "/api/super-streams/")):
        quoted = (urllib.parse.quote(name, safe="") for name in RESERVED_STREAMS)
        return [(path.replace("{name}", q), body) for q in quoted]
    return [(path.replace("{name}", "n1"), body)]


def _walk_admin(server: TierlogServerProcess, user: str) -> set[tuple[str, str]]:
    walked = set()
    for (method, path), permission in ROUTE_PERMISSIONS.items():
        for call_path, body in _admin_calls(method, path):
            status, answer = admin(server, method, call_path, body, user=user)
            where = (user, method, call_path, answer)
            if permission == ADMINISTRATOR:
                # not a cluster node: an administrator gets 404, anyone else 403 first
                assert status == (404 if user in ADMINS else 403), where
            elif permission in (USER, METRICS, PUBLIC):
                assert status == 200, where
                if path == "/api/streams":
                    names = [s["name"] for s in answer["streams"]]
                    assert not any(is_reserved(n) for n in names), where
            else:
                assert status == 403, where
        walked.add((method, path))
    return walked


def _dir(server: TierlogServerProcess, stream: str) -> str:
    (stream_dir,) = glob.glob(str(server.data_dir / "streams" / f"*_{stream}_*"))
    return stream_dir


def _records(server: TierlogServerProcess, stream: str) -> list[dict[str, Any]]:
    """Every record the stream's local log holds, read from its files."""
    return list(iter_dump(_dir(server, stream)))


def _refusals(server: TierlogServerProcess) -> dict[str, float]:
    status, text = admin(server, "GET", "/metrics")
    assert status == 200
    out = {}
    for line in str(text).splitlines():
        if line.startswith("tierlog_access_refused_total{") and "reserved_name" in line:
            interface = line.split('interface="')[1].split('"')[0]
            out[interface] = float(line.split()[-1])
    return out


async def test_every_command_and_admin_route_refuses_reserved_names(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", config_text=USERS_TOML) as server:
        create_delayed(server, STREAM)
        wait_scheduler(server, STREAM)
        await schedule(server, STREAM, [b"an-hour-away"], delay_ms=3_600_000)
        assert len(_records(server, SYSTEM)) == 1  # the system stream exists: one SCHEDULE
        for user in ("writer", "reader", "limited", "guest", "ops"):
            _walk_raw(server, user)
            await _walk_rstream(server, user)
            assert _walk_admin(server, user) == set(ROUTE_PERMISSIONS)
        # nothing reached the system stream or the stream under a reserved name (and the
        # check sees what does: an ordinary consumer's offset, stored the same way)
        control = RawClient(HOST, server.stream_port, timeout=10)
        assert control.handshake() == R.OK
        control.send(c.StoreOffsetRequest("control", STREAM, 0).encode())
        query = c.QueryOffsetRequest(control.next_corr(), "control", STREAM)
        assert _answer(control, query) == R.OK
        control.close()
        time.sleep(0.3)
        assert len(_records(server, SYSTEM)) == 1
        assert _records(server, STREAM) == []
        system, stream = LogView(_dir(server, SYSTEM)), LogView(_dir(server, STREAM))
        assert system.query_offset("c") is None and system.producer_sequence("p") is None
        assert stream.query_offset("control") == 0 and stream.query_offset(CONSUMER) is None
        assert stream.producer_sequence(DISPATCHER_REFERENCE) is None
        status, body = admin(server, "GET", f"/api/streams/{STREAM}/delayed")
        assert status == 200 and body["scheduled"] == 1 and body["failed"] is None
        refused = _refusals(server)
        assert refused["stream"] > 100 and refused["admin"] > 50, refused
