"""The server in the test's own event loop: admin API, metrics, overtaken consumers,
back-pressure and the sendfile delivery path (the stdlib loop supports sendfile)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tierlog.formats.chunk import decode_header
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.remote.catalog import StreamRecord
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection


class AsyncRawClient:
    """A minimal asyncio stream-protocol client built on the codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.splitter = FrameSplitter()
        self.pending: list[Any] = []
        self.corr = 0

    @classmethod
    async def connect(cls, port: int) -> AsyncRawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        await client.handshake()
        return client

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    async def frame(self, timeout: float = 10.0) -> Any:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
            if not data:
                raise ConnectionError("closed")
            self.pending += [c.decode_server_frame(f) for f in self.splitter.feed(data)]
        return self.pending.pop(0)

    async def expect(self, kind: type, timeout: float = 10.0) -> Any:
        while True:
            frame = await self.frame(timeout)
            if isinstance(frame, kind):
                return frame

    async def handshake(self) -> None:
        self.send(c.PeerPropertiesRequest(self.next_corr(), {}).encode())
        await self.expect(c.PeerPropertiesResponse)
        data = c.plain_data("guest", "guest")
        self.send(c.SaslAuthenticateRequest(self.next_corr(), "PLAIN", data).encode())
        await self.expect(c.SaslAuthenticateResponse)
        tune = await self.expect(c.Tune)
        self.send(c.Tune(tune.frame_max, 0).encode())
        self.send(c.OpenRequest(self.next_corr(), "/").encode())
        await self.expect(c.OpenResponse)

    async def request(self, command: Any, kind: type = c.SimpleResponse) -> Any:
        self.send(command.encode())
        return await self.expect(kind)

    def close(self) -> None:
        self.writer.close()


class FixedLag:
    def __init__(self) -> None:
        self.lag = 0

    def __call__(self, record: StreamRecord) -> int:
        return self.lag


def _config(tmp_path: Path) -> ServerConfig:
    base = ServerConfig()
    return replace(
        base,
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
    )


@pytest.fixture
async def lag() -> FixedLag:
    return FixedLag()


@pytest.fixture
async def server(tmp_path: Path, lag: FixedLag) -> AsyncIterator[Server]:
    srv = Server(_config(tmp_path), lag_provider=lag)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def test_admin_api_and_metrics(server: Server) -> None:
    base = f"http://127.0.0.1:{server.admin_port}"
    async with aiohttp.ClientSession(headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}) as http:
        async with http.get(base + "/api/health") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        body = {"name": "adm", "arguments": {"max-age": "1D"}, "settings": {"max_bytes": 10**9}}
        async with http.post(base + "/api/streams", json=body) as r:
            assert r.status == 201
            created = await r.json()
            assert created["settings"]["max_age_seconds"] == 86400
            assert created["settings"]["max_bytes"] == 10**9
            assert set(created["remote"]) >= {"bytes", "fragments", "tiered_offset"}
        async with http.post(base + "/api/streams", json=body) as r:
            assert r.status == 409
        bad = {"name": "x", "settings": {"nope": 1}}
        async with http.post(base + "/api/streams", json=bad) as r:
            assert r.status == 400
        json_type = {"Content-Type": "application/json"}
        async with http.post(base + "/api/streams", data=b"{not json", headers=json_type) as r:
            assert r.status == 400
        patch = {
            "arguments": {"max-length-bytes": "5000000"},
            "settings": {"local_max_bytes": 10**6},
        }
        async with http.patch(base + "/api/streams/adm", json=patch) as r:
            assert r.status == 200
            settings = (await r.json())["settings"]
            assert settings["max_bytes"] == 5_000_000 and settings["local_max_bytes"] == 10**6
        bad_mode = {"settings": {"tier_mode": "x"}}
        async with http.patch(base + "/api/streams/adm", json=bad_mode) as r:
            assert r.status == 400
        async with http.get(base + "/api/streams/missing") as r:
            assert r.status == 404

        client = await AsyncRawClient.connect(server.stream_port)
        assert (await client.request(c.DeclarePublisherRequest(1, 3, "", "adm"))).response_code == 1
        client.send(encode_publish(3, [(i, b"payload") for i in range(1, 51)]))
        confirm = await client.expect(PublishConfirm)
        assert list(confirm.publishing_ids) == list(range(1, 51))
        async with http.get(base + "/api/streams") as r:
            streams = (await r.json())["streams"]
            assert [s["name"] for s in streams] == ["adm"]
            assert streams[0]["local"]["next_offset"] == 50
            assert streams[0]["local"]["bytes"] > 50 * 7
        async with http.get(base + "/metrics") as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            text = await r.text()
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        assert samples[("tierlog_stream_next_offset", (("stream", "adm"), ("vhost", "/")))] == 50
        assert "tierlog_published_messages_total 50.0" in text
        assert "tierlog_confirmed_messages_total 50.0" in text
        assert "tierlog_connections 1.0" in text
        client.close()
        async with http.delete(base + "/api/streams/adm") as r:
            assert r.status == 200
        async with http.delete(base + "/api/streams/adm") as r:
            assert r.status == 404


