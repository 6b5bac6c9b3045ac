"""Delayed delivery through a running server with the real ``rstream`` client: scheduled
messages appended once when due and never early, immediate ones at once, typed errors,
the hidden system stream, admin status / cancel and the metrics."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    CompressionType,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream.consumer import Consumer, MessageContext
from rstream.producer import ConfirmationStatus

from tierlog.formats.protocol.constants import ResponseCode
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection
from tierlog.server.delayed_intake import DISPATCHER_REFERENCE, system_stream_name

HOST = "127.0.0.1"
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def _config(tmp_path: Path) -> ServerConfig:
    return replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
    )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(_config(tmp_path))
    await srv.start()
    await srv.streams_opened(10)
    try:
        yield srv
    finally:
        await srv.stop()


def admin(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://{HOST}:{server.admin_port}{path}", data=data, method=method
    )
    req.add_header("Authorization", AUTH)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


async def admin_async(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.get_running_loop().run_in_executor(None, admin, server, method, path, body)


def producer(server: Server) -> Producer:
    return Producer(HOST, port=server.stream_port, username="guest", password="guest")


async def collect(
    server: Server, stream: str, count: int, timeout: float
) -> list[tuple[int, int, bytes, dict[Any, Any]]]:
    """(offset, chunk timestamp ms, body, application properties) of ``count`` messages."""
    got: list[tuple[int, int, bytes, dict[Any, Any]]] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        props = dict(msg.application_properties or {})
        got.append((ctx.offset, ctx.timestamp, bytes(msg.body), props))
        if len(got) >= count:
            done.set()

    consumer = Consumer(HOST, port=server.stream_port, username="guest", password="guest")
    async with consumer:
        await consumer.subscribe(
            stream,
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
            decoder=amqp_decoder,
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)
    return got


def _key(props: dict[Any, Any], name: str) -> Any:
    for k, v in props.items():
        if (k.decode() if isinstance(k, bytes) else k) == name:
            return v
    return None


async def test_scheduled_messages_arrive_once_when_due_never_early(server: Server) -> None:
    stream = "orders"
    statuses: list[ConfirmationStatus] = []
    now_ms = int(time.time() * 1000)
    expected: dict[bytes, int] = {}
    async with producer(server) as p:
        await p.create_stream(stream, arguments={"x-tierlog-delayed": "true"})
        batch = []
        for i in range(300):
            body = f"m{i}".encode()
            if i % 3 == 0:  # immediate
                batch.append(AMQPMessage(body=body))
                expected[body] = 0
            elif i % 3 == 1:
                due = now_ms + 500 + (i * 7) % 2500
                batch.append(AMQPMessage(body=body, application_properties={"x-deliver-at": due}))
                expected[body] = due
            else:
                delay = (i * 13) % 2000
                batch.append(AMQPMessage(body=body, application_properties={"x-delay": delay}))
                expected[body] = now_ms + delay

        async def on_confirm(status: ConfirmationStatus) -> None:
            statuses.append(status)

        for k in range(0, len(batch), 50):
            await p.send_batch(
                stream, batch[k : k + 50], publisher_name="app", on_publish_confirm=on_confirm
            )
        for _ in range(200):
            if len(statuses) == len(batch):
                break
            await asyncio.sleep(0.05)
    assert len(statuses) == 300 and all(s.is_confirmed for s in statuses)
    got = await collect(server, stream, 300, timeout=15)
    bodies = [b for _o, _t, b, _p in got]
    assert sorted(bodies) == sorted(expected)  # every message exactly once
    for _offset, ts, body, _props in got:
        assert ts >= expected[body], f"{body!r} appended at {ts}, due {expected[body]}"
    # nothing more arrives (no second copy)
    await asyncio.sleep(0.5)
    again = await collect(server, stream, 301, timeout=1.0)
    assert len(again) == 300
    handle = server.broker.get("/", stream)
    assert handle is not None
    assert handle.log.producer_sequence(DISPATCHER_REFERENCE) == 200
    # the system stream is hidden from the listing and cannot be deleted directly
    status, listing = await admin_async(server, "GET", "/api/streams")
    assert status == 200
    names = {s["name"] for s in listing["streams"]}
    assert stream in names and system_stream_name(stream) not in names
    status, _ = await admin_async(
        server,
        "DELETE",
        f"/api/streams/{urllib.request.quote(system_stream_name(stream), safe='')}",
    )
    assert status == 403
    status, body = await admin_async(server, "GET", f"/api/streams/{stream}/delayed")
    assert status == 200 and body["scheduled"] == 0
    status, text = await admin_async(server, "GET", "/metrics")
    assert "tierlog_delayed_dispatched_total 200.0" in text
    assert "tierlog_delayed_lateness_seconds_count 200.0" in text


async def test_cancel_refusals_and_deletion(server: Server) -> None:
    stream = "later"
    codes: list[int] = []
    async with producer(server) as p:
        await p.create_stream(stream, arguments={"x-tierlog-delayed": "true"})
        due = int(time.time() * 1000) + 600_000

        async def on_confirm(status: ConfirmationStatus) -> None:
            codes.append(status.response_code)

        msgs = [
            AMQPMessage(body=b"a", application_properties={"x-deliver-at": due}),
            AMQPMessage(body=b"b", application_properties={"x-delay": "soon"}),  # refused
            AMQPMessage(body=b"c", application_properties={"x-deliver-at": due + 1}),
        ]
        await p.send_batch(stream, msgs, publisher_name="app", on_publish_confirm=on_confirm)
        for _ in range(100):
            if len(codes) == 3:
                break
            await asyncio.sleep(0.05)
    assert sorted(codes) == [0, 0, ResponseCode.PRECONDITION_FAILED]  # the bad property
    status, body = await admin_async(server, "GET", f"/api/streams/{stream}/delayed")
    assert status == 200 and body["scheduled"] == 2 and body["next_due_ms"] == due
    status, body = await admin_async(
        server,
        "POST",
        f"/api/streams/{stream}/delayed/cancel",
        {"reference": "app", "publishing_id": 1},
    )
    assert status == 200 and body["cancelled"] is True
    status, body = await admin_async(
        server,
        "POST",
        f"/api/streams/{stream}/delayed/cancel",
        {"reference": "app", "publishing_id": 1},
    )
    assert status == 404
    status, body = await admin_async(server, "GET", f"/api/streams/{stream}/delayed")
    assert body["scheduled"] == 1 and body["next_due_ms"] == due + 1
    # deleting the stream deletes its system stream and working set
    status, _ = await admin_async(server, "DELETE", f"/api/streams/{stream}")
    assert status == 200
    for _ in range(100):
        if (
            server.broker.get("/", system_stream_name(stream)) is None
            and not server.delayed.schedulers
        ):
            break
        await asyncio.sleep(0.05)
    assert server.broker.get("/", system_stream_name(stream)) is None
    assert not server.delayed.schedulers


async def test_bad_arguments_are_refused(server: Server) -> None:
    status, body = await admin_async(
        server, "POST", "/api/streams", {"name": "x", "arguments": {"x-tierlog-delayed": "maybe"}}
    )
    assert status == 400
    status, body = await admin_async(
        server,
        "POST",
        "/api/streams",
        {
            "name": "x",
            "arguments": {"x-tierlog-delayed": "true", "x-tierlog-delayed-horizon": "0s"},
        },
    )
    assert status == 400
    status, body = await admin_async(
        server, "POST", "/api/streams", {"name": system_stream_name("x")}
    )
    assert status == 403
    status, _ = await admin_async(server, "POST", "/api/streams", {"name": "plain"})
    assert status == 201
    status, body = await admin_async(server, "GET", "/api/streams/plain/delayed")
    assert status == 400
    status, body = await admin_async(
        server, "PATCH", "/api/streams/plain", {"arguments": {"x-tierlog-delayed": "true"}}
    )
    assert status == 400 and "fixed at creation" in body["error"]


async def test_scheduled_message_in_a_sub_batch_is_refused(server: Server) -> None:
    stream = "batched"
    codes: list[int] = []

    async def on_confirm(status: ConfirmationStatus) -> None:
        codes.append(status.response_code)

    async with producer(server) as p:
        await p.create_stream(stream, arguments={"x-tierlog-delayed": "true"})
        delayed = [AMQPMessage(body=b"d", application_properties={"x-delay": 10})] * 3
        plain = [AMQPMessage(body=f"p{i}".encode()) for i in range(3)]
        await p.send_sub_entry(
            stream,
            delayed,
            CompressionType.Gzip,
            publisher_name="app",
            on_publish_confirm=on_confirm,
        )
        await p.send_sub_entry(
            stream,
            plain,
            CompressionType.Gzip,
            publisher_name="app",
            on_publish_confirm=on_confirm,
        )
        for _ in range(100):
            if len(codes) >= 2:
                break
            await asyncio.sleep(0.05)
    assert sorted(codes) == [0, ResponseCode.PRECONDITION_FAILED]  # 0: confirmed
    value = server.metrics.value("tierlog_delayed_refused_total", reason="sub_batch")
    assert value == 1
    handle = server.broker.get("/", stream)
    assert handle is not None and handle.log.commit_point().next_offset == 3  # the plain ones


async def test_state_of_streams_deleted_while_down_is_removed(tmp_path: Path) -> None:
    leftover = tmp_path / "data" / "delayed" / "__gone_1700000000000000000"
    leftover.mkdir(parents=True)
    (leftover / "1.sqs").write_bytes(b"x")
    srv = Server(_config(tmp_path))
    await srv.start()
    try:
        await srv.streams_opened(10)
        for _ in range(100):
            if not leftover.exists():
                break
            await asyncio.sleep(0.05)
        assert not leftover.exists()
    finally:
        await srv.stop()


async def test_mixed_and_plain_frames_of_one_producer_keep_their_order(server: Server) -> None:
    """Immediate parts of mixed frames and plain frames reach the stream in frame order: a
    reordering would make the stream's deduplication drop confirmed messages."""
    stream = "interleaved"
    statuses: list[ConfirmationStatus] = []

    async def on_confirm(status: ConfirmationStatus) -> None:
        statuses.append(status)

    due = int(time.time() * 1000) + 300
    expected = 0
    async with producer(server) as p:
        await p.create_stream(stream, arguments={"x-tierlog-delayed": "true"})
        for k in range(40):
            if k % 2:
                batch = [AMQPMessage(body=f"p{k}-{i}".encode()) for i in range(5)]
            else:
                batch = [
                    AMQPMessage(
                        body=f"m{k}-{i}".encode(), application_properties={"x-deliver-at": due}
                    )
                    if i % 2
                    else AMQPMessage(body=f"m{k}-{i}".encode())
                    for i in range(5)
                ]
            expected += len(batch)
            await p.send_batch(stream, batch, publisher_name="app", on_publish_confirm=on_confirm)
        for _ in range(200):
            if len(statuses) >= expected:
                break
            await asyncio.sleep(0.05)
    assert len(statuses) == expected and all(s.is_confirmed for s in statuses)
    got = await collect(server, stream, expected, timeout=10)
    assert len(got) == expected
    assert len({b for _o, _t, b, _p in got}) == expected
