"""The server tiers what it stores: data reaches the object store, local segments are
freed once durable, status and metrics show it, a clean stop makes the final commit,
and deleting a stream removes its remote objects."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from tests.plugins.seaweed import SeaweedServer
from tests.server.test_inprocess import AsyncRawClient
from tests.support.streams import TIERED_AWAY
from tests.support.waiting import until as wait_for
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection, TierSection
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.object_store import open_object_store


def config(tmp_path: Path) -> ServerConfig:
    return replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
        tier=replace(
            TierSection(),
            delete_grace_seconds=0.0,
            retention_interval_seconds=0.1,
            local_retention_interval_seconds=0.1,
        ),
    )


STREAM_ARGS = dict(TIERED_AWAY)


async def publish(client: AsyncRawClient, name: str, frames: int) -> None:
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", name))
    for k in range(frames):
        client.send(
            encode_publish(1, [(k * 20 + i + 1, bytes([k % 256]) * 1000) for i in range(20)])
        )
        await client.expect(PublishConfirm)


async def status(server: Server, name: str) -> dict:
    async with aiohttp.ClientSession(headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}) as http:
        url = f"http://127.0.0.1:{server.admin_port}/api/streams/{name}"
        async with http.get(url) as response:
            assert response.status == 200
            return await response.json()


async def test_server_tiers_frees_local_and_restarts(tmp_path: Path) -> None:
    server = Server(config(tmp_path))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        response = await client.request(c.CreateRequest(client.next_corr(), "orders", STREAM_ARGS))
        assert response.response_code == ResponseCode.OK
        await publish(client, "orders", 30)  # ~600 KB: several 64 KiB segments

        async def tiered() -> bool:
            s = await status(server, "orders")
            return s["remote"]["tiered_offset"] == s["local"]["next_offset"]

        await wait_for(tiered)

        async def freed() -> bool:
            s = await status(server, "orders")
            return s["local"]["segments"] == 1 and s["local"]["first_offset"] > 0

        await wait_for(freed)  # local retention freed everything durable
        s = await status(server, "orders")
        assert s["remote"]["tiering"] == "running"
        assert s["remote"]["fragments"] >= 1 and s["remote"]["bytes"] > 500_000
        async with aiohttp.ClientSession(
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
        ) as http:
            url = f"http://127.0.0.1:{server.admin_port}/metrics"
            async with http.get(url) as response:
                metrics = await response.text()
        assert 'tierlog_object_store_requests_total{op="put_if_absent",outcome="ok"}' in metrics
        assert "tierlog_manifest_commits_total" in metrics
        assert "tierlog_prefetch_memory_bytes" in metrics
        assert "tierlog_tier_lag_bytes" in metrics
        client.close()
        next_offset = s["local"]["next_offset"]
    finally:
        await server.stop()

    # Restart: the manifest resumes where it was; a last publish is tiered on stop.
    server = Server(config(tmp_path))
    await server.start()
    try:
        await server.streams_opened()  # streams open in the background after a restart
        s = await status(server, "orders")
        assert s["remote"]["tiered_offset"] == next_offset
        client = await AsyncRawClient.connect(server.stream_port)
        await publish(client, "orders", 1)
        client.close()
    finally:
        await server.stop()  # clean shutdown: flush + final manifest commit
    server = Server(config(tmp_path))
    await server.start()
    try:
        await server.streams_opened()
        s = await status(server, "orders")
        assert s["remote"]["tiered_offset"] == s["local"]["next_offset"] > next_offset
    finally:
        await server.stop()


async def test_deleting_a_stream_removes_its_remote_objects(tmp_path: Path) -> None:
    server = Server(config(tmp_path))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.CreateRequest(client.next_corr(), "gone", STREAM_ARGS))
        await publish(client, "gone", 5)
        s0 = await status(server, "gone")
        incarnation = s0["incarnation"]
        store = FsObjectStore(tmp_path / "data" / "objects")

        async def tiered() -> bool:
            s = await status(server, "gone")
            return s["remote"]["tiered_offset"] == s["local"]["next_offset"]

        await wait_for(tiered)
        assert list(store.list(f"stream/{incarnation}/"))
        response = await client.request(c.DeleteRequest(client.next_corr(), "gone"))
        assert response.response_code == ResponseCode.OK

        async def cleaned() -> bool:
            return not list(store.list(f"stream/{incarnation}/"))

        await wait_for(cleaned)
        client.close()
    finally:
        await server.stop()


@pytest.mark.s3
@pytest.mark.etcd
async def test_server_on_s3_and_etcd_by_config(
    tmp_path: Path, seaweed: SeaweedServer, etcd_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    prefix = f"srv-{uuid.uuid4().hex}"
    base = config(tmp_path)
    cfg = replace(
        base,
        storage=replace(
            base.storage,
            object_store=f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}"
            f"&region={seaweed.region}",
            meta_store=f"etcd://{etcd_server}/{prefix}",
        ),
    )
    server = Server(cfg)
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.CreateRequest(client.next_corr(), "s3orders", STREAM_ARGS))
        await publish(client, "s3orders", 10)

        async def tiered() -> bool:
            s = await status(server, "s3orders")
            return s["remote"]["tiered_offset"] == s["local"]["next_offset"]

        await wait_for(tiered)
        s = await status(server, "s3orders")
        client.close()
    finally:
        await server.stop()
    store = open_object_store(cfg.storage.object_store)
    try:
        keys = [m.key for m in store.list(f"stream/{s['incarnation']}/data/")]
        assert keys and all(k.endswith(".fragment") for k in keys)
    finally:
        store.close()


async def rstream_consume(
    port: int, stream: str, spec: object, count: int
) -> list[tuple[int, bytes]]:
    from rstream.consumer import Consumer, MessageContext

    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: object, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))  # type: ignore[call-overload]
        if len(got) >= count:
            done.set()

    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(stream, on_message, offset_specification=spec)  # type: ignore[arg-type]
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await consumer.close()
    return got


async def test_rstream_consumes_from_first_after_local_segments_were_freed(
    tmp_path: Path,
) -> None:
    from rstream import ConsumerOffsetSpecification, OffsetType

    server = Server(config(tmp_path))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.CreateRequest(client.next_corr(), "cold", STREAM_ARGS))
        await publish(client, "cold", 30)
        client.close()

        async def freed() -> bool:
            s = await status(server, "cold")
            return (
                s["remote"]["tiered_offset"] == s["local"]["next_offset"]
                and s["local"]["segments"] == 1
                and s["local"]["first_offset"] > 0
            )

        await wait_for(freed)
        s = await status(server, "cold")
        local_first = s["local"]["first_offset"]
        total = 30 * 20
        got = await rstream_consume(
            server.stream_port, "cold", ConsumerOffsetSpecification(OffsetType.FIRST), total
        )
        assert len(got) == total
        assert [body for _, body in got] == [
            bytes([k % 256]) * 1000 for k in range(30) for _ in range(20)
        ]
        assert got[0][0] == 0 < local_first  # the oldest records came from the remote tier
        offsets = [o for o, _ in got]
        assert offsets == sorted(offsets) and len(set(offsets)) == total
        # An absolute offset in the freed range attaches in the remote tier too.
        mid = offsets[total // 3]
        at = await rstream_consume(
            server.stream_port, "cold", ConsumerOffsetSpecification(OffsetType.OFFSET, mid), 10
        )
        assert at[0][0] == mid and at[:10] == got[total // 3 : total // 3 + 10]
    finally:
        await server.stop()


async def test_tiering_start_failure_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tierlog.server.app as app_module
    from tests.faults.object_store import FaultyObjectStore

    stores: list[FaultyObjectStore] = []

    def faulty_open(uri: str, policy: object, deadline_s: float) -> FaultyObjectStore:
        store = FaultyObjectStore(open_object_store(uri))
        stores.append(store)
        return store

    monkeypatch.setattr(app_module, "open_object_store_for_startup", faulty_open)
    server = Server(config(tmp_path))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.CreateRequest(client.next_corr(), "flaky", STREAM_ARGS))
        await publish(client, "flaky", 3)
        client.close()
    finally:
        await server.stop()
    # Restart while the object store fails the resolution's first read.
    server = Server(config(tmp_path))
    stores.clear()
    await server.start()
    try:
        await server.streams_opened()
        assert stores
        stores[0].fail_nth("get_suffix", 1)
        # (the failure is armed after start: force a fresh start attempt through a reopen)
        assert server.tiering is not None and server.broker is not None
        handle = server.broker.get("/", "flaky")
        assert handle is not None
        await server.tiering.closing(handle, flush=False)
        await server.tiering.opened(handle)
        assert server.tiering.tierer_of(handle.record) is None  # the first attempt failed
        s = await status(server, "flaky")
        assert s["remote"]["tiering"] == "off"

        async def running() -> bool:
            s = await status(server, "flaky")
            return s["remote"]["tiering"] == "running"

        await wait_for(running)  # the housekeeping loop retried and succeeded
    finally:
        await server.stop()


async def test_disk_floor_throttles_publishers_and_raises_the_alarm(tmp_path: Path) -> None:
    """Free disk under ``tier.min_free_disk_bytes``: the tierer's back-pressure rule
    (the same one its append gate uses) makes the server throttle publishers (never
    fail them) and set the back-pressure alarm metric."""
    cfg = config(tmp_path)
    cfg = replace(cfg, tier=replace(cfg.tier, min_free_disk_bytes=1 << 62))  # never enough
    server = Server(cfg)
    await server.start()
    try:
        assert server.broker is not None and server.tiering is not None
        client = await AsyncRawClient.connect(server.stream_port)
        response = await client.request(c.CreateRequest(client.next_corr(), "full", STREAM_ARGS))
        assert response.response_code == ResponseCode.OK
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "full"))
        handle = server.broker.get("/", "full")
        assert handle is not None
        server.broker.refresh_lag(handle)
        assert handle.congested
        tierer = server.tiering.tierer_of(handle.record)
        assert tierer is not None and tierer.backpressure_active
        client.send(encode_publish(1, [(1, b"a")]))
        await client.expect(PublishConfirm)  # accepted (never failed), then throttled
        assert handle.blocked
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.admin_port}/metrics"
            async with http.get(url) as response:
                metrics = await response.text()
        alarm = [
            line for line in metrics.splitlines() if line.startswith("tierlog_tier_backpressure")
        ]
        assert alarm and float(alarm[0].split()[-1]) == 1.0, alarm
        client.close()
    finally:
        await server.stop()
