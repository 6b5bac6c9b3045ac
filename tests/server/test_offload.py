"""Segment-mode streams end to end: a real server (in process, and as a subprocess killed
mid-offload), the rstream client, the filesystem store and SeaweedFS. Size and age triggers,
the admin offload-before call with its status, consuming everything from ``first`` after the
local copies went, retention and stream deletion leaving no object behind, the mode fixed at
creation, and a fragment-mode stream beside a segment-mode one."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import publish, rstream_consume
from tests.support.waiting import until
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection, TierSection
from tierlog.storage.object_store import ObjectStore, open_object_store
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

AUTH = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"}
FRAMES = 30  # publish frames of 20 messages of 1000 bytes
TOTAL = FRAMES * 20
SEGMENTS = {
    "x-tierlog-tier-mode": "segments",
    "stream-max-segment-size-bytes": "65536",
    "x-tierlog-offload-deletion-lag": "0",
}
SEGMENTS_SIZE = {"stream-max-segment-size-bytes": "65536"}


def expected_bodies(frames: int = FRAMES) -> list[bytes]:
    return [bytes([k % 256]) * 1000 for k in range(frames) for _ in range(20)]


def make_config(tmp_path: Path, object_store: str = "") -> ServerConfig:
    storage = StorageSection(data_dir=str(tmp_path / "data"))
    if object_store:
        storage = replace(storage, object_store=object_store)
    return replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=storage,
        tier=replace(
            TierSection(),
            delete_grace_seconds=0.0,
            retention_interval_seconds=0.1,
            local_retention_interval_seconds=0.1,
        ),
    )


class Running:
    def __init__(self, server: Server, store: ObjectStore) -> None:
        self.server = server
        self.store = store
        self.base = f"http://127.0.0.1:{server.admin_port}/api/streams"

    async def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(headers=AUTH) as http,
            http.request(method, self.base + path, json=body) as response,
        ):
            return response.status, await response.json()

    async def status(self, name: str) -> dict[str, Any]:
        code, body = await self.http("GET", f"/{name}")
        assert code == 200, body
        return body  # type: ignore[no-any-return]

    async def create(self, name: str, arguments: dict[str, str]) -> int:
        client = await AsyncRawClient.connect(self.server.stream_port)
        try:
            response = await client.request(c.CreateRequest(client.next_corr(), name, arguments))
            return int(response.response_code)
        finally:
            client.close()

    async def publish(self, name: str, frames: int = FRAMES) -> None:
        client = await AsyncRawClient.connect(self.server.stream_port)
        try:
            await publish(client, name, frames)
        finally:
            client.close()

    def keys(self, incarnation: str) -> list[str]:
        return [m.key for m in self.store.list(f"stream/{incarnation}/")]


@pytest.fixture(params=["fs", pytest.param("s3", marks=pytest.mark.s3)])
async def running(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Running]:
    url = ""
    if request.param == "s3":
        seaweed: SeaweedServer = request.getfixturevalue("seaweed")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
        url = (
            f"s3://{seaweed.bucket}/srv-{uuid.uuid4().hex}?endpoint={seaweed.endpoint}"
            f"&region={seaweed.region}"
        )
    config = make_config(tmp_path, url)
    server = Server(config)
    await server.start()
    store = open_object_store(url or f"file://{tmp_path / 'data' / 'objects'}")
    try:
        yield Running(server, store)
    finally:
        await server.stop()
        store.close()


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0) -> None:
    await until(predicate, timeout)


async def consume_all_from_first(port: int, name: str) -> None:
    from rstream import ConsumerOffsetSpecification, OffsetType

    got = await rstream_consume(port, name, ConsumerOffsetSpecification(OffsetType.FIRST), TOTAL)
    assert [body for _, body in got] == expected_bodies()
    assert [o for o, _ in got] == sorted({o for o, _ in got})  # in order, exactly once


async def test_size_trigger_then_consume_from_first_beside_a_fragment_stream(
    running: Running,
) -> None:
    args = {**SEGMENTS, "x-tierlog-offload-threshold-bytes": "100000"}
    assert await running.create("seg", args) == ResponseCode.OK
    fragments = {"x-tierlog-max-fragment-age": "1s", "x-tierlog-local-max-bytes": "1"}
    assert await running.create("frag", {**fragments, **SEGMENTS_SIZE}) == ResponseCode.OK
    await running.publish("seg")
    await running.publish("frag")

    # offloaded (and freed, lag 0) down to the threshold: what stays local is at most the
    # threshold plus one segment (the oldest kept one) and the active segment
    bound = 100_000 + 2 * (65_536 + 4096)

    async def offloaded() -> bool:
        s = await running.status("seg")
        first = s["local"]["first_offset"]
        return bool(first > 0 and s["remote"]["tiered_offset"] == first) and (
            s["local"]["bytes"] <= bound
        )

    await wait_for(offloaded)
    s = await running.status("seg")
    assert s["remote"]["tiering"] == "segments"
    keys = running.keys(s["incarnation"])
    segment_keys = [k for k in keys if "/segments/" in k]
    assert segment_keys and not [k for k in keys if "/data/" in k]
    assert {k.rsplit(".", 1)[1] for k in segment_keys} == {"data", "index"}
    await consume_all_from_first(running.server.stream_port, "seg")
    # the fragment-mode stream on the same server tiers fragments as before
    f = await running.status("frag")

    async def tiered() -> bool:
        f = await running.status("frag")
        return bool(f["remote"]["tiered_offset"] == f["local"]["next_offset"])

    await wait_for(tiered)
    f = await running.status("frag")
    assert [k for k in running.keys(f["incarnation"]) if "/data/" in k]
    assert not [k for k in running.keys(f["incarnation"]) if "/segments/" in k]
    await consume_all_from_first(running.server.stream_port, "frag")


async def test_age_trigger_offloads_sealed_segments(running: Running) -> None:
    args = {**SEGMENTS, "x-tierlog-offload-threshold-age": "1s"}
    assert await running.create("aged", args) == ResponseCode.OK
    await running.publish("aged")

    async def all_sealed_offloaded() -> bool:
        s = await running.status("aged")
        return bool(s["local"]["segments"] == 1 and s["local"]["first_offset"] > 0)

    await wait_for(all_sealed_offloaded)
    s = await running.status("aged")
    assert s["remote"]["tiered_offset"] == s["local"]["first_offset"]
    await consume_all_from_first(running.server.stream_port, "aged")


async def test_admin_offload_before_with_status(running: Running) -> None:
    assert await running.create("ops", SEGMENTS) == ResponseCode.OK
    await running.publish("ops")
    code, body = await running.http("GET", "/ops/offload")
    assert code == 200 and body["status"] == "not run"
    assert body["first_unoffloaded_offset"] == 0
    for bad in ({"before": -1}, {"before": "12"}, {}):
        code, body = await running.http("PUT", "/ops/offload", bad)
        assert code == 400, body
    code, body = await running.http("PUT", "/ops/offload", {"before": TOTAL // 2})
    assert code == 202 and body["status"] in ("running", "success")

    async def done() -> bool:
        _, body = await running.http("GET", "/ops/offload")
        return bool(body["status"] == "success")

    await wait_for(done)
    _, body = await running.http("GET", "/ops/offload")
    first = body["first_unoffloaded_offset"]
    assert 0 < first <= TOTAL // 2 and body["error"] is None
    s = await running.status("ops")
    assert s["remote"]["tiered_offset"] == first

    async def freed() -> bool:  # lag 0: the local copies go at the next housekeeping pass
        s = await running.status("ops")
        return bool(s["local"]["first_offset"] == first)

    await wait_for(freed)
    await consume_all_from_first(running.server.stream_port, "ops")
    # a fragment-mode stream has no offload; the mode and the rule are enforced
    assert await running.create("plain", SEGMENTS_SIZE) == ResponseCode.OK
    code, body = await running.http("PUT", "/plain/offload", {"before": 10})
    assert code == 400 and "segments" in body["error"]
    code, body = await running.http(
        "PATCH", "/ops", {"arguments": {"x-tierlog-tier-mode": "fragments"}}
    )
    assert code == 400 and "fixed at creation" in body["error"]
    code, body = await running.http(
        "PATCH", "/plain", {"arguments": {"x-tierlog-tier-mode": "segments"}}
    )
    assert code == 400 and "fixed at creation" in body["error"]
    code, body = await running.http(
        "POST",
        "",
        {
            "name": "bad",
            "arguments": {
                **SEGMENTS,
                "max-length-bytes": "100000",
                "x-tierlog-offload-threshold-bytes": "100000",
            },
        },
    )
    assert code == 400 and "lower than the retention limit" in body["error"]
    # 409 while a requested offload runs: hold the service's loop so the request stays open
    tiering = running.server.tiering
    assert tiering is not None
    service = next(iter(tiering.offloads.values()))
    service.stop()
    code, body = await running.http("PUT", "/ops/offload", {"before": TOTAL})
    assert code == 202 and body["status"] == "running"
    code, body = await running.http("PUT", "/ops/offload", {"before": TOTAL})
    assert code == 409 and "running" in body["error"]
    code, body = await running.http("GET", "/ops/offload")
    assert code == 200 and body["status"] == "running" and body["before"] == TOTAL


async def test_retention_and_stream_deletion_leave_no_objects(running: Running) -> None:
    args = {
        **SEGMENTS,
        "x-tierlog-offload-threshold-bytes": "0",
        "max-length-bytes": "300000",
    }
    assert await running.create("short", args) == ResponseCode.OK
    await running.publish("short")

    async def trimmed() -> bool:  # a pass offloads, then trims: read between two passes
        s = await running.status("short")
        first = s["remote"]["first_offset"]
        return bool(first and first > 0 and s["remote"]["bytes"] <= 300_000)

    await wait_for(trimmed)
    s = await running.status("short")
    incarnation = s["incarnation"]
    assert s["remote"]["bytes"] <= 300_000

    async def trimmed_objects_gone() -> bool:
        s = await running.status("short")
        firsts = {
            int(k.rsplit("/", 1)[1].split(".")[0])
            for k in running.keys(incarnation)
            if "/segments/" in k
        }
        return bool(firsts) and min(firsts) >= s["remote"]["first_offset"]

    await wait_for(trimmed_objects_gone)
    code, _ = await running.http("DELETE", "/short")
    assert code == 200

    async def cleaned() -> bool:
        return not running.keys(incarnation)

    await wait_for(cleaned)
    assert not list(running.store.list_multipart_uploads(f"stream/{incarnation}/"))


def test_server_killed_mid_offload_recovers(tmp_path: Path) -> None:
    """SIGKILL while segments are being offloaded (at whatever step), then a restart:
    recovery settles the attempt, the stream is complete from ``first``, nothing strays."""
    server = TierlogServerProcess(
        tmp_path / "data",
        config_text="[tier]\ndelete_grace_seconds = 0.0\nretention_interval_seconds = 0.1\n"
        "local_retention_interval_seconds = 0.1\n",
    )
    server.start()
    try:
        asyncio.run(_kill_mid_offload(server))
    finally:
        server.stop()


async def _kill_mid_offload(server: TierlogServerProcess) -> None:
    from rstream import ConsumerOffsetSpecification, OffsetType

    big = {
        "x-tierlog-tier-mode": "segments",
        "stream-max-segment-size-bytes": str(6 << 20),
        "x-tierlog-offload-block-size": str(5 << 20),
        "x-tierlog-offload-deletion-lag": "0",
    }
    client = await AsyncRawClient.connect(server.stream_port)
    await client.request(c.CreateRequest(client.next_corr(), "crash", big))
    frames = 1200  # ~24 MB: four sealed segments of ~6 MB, two blocks each
    await publish(client, "crash", frames)
    client.close()
    url = f"{server.admin_url}/api/streams/crash"
    async with (
        aiohttp.ClientSession(headers=AUTH) as http,
        http.put(url + "/offload", json={"before": frames * 20}) as response,
    ):
        assert response.status == 202
    # kill while an attempt is in flight (recorded in the MetaStore, not yet finished)
    meta = SqliteMetaStore(str(server.data_dir / "meta.db"))
    try:
        deadline = time.monotonic() + 20
        while not meta.list("offload-attempts/") and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        assert meta.list("offload-attempts/"), "no offload attempt seen in flight"
        server.kill()
    finally:
        meta.close()
    server.restart()
    url = f"{server.admin_url}/api/streams/crash"  # new ports
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.put(url + "/offload", json={"before": frames * 20}) as response:
            assert response.status == 202

        async def done() -> bool:
            async with http.get(url + "/offload") as response:
                body = await response.json()
            return bool(body["status"] == "success")

        await wait_for(done, 60)

        assert "offload_recovered" in server.log_tail(200_000)

        async def freed() -> bool:
            async with http.get(url) as response:
                status = await response.json()
            first = status["local"]["first_offset"]
            return bool(first == status["remote"]["tiered_offset"] > 0)

        await wait_for(freed)
        async with http.get(url) as response:
            incarnation = (await response.json())["incarnation"]
    store = open_object_store(f"file://{server.data_dir / 'objects'}")
    try:
        keys = sorted(m.key for m in store.list(f"stream/{incarnation}/segments/"))
        # every object belongs to a committed segment: pairs of data + index, no strays
        stems = [k.rsplit(".", 1)[0] for k in keys]
        assert len(keys) == 2 * len(set(stems)) and len(set(stems)) >= 3
        assert not list(store.list_multipart_uploads(f"stream/{incarnation}/"))
    finally:
        store.close()
    got = await rstream_consume(
        server.stream_port,
        "crash",
        ConsumerOffsetSpecification(OffsetType.FIRST),
        frames * 20,
    )
    assert [body for _, body in got] == expected_bodies(frames)
