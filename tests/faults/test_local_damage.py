"""Local damage under ``tierlog serve`` (in process): damaged sealed segments are repaired
from the remote tier when it holds them durably, otherwise the stream is refused, the
file moved aside and the refusal counted; a stream restarted past the remote tail
reopens (its raised epoch is adopted)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import config, publish, rstream_consume, status, wait_for
from tests.support.streams import FAST_TIERING
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish
from tierlog.server.app import Server

KEEP_LOCAL_ARGS = dict(FAST_TIERING)
FRAMES = 30
TOTAL = FRAMES * 20


def expected_bodies() -> list[bytes]:
    return [bytes([k % 256]) * 1000 for k in range(FRAMES) for _ in range(20)]


async def fill(tmp_path: Path, name: str, *, tiered: bool) -> str:
    """Create ``name`` with several local segments (tiered or not); its stream dir."""
    cfg = config(tmp_path)
    if not tiered:
        cfg = replace(cfg, tier=replace(cfg.tier, enabled=False))
    server = Server(cfg)
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        response = await client.request(c.CreateRequest(client.next_corr(), name, KEEP_LOCAL_ARGS))
        assert response.response_code == ResponseCode.OK
        await publish(client, name, FRAMES)
        client.close()
        if tiered:

            async def all_tiered() -> bool:
                s = await status(server, name)
                return s["remote"]["tiered_offset"] == s["local"]["next_offset"]

            await wait_for(all_tiered)
        assert server.broker is not None
        handle = server.broker.get("/", name)
        assert handle is not None
        return handle.log.stream_dir
    finally:
        await server.stop()


def segments(stream_dir: str) -> list[str]:
    return sorted(n for n in os.listdir(stream_dir) if n.endswith(".segment"))


async def consume_all_n(server: Server, name: str, count: int) -> list[tuple[int, bytes]]:
    from rstream import ConsumerOffsetSpecification, OffsetType

    return await rstream_consume(
        server.stream_port, name, ConsumerOffsetSpecification(OffsetType.FIRST), count
    )


async def consume_all(server: Server, name: str) -> list[tuple[int, bytes]]:
    return await consume_all_n(server, name, TOTAL)


async def test_damaged_sealed_segment_is_repaired_from_the_remote_tier(tmp_path: Path) -> None:
    stream_dir = await fill(tmp_path, "rep", tiered=True)
    names = segments(stream_dir)
    assert len(names) >= 3
    victim = os.path.join(stream_dir, names[1])
    healthy = Path(victim).read_bytes()
    os.truncate(victim, len(healthy) - 700)  # lost tail of a sealed segment
    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        assert server.broker is not None
        assert server.broker.get("/", "rep") is not None
        assert Path(victim).read_bytes() == healthy
        repaired = "tierlog_local_damage_repaired_total"
        assert server.metrics.value(repaired, vhost="/", stream="rep") == 1
        got = await consume_all(server, "rep")
        assert [o for o, _ in got] == list(range(TOTAL))
        assert [b for _, b in got] == expected_bodies()
    finally:
        await server.stop()


async def test_damaged_segment_without_a_healthy_copy_is_refused(tmp_path: Path) -> None:
    stream_dir = await fill(tmp_path, "lone", tiered=False)
    names = segments(stream_dir)
    victim = os.path.join(stream_dir, names[0])
    os.truncate(victim, os.path.getsize(victim) - 100)
    cfg = config(tmp_path)
    server = Server(replace(cfg, tier=replace(cfg.tier, enabled=False)))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        assert server.broker is not None
        assert server.broker.get("/", "lone") is None  # refused
        refused = "tierlog_local_damage_refused_total"
        assert server.metrics.value(refused, vhost="/", stream="lone") == 1
        assert not os.path.exists(victim) and os.path.exists(victim + ".damaged")
        assert segments(stream_dir) == names[1:]  # nothing else touched or deleted
    finally:
        await server.stop()
    server = Server(replace(cfg, tier=replace(cfg.tier, enabled=False)))
    await server.start()  # stays refused while the file is aside
    await server.streams_opened()  # streams open in the background
    try:
        assert server.broker is not None and server.broker.get("/", "lone") is None
    finally:
        await server.stop()


async def test_stream_restarted_past_the_remote_tail_reopens(tmp_path: Path) -> None:
    stream_dir = await fill(tmp_path, "lost", tiered=True)
    shutil.rmtree(stream_dir)  # the local disk is lost
    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        s = await status(server, "lost")
        assert s["local"]["next_offset"] > TOTAL  # restarted past the remote tail
    finally:
        await server.stop()
    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        assert server.broker is not None
        handle = server.broker.get("/", "lost")
        assert handle is not None, "the stream must reopen after the epoch was raised"
        assert handle.log.epoch >= 2
        tierer = server.tiering.tierer_of(handle.record) if server.tiering else None
        assert tierer is not None and tierer.epoch >= handle.log.epoch
        got = await consume_all(server, "lost")
        assert [b for _, b in got] == expected_bodies()
    finally:
        await server.stop()


async def test_readers_get_offsets_only_the_remote_tier_holds(tmp_path: Path) -> None:
    """The local log lost its tail (older disk image): the restart continues past the
    remote tail, leaving a local gap that readers serve from the remote tier."""
    from rstream import ConsumerOffsetSpecification, OffsetType

    stream_dir = await fill(tmp_path, "gap", tiered=True)
    names = segments(stream_dir)
    assert len(names) >= 4
    for name in names[-2:]:
        os.unlink(os.path.join(stream_dir, name))
        os.unlink(os.path.join(stream_dir, name.replace(".segment", ".index")))
    local_end_before = int(names[-2][:20])
    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "gap"))
        client.send(encode_publish(1, [(10_000 + i, b"after") for i in range(20)]))
        await client.expect(PublishConfirm)
        client.close()
        got = await rstream_consume(
            server.stream_port, "gap", ConsumerOffsetSpecification(OffsetType.FIRST), TOTAL + 20
        )
        offsets = [o for o, _ in got]
        assert offsets[:TOTAL] == list(range(TOTAL))  # nothing skipped in the local gap
        assert [b for _, b in got[:TOTAL]] == expected_bodies()
        assert [b for _, b in got[TOTAL:]] == [b"after"] * 20
        assert offsets == sorted(set(offsets))
        mid = (local_end_before + TOTAL) // 2  # inside the gap
        at = await rstream_consume(
            server.stream_port, "gap", ConsumerOffsetSpecification(OffsetType.OFFSET, mid), 5
        )
        assert [o for o, _ in at][:5] == list(range(mid, mid + 5))
    finally:
        await server.stop()


async def test_failed_resolution_refuses_appends_until_it_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local directory lost and the object store unreachable at start: the stream must not
    hand out offsets the remote tier holds; publishers get the retriable
    STREAM_NOT_AVAILABLE until the background retry resolves."""
    import tierlog.server.app as app_module
    from tests.faults.object_store import FaultyObjectStore
    from tierlog.storage.object_store import open_object_store

    stream_dir = await fill(tmp_path, "res", tiered=True)
    shutil.rmtree(stream_dir)
    stores: list[FaultyObjectStore] = []

    def unreachable(uri: str, policy: object, deadline_s: float) -> FaultyObjectStore:
        store = FaultyObjectStore(open_object_store(uri))
        store.fail_randomly(None, 1.0)
        stores.append(store)
        return store

    monkeypatch.setattr(app_module, "open_object_store_for_startup", unreachable)
    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "res"))
        client.send(encode_publish(1, [(i + 1, b"early") for i in range(10)]))
        error = await client.expect(PublishError)
        codes = {code for _, code in error.errors}
        assert codes == {ResponseCode.STREAM_NOT_AVAILABLE}
        assert server.broker is not None
        handle = server.broker.get("/", "res")
        assert handle is not None and handle.log.next_offset == 0  # nothing written
        stores[0].clear_faults()

        async def resolved() -> bool:
            return handle.unavailable is None

        await wait_for(resolved)
        client.send(encode_publish(1, [(100 + i, b"late") for i in range(10)]))
        await client.expect(PublishConfirm)
        client.close()
        assert handle.log.next_offset > TOTAL
        got = await consume_all(server, "res")
        assert [o for o, _ in got][:TOTAL] == list(range(TOTAL))
        assert [b for _, b in got][:TOTAL] == expected_bodies()
    finally:
        await server.stop()
