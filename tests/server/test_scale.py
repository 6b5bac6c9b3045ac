"""Many streams per node: threads bounded by configuration (not by stream count), and
a restarted server that listens at once and answers STREAM_NOT_AVAILABLE (retriable,
never a hang) for a stream whose resolution has not completed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.server.test_inprocess import AsyncRawClient
from tierlog.formats.chunk import decode_chunk, iter_records
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.server import app as server_app
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection, TierSection
from tierlog.storage.object_store import MultipartUpload, ObjectMeta, ObjectStore

AUTH = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"}


def _config(tmp_path: Path) -> ServerConfig:
    return replace(
        ServerConfig(),
        server=replace(
            ServerSection(),
            port=0,
            admin_port=0,
            heartbeat=0,
            writer_threads=2,
            open_concurrency=4,
        ),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
        tier=replace(TierSection(), event_threads=1, upload_threads=2, resolution_reads=2),
    )


async def _create(client: AsyncRawClient, names: Iterable[str]) -> None:
    """Create streams with pipelined requests (responses may come in any order)."""
    sent = 0
    for name in names:
        client.send(c.CreateRequest(client.next_corr(), name, {}).encode())
        sent += 1
    for _ in range(sent):
        response = await client.expect(c.SimpleResponse, timeout=60)
        assert response.response_code == ResponseCode.OK


async def _publish(client: AsyncRawClient, name: str, first: int, count: int) -> int:
    """Publish ``count`` messages; the response code of the publisher declaration."""
    declared = await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", name))
    if declared.response_code != ResponseCode.OK:
        return int(declared.response_code)
    messages = [(first + i, b"%s-%d" % (name.encode(), first + i)) for i in range(count)]
    client.send(encode_publish(1, messages))
    confirmed: list[int] = []
    while len(confirmed) < count:
        confirm = await client.expect(PublishConfirm)
        confirmed += list(confirm.publishing_ids)
    await client.request(c.DeletePublisherRequest(client.next_corr(), 1))
    return ResponseCode.OK


def _flush_all(server: Server) -> None:
    """Tier everything committed now, every stream at once (uploads and commits of
    many streams overlap on the shared pools)."""
    assert server.tiering is not None
    tierers = list(server.tiering.tierers.values())
    targets = [tierer.log.commit_point().next_offset for tierer in tierers]
    for tierer in tierers:
        tierer.flush(0.0)  # asks for the flush, does not wait
    for tierer, target in zip(tierers, targets, strict=True):
        assert tierer.wait_durable(target, 30.0)


_BEFORE: set[int | None] = set()


def _threads() -> tuple[int, list[str]]:
    """Threads started since the test began (pools of servers that earlier tests stopped
    without waiting may still be winding down in this process)."""
    names = sorted(t.name for t in threading.enumerate() if t.ident not in _BEFORE)
    return len(names), names


async def test_threads_stay_constant_as_streams_are_added(tmp_path: Path) -> None:
    _BEFORE.clear()
    _BEFORE.update(t.ident for t in threading.enumerate())
    server = Server(_config(tmp_path))
    await server.start()
    loop = asyncio.get_running_loop()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        # warm up: every shared pool has run work (writers, tiering events, uploads)
        await _create(client, (f"s{i}" for i in range(40)))
        for i in range(40):
            assert await _publish(client, f"s{i}", 1, 5) == ResponseCode.OK
        await loop.run_in_executor(None, _flush_all, server)
        warm, warm_names = _threads()

        await _create(client, (f"s{i}" for i in range(40, 300)))
        for i in range(40, 300):
            assert await _publish(client, f"s{i}", 1, 5) == ResponseCode.OK
        await loop.run_in_executor(None, _flush_all, server)
        after, after_names = _threads()

        assert server.broker is not None and len(server.broker.streams()) == 300
        assert after <= warm, sorted(set(after_names) - set(warm_names))
        # and the count is the configuration's: writer + event + upload + resolution
        # pools, one timer, the loop's default executor, the main thread
        assert sum(n.startswith("writer-") for n in after_names) <= 2
        assert sum(n.startswith("tier-events") for n in after_names) <= 1
        assert sum(n.startswith("tier-upload") for n in after_names) <= 2
        assert after <= 40, after_names
        client.close()
    finally:
        await server.stop()


class HeldStore(ObjectStore):
    """An object store whose reads of one stream's objects wait until released (its
    resolution is held back); everything else passes through."""

    def __init__(self, inner: ObjectStore, held: str) -> None:
        self.inner = inner
        self.held = held
        self.released = threading.Event()
        self.blocked = threading.Event()

    def _gate(self, key: str) -> None:
        if self.held in key and not self.released.is_set():
            self.blocked.set()
            self.released.wait(60)

    def put(self, key: str, data: Any) -> ObjectMeta:
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: Any) -> ObjectMeta:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self._gate(key)
        return self.inner.get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        self._gate(key)
        return self.inner.get_suffix(key, length)

    def head(self, key: str) -> ObjectMeta:
        self._gate(key)
        return self.inner.head(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        self._gate(prefix)
        return self.inner.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def create_multipart(self, key: str) -> MultipartUpload:
        return self.inner.create_multipart(key)

    def close(self) -> None:
        self.inner.close()


async def _admin(server: Server, path: str) -> Any:
    url = f"http://127.0.0.1:{server.admin_port}{path}"
    async with aiohttp.ClientSession(headers=AUTH) as session, session.get(url) as response:
        return response.status, await response.json()


async def _read_all(client: AsyncRawClient, name: str, count: int) -> list[bytes]:
    spec = c.WireOffsetSpec(OffsetType.FIRST)
    subscribed = await client.request(c.SubscribeRequest(client.next_corr(), 7, name, spec, 100))
    assert subscribed.response_code == ResponseCode.OK
    out: list[bytes] = []
    while len(out) < count:
        deliver = await client.expect(Deliver)
        chunk = decode_chunk(deliver.chunk)
        out += [
            bytes(r)
            for _o, r in iter_records(chunk.header.chunk_id, chunk.data, chunk.header.num_entries)
        ]
    await client.request(c.UnsubscribeRequest(client.next_corr(), 7))
    return out


async def test_stream_under_resolution_answers_not_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    first = Server(config)
    await first.start()
    client = await AsyncRawClient.connect(first.stream_port)
    await _create(client, ["held", "free"])
    for name in ("held", "free"):
        assert await _publish(client, name, 1, 10) == ResponseCode.OK
    await asyncio.get_running_loop().run_in_executor(None, _flush_all, first)
    assert first.broker is not None
    held_dir = first.broker.get("/", "held").record.incarnation  # type: ignore[union-attr]
    client.close()
    await first.stop()

    stores: list[HeldStore] = []
    real_open = server_app.open_object_store_for_startup

    def open_held(uri: str, policy: object, deadline_s: float) -> ObjectStore:
        store = HeldStore(real_open(uri, policy, deadline_s), held_dir)  # type: ignore[arg-type]
        stores.append(store)
        return store

    monkeypatch.setattr(server_app, "open_object_store_for_startup", open_held)
    second = Server(config)
    started = time.monotonic()
    await second.start()  # listens while "held" cannot resolve
    assert time.monotonic() - started < 5.0
    store = stores[0]
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, store.blocked.wait, 10)
        client = await AsyncRawClient.connect(second.stream_port)
        # publish, subscribe and metadata on the held stream: retriable, at once
        code = await asyncio.wait_for(_publish(client, "held", 11, 1), 5)
        assert code == ResponseCode.STREAM_NOT_AVAILABLE
        spec = c.WireOffsetSpec(OffsetType.FIRST)
        sub = await client.request(c.SubscribeRequest(client.next_corr(), 1, "held", spec, 10))
        assert sub.response_code == ResponseCode.STREAM_NOT_AVAILABLE
        meta = await client.request(
            c.MetadataRequest(client.next_corr(), ["held", "nope"]), c.MetadataResponse
        )
        codes = {m.name: m.response_code for m in meta.streams}
        assert codes == {
            "held": ResponseCode.STREAM_NOT_AVAILABLE,
            "nope": ResponseCode.STREAM_DOES_NOT_EXIST,
        }
        status, body = await _admin(second, "/api/streams/held")
        assert status == 200 and body["state"] == "resolving"
        # the other stream is served meanwhile
        for _ in range(400):  # registered at once, available once its resolution is done
            status, body = await _admin(second, "/api/streams/free")
            if status == 200 and body["state"] == "available":
                break
            await asyncio.sleep(0.05)
        assert await _publish(client, "free", 11, 10) == ResponseCode.OK
        status, listing = await _admin(second, "/api/streams")
        states = {s["name"]: s["state"] for s in listing["streams"]}
        assert states == {"held": "resolving", "free": "available"}

        store.released.set()
        assert second.broker is not None
        await asyncio.wait_for(second.broker.all_open.wait(), 30)
        assert await _publish(client, "held", 11, 10) == ResponseCode.OK
        for name in ("held", "free"):
            got = await _read_all(client, name, 20)
            assert got == [b"%s-%d" % (name.encode(), i) for i in range(1, 21)]
        status, body = await _admin(second, "/api/streams/held")
        assert body["state"] == "available"
        client.close()
    finally:
        store.released.set()
        await second.stop()
