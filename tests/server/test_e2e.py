"""End-to-end tests of the stream server with the real ``rstream`` client."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest
from rstream import (
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
)
from rstream import (
    exceptions as rx,
)
from rstream.consumer import Consumer, MessageContext
from rstream.producer import ConfirmationStatus
from rstream.utils import RawMessage

from tests.plugins.tierlog_server import TierlogServerProcess, tierlog_server  # noqa: F401

HOST = "127.0.0.1"


def producer(server: TierlogServerProcess, password: str = "guest") -> Producer:
    return Producer(HOST, port=server.stream_port, username="guest", password=password)


def consumer(server: TierlogServerProcess) -> Consumer:
    return Consumer(HOST, port=server.stream_port, username="guest", password="guest")


async def publish(
    server: TierlogServerProcess,
    stream: str,
    batches: list[list[Any]],
    name: str | None = None,
    pause: float = 0.0,
) -> list[ConfirmationStatus]:
    """Send batches (waiting for every confirm); returns the confirmation statuses."""
    statuses: list[ConfirmationStatus] = []
    expected = sum(len(b) for b in batches)
    done = asyncio.Event()

    async def on_confirm(status: ConfirmationStatus) -> None:
        statuses.append(status)
        if len(statuses) >= expected:
            done.set()

    async with producer(server) as p:
        for batch in batches:
            await p.send_batch(stream, batch, publisher_name=name, on_publish_confirm=on_confirm)
            if pause:
                await asyncio.sleep(pause)
        await asyncio.wait_for(done.wait(), 20)
    return statuses


async def consume(
    server: TierlogServerProcess,
    stream: str,
    spec: ConsumerOffsetSpecification,
    count: int,
    during: Any = None,
    timeout: float = 20.0,
) -> list[tuple[int, bytes]]:
    """Subscribe at ``spec`` and collect ``count`` (offset, body) pairs."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))
        if len(got) >= count:
            done.set()

    c = consumer(server)
    await c.start()
    try:
        await c.subscribe(stream, on_message, offset_specification=spec)
        if during is not None:
            await during()
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        await c.close()
    return got