async def _make_segments(server: Server, client: AsyncRawClient, name: str, chunks: int) -> None:
    assert server.broker is not None
    body = {"x-tierlog-fragment-bytes": str(1 << 20), "stream-max-segment-size-bytes": "4096"}
    response = await client.request(c.CreateRequest(client.next_corr(), name, body))
    assert response.response_code == ResponseCode.OK
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", name))
    for k in range(chunks):  # one frame per chunk: wait for each confirm
        client.send(encode_publish(1, [(k * 10 + i, bytes([k]) * 10_000) for i in range(10)]))
        await client.expect(PublishConfirm)


async def _drop_oldest_segments(server: Server, name: str, count: int) -> int:
    assert server.broker is not None
    handle = server.broker.get("/", name)
    assert handle is not None
    loop = asyncio.get_running_loop()
    for _ in range(count):
        first = handle.log.segment_refs()[0].first_offset
        await loop.run_in_executor(handle.executor, handle.log.delete_segment, first)
    return handle.first_offset()


async def test_overtaken_consumer_is_told_by_default(server: Server) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    await _make_segments(server, client, "ov", 8)
    spec = c.WireOffsetSpec(OffsetType.FIRST)
    sub = c.SubscribeRequest(client.next_corr(), 4, "ov", spec, 1)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    first = await client.expect(Deliver)
    assert decode_header(bytes(first.chunk)).chunk_id == 0
    new_first = await _drop_oldest_segments(server, "ov", 2)
    assert new_first > 10
    client.send(c.CreditRequest(4, 5).encode())
    update = await client.expect(c.MetadataUpdate)
    assert update.code == ResponseCode.STREAM_NOT_AVAILABLE and update.stream == "ov"
    assert server.metrics.value("tierlog_overtaken_consumers_total", action="notify") == 1
    # the subscription is gone
    client.send(c.CreditRequest(4, 1).encode())
    credit = await client.expect(c.CreditResponse)
    assert credit.response_code == ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
    client.close()


async def test_overtaken_consumer_skips_with_property(server: Server) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    await _make_segments(server, client, "sk", 8)
    spec = c.WireOffsetSpec(OffsetType.FIRST)
    props = {"x-tierlog-overtaken": "skip"}
    sub = c.SubscribeRequest(client.next_corr(), 2, "sk", spec, 1, props)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    await client.expect(Deliver)
    new_first = await _drop_oldest_segments(server, "sk", 2)
    client.send(c.CreditRequest(2, 1).encode())
    skipped = await client.expect(Deliver)
    assert decode_header(bytes(skipped.chunk)).chunk_id == new_first
    assert server.metrics.value("tierlog_overtaken_consumers_total", action="skip") == 1
    bad = c.SubscribeRequest(client.next_corr(), 3, "sk", spec, 1, {"x-tierlog-overtaken": "?"})
    assert (await client.request(bad)).response_code == ResponseCode.PRECONDITION_FAILED
    client.close()


async def test_large_chunks_go_out_with_sendfile_and_credit_is_respected(server: Server) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    await _make_segments(server, client, "sf", 4)  # 100 KB chunks
    sub = c.SubscribeRequest(client.next_corr(), 1, "sf", c.WireOffsetSpec(OffsetType.FIRST), 2)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    got = [await client.expect(Deliver), await client.expect(Deliver)]
    with pytest.raises(TimeoutError):
        await client.expect(Deliver, timeout=0.3)  # out of credit
    client.send(c.CreditRequest(1, 10).encode())
    got += [await client.expect(Deliver), await client.expect(Deliver)]
    ids = [decode_header(bytes(d.chunk)).chunk_id for d in got]
    assert ids == [0, 10, 20, 30]
    for d in got:
        head = decode_header(bytes(d.chunk))
        assert len(d.chunk) == 48 + head.data_length
    assert server.metrics.value("tierlog_sendfile_chunks_total") >= 4
    client.close()


async def test_publishers_throttled_while_tier_lag_is_high(server: Server, lag: FixedLag) -> None:
    assert server.broker is not None
    client = await AsyncRawClient.connect(server.stream_port)
    body = {"x-tierlog-max-lag-bytes": str(64 << 20)}
    await client.request(c.CreateRequest(client.next_corr(), "bp", body))
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "bp"))
    lag.lag = 1 << 40
    handle = server.broker.get("/", "bp")
    assert handle is not None
    server.broker.refresh_lag(handle)
    client.send(encode_publish(1, [(1, b"a")]))
    await client.expect(PublishConfirm)  # the frame that hit the limit is still confirmed
    assert handle.blocked  # ...but the connection's socket is no longer read
    client.send(encode_publish(1, [(2, b"b")]))
    with pytest.raises(TimeoutError):
        await client.expect(PublishConfirm, timeout=0.5)
    assert server.metrics.value("tierlog_throttle_events_total") == 1
    lag.lag = 0
    server.broker.refresh_lag(handle)
    confirm = await client.expect(PublishConfirm)
    assert list(confirm.publishing_ids) == [2]
    client.close()