def admin(server: TierlogServerProcess, path: str) -> Any:
    request = urllib.request.Request(
        server.admin_url + path, headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


async def test_publish_with_confirms_and_every_offset_spec(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    async with producer(server) as p:
        await p.create_stream("orders")
    before = int(time.time() * 1000)
    batches = [[b"m%d" % (k * 100 + i) for i in range(100)] for k in range(3)]
    statuses = await publish(server, "orders", batches, pause=0.05)
    assert len(statuses) == 300
    assert all(s.is_confirmed for s in statuses)
    assert sorted(s.message_id for s in statuses) == list(range(1, 301))

    first = await consume(server, "orders", ConsumerOffsetSpecification(OffsetType.FIRST), 300)
    assert [o for o, _ in first] == list(range(300))
    assert [b for _, b in first] == [b"m%d" % i for i in range(300)]

    at = await consume(server, "orders", ConsumerOffsetSpecification(OffsetType.OFFSET, 150), 150)
    assert [o for o, _ in at] == list(range(150, 300))

    last = await consume(server, "orders", ConsumerOffsetSpecification(OffsetType.LAST), 100)
    assert [o for o, _ in last] == list(range(200, 300))  # the last chunk

    status = admin(server, "/api/streams/orders")
    assert status["local"]["next_offset"] == 300

    # timestamp: a time before everything → from the start; after the 1st batch → not offset 0
    ts_all = await consume(
        server, "orders", ConsumerOffsetSpecification(OffsetType.TIMESTAMP, before - 1000), 300
    )
    assert ts_all[0][0] == 0

    async def publish_more() -> None:
        await publish(server, "orders", [[b"new%d" % i for i in range(10)]])

    nxt = await consume(
        server, "orders", ConsumerOffsetSpecification(OffsetType.NEXT), 10, during=publish_more
    )
    assert nxt == [(300 + i, b"new%d" % i) for i in range(10)]


async def test_timestamp_spec_skips_older_chunks(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    async with producer(server) as p:
        await p.create_stream("ts")
    await publish(server, "ts", [[b"old"] * 10])
    await asyncio.sleep(0.05)
    cut = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await publish(server, "ts", [[b"new"] * 10])
    got = await consume(server, "ts", ConsumerOffsetSpecification(OffsetType.TIMESTAMP, cut), 10)
    assert got == [(10 + i, b"new") for i in range(10)]


async def test_dedup_across_producer_reconnect(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    async with producer(server) as p:
        await p.create_stream("dedup")
    first = [RawMessage(b"a%d" % i, publishing_id=i) for i in range(1, 11)]
    statuses = await publish(server, "dedup", [first], name="app-1")
    assert all(s.is_confirmed for s in statuses)
    # a new connection with the same producer name: the server knows id 10 already
    async with producer(server) as p:
        client = await p.default_client
        assert await client.query_publisher_sequence("dedup", "app-1") == 10
        assert await client.query_publisher_sequence("dedup", "nobody") == 0
    again = [RawMessage(b"a%d" % i, publishing_id=i) for i in range(5, 16)]
    statuses = await publish(server, "dedup", [again], name="app-1")
    assert len(statuses) == 11 and all(s.is_confirmed for s in statuses)  # duplicates confirmed
    got = await consume(server, "dedup", ConsumerOffsetSpecification(OffsetType.FIRST), 15)
    await asyncio.sleep(0.2)
    assert [b for _, b in got] == [b"a%d" % i for i in range(1, 16)]
    metrics = urllib.request.urlopen(server.admin_url + "/metrics", timeout=10).read().decode()
    assert "tierlog_duplicate_messages_total 6.0" in metrics


async def test_store_and_query_offsets_survive_restart(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    c = consumer(server)
    await c.start()
    await c.create_stream("offsets")
    with pytest.raises(rx.OffsetNotFound):
        await c.query_offset("offsets", "reader-1")
    await c.store_offset("offsets", "reader-1", 42)
    assert await c.query_offset("offsets", "reader-1") == 42
    await c.store_offset("offsets", "reader-1", 43)
    assert await c.query_offset("offsets", "reader-1") == 43
    with pytest.raises(rx.StreamDoesNotExist):
        await c.query_offset("missing", "reader-1")
    await c.close()
    server.restart()
    c = consumer(server)
    await c.start()
    assert await c.query_offset("offsets", "reader-1") == 43
    await c.close()


async def test_server_restart_mid_way_resumes(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    async with producer(server) as p:
        await p.create_stream("resume")
    await publish(server, "resume", [[b"x%d" % i for i in range(200)]], name="w")
    server.restart()  # SIGTERM: clean shutdown
    await publish(server, "resume", [[b"x%d" % i for i in range(200, 300)]], name="w")
    server.kill()  # a crash: everything confirmed was fsynced first
    server.start()
    await publish(server, "resume", [[b"x%d" % i for i in range(300, 400)]], name="w")
    got = await consume(server, "resume", ConsumerOffsetSpecification(OffsetType.FIRST), 400)
    assert got == [(i, b"x%d" % i) for i in range(400)]
    async with producer(server) as p:
        client = await p.default_client
        assert await client.query_publisher_sequence("resume", "w") == 400


async def test_create_and_delete_stream_with_arguments(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    arguments = {
        "max-length-bytes": 10_000_000,
        "max-age": "2h",
        "stream-max-segment-size-bytes": 100_000,
        "x-tierlog-local-max-bytes": 5_000_000,
        "x-tierlog-fragment-bytes": 2 * 1024 * 1024,
        "initial-cluster-size": 3,  # RabbitMQ's, ignored
    }
    async with producer(server) as p:
        await p.create_stream("args", arguments=arguments)
        with pytest.raises(rx.StreamAlreadyExists):
            await p.create_stream("args")
        with pytest.raises(rx.PreconditionFailed):
            await p.create_stream("bad", arguments={"x-tierlog-no-such-thing": 1})
        with pytest.raises(rx.PreconditionFailed):
            await p.create_stream("bad", arguments={"max-age": "soon"})
        assert not await p.stream_exists("bad")
    settings = admin(server, "/api/streams/args")["settings"]
    assert settings["max_bytes"] == 10_000_000
    assert settings["max_age_seconds"] == 7200
    assert settings["max_segment_bytes"] == 100_000
    assert settings["local_max_bytes"] == 5_000_000
    assert settings["fragment_bytes"] == 2 * 1024 * 1024

    # small segments: publishing rolls several of them
    await publish(server, "args", [[b"y" * 1000] * 100 for _ in range(8)], pause=0.05)
    assert admin(server, "/api/streams/args")["local"]["segments"] >= 3
    async with producer(server) as p:
        await p.delete_stream("args")
        assert not await p.stream_exists("args")
        with pytest.raises(rx.StreamDoesNotExist):
            await p.delete_stream("args")
        await p.create_stream("args")  # a new incarnation starts empty
    assert admin(server, "/api/streams/args")["local"]["next_offset"] == 0


async def test_bad_credentials_rejected(
    tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = tierlog_server
    with pytest.raises((rx.AuthenticationFailure, ConnectionError, asyncio.TimeoutError)):
        async with producer(server, password="wrong") as p:
            await p.create_stream("never")
    text = urllib.request.urlopen(server.admin_url + "/metrics", timeout=10).read().decode()
    assert "tierlog_auth_failures_total 1.0" in text
