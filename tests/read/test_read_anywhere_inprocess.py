"""A read-only server in the same process as a writer (shared SQLite MetaStore and
filesystem object store): what it answers, what it refuses, how ``next`` resolves."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import config
from tierlog.formats.chunk import decode_header
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish
from tierlog.log.committed_chunk import chunk_end, last_user_chunk
from tierlog.log.offset_spec import OffsetSpec
from tierlog.server.app import Server
from tierlog.server.config import ReaderSection, ServerConfig, StorageSection
from tierlog.server.read_only import ReadOnlyBroker
from tierlog.server.remote_stream import CommittedTail, resolve_spec

FAST = {
    "x-tierlog-max-fragment-age": "0.1s",
    "x-tierlog-debounce-seconds": "0.01",
    "x-tierlog-fragment-bytes": str(1 << 20),
}


def shared(tmp_path: Path, name: str, read_only: bool) -> ServerConfig:
    base = config(tmp_path / name)
    return replace(
        base,
        storage=StorageSection(
            data_dir=str(tmp_path / name / "data"),
            object_store=f"file://{tmp_path / 'objects'}",
            meta_store=f"sqlite://{tmp_path / 'meta.db'}",
        ),
        reader=ReaderSection(read_only=read_only, poll_interval_seconds=0.05),
    )


async def publish(client: AsyncRawClient, publisher: int, ids: range) -> None:
    client.send(encode_publish(publisher, [(i, b"m%d" % i) for i in ids]))
    got: set[int] = set()
    while len(got) < len(ids):
        got.update((await client.expect(PublishConfirm)).publishing_ids)


async def delivered(client: AsyncRawClient, count: int, timeout: float = 10.0) -> list[int]:
    """Chunk ids of the next Deliver frames until ``count`` messages arrived."""
    chunk_ids: list[int] = []
    messages = 0
    deadline = time.monotonic() + timeout
    while messages < count:
        frame = await client.expect(Deliver, timeout=max(0.1, deadline - time.monotonic()))
        header = decode_header(bytes(frame.chunk))
        chunk_ids.append(header.chunk_id)
        messages += header.num_records
    return chunk_ids


def test_next_resolves_to_the_leader_tail_when_known() -> None:
    assert resolve_spec(OffsetSpec.next(), None) == OffsetSpec.next()
    assert resolve_spec(OffsetSpec.last(), None) == OffsetSpec.last()
    tail = CommittedTail(42, 40)
    assert resolve_spec(OffsetSpec.next(), tail) == OffsetSpec.offset(42)
    assert resolve_spec(OffsetSpec.first(), tail) == OffsetSpec.first()
    assert resolve_spec(OffsetSpec.last(), tail) == OffsetSpec.offset(40)
    assert resolve_spec(OffsetSpec.last(), CommittedTail(42, -1)) == OffsetSpec.offset(42)


async def test_read_only_server_serves_and_refuses(tmp_path: Path) -> None:
    writer = Server(shared(tmp_path, "writer", read_only=False))
    reader = Server(shared(tmp_path, "reader", read_only=True))
    await writer.start()
    await reader.start()
    try:
        assert isinstance(reader.broker, ReadOnlyBroker)
        w = await AsyncRawClient.connect(writer.stream_port)
        assert (await w.request(c.CreateRequest(w.next_corr(), "s", FAST))).response_code == 1
        await w.request(c.DeclarePublisherRequest(w.next_corr(), 1, "", "s"))
        await publish(w, 1, range(1, 11))

        r = await AsyncRawClient.connect(reader.stream_port)
        deadline = time.monotonic() + 5
        while True:  # the catalog is re-read every second
            meta = await r.request(
                c.MetadataRequest(r.next_corr(), ["s", "nope"]), c.MetadataResponse
            )
            if meta.streams[0].response_code == ResponseCode.OK or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        codes = {m.name: m.response_code for m in meta.streams}
        assert codes == {"s": ResponseCode.OK, "nope": ResponseCode.STREAM_DOES_NOT_EXIST}

        # from the first offset: the tiered messages, then new ones as they are committed
        first = c.SubscribeRequest(r.next_corr(), 1, "s", c.WireOffsetSpec(OffsetType.FIRST), 100)
        assert (await r.request(first)).response_code == ResponseCode.OK
        assert (await delivered(r, 10))[0] == 0
        # ``next`` starts at the remote tier's tail: only what is published afterwards
        nxt = c.SubscribeRequest(r.next_corr(), 2, "s", c.WireOffsetSpec(OffsetType.NEXT), 100)
        assert (await r.request(nxt)).response_code == ResponseCode.OK
        await publish(w, 1, range(11, 16))
        frames = []
        while sum(f[1] for f in frames) < 10:  # 5 messages to each subscription
            frame = await r.expect(Deliver)
            frames.append((frame.subscription_id, decode_header(bytes(frame.chunk)).num_records))
        by_sub = {sid: sum(n for s, n in frames if s == sid) for sid in (1, 2)}
        assert by_sub == {1: 5, 2: 5}

        stats = await r.request(c.StreamStatsRequest(r.next_corr(), "s"), c.StreamStatsResponse)
        assert stats.stats["committed_chunk_id"] >= 14

        # writes are refused
        assert (await r.request(c.CreateRequest(r.next_corr(), "x", {}))).response_code == (
            ResponseCode.PRECONDITION_FAILED
        )
        await r.request(c.DeclarePublisherRequest(r.next_corr(), 7, "", "s"))
        r.send(encode_publish(7, [(1, b"refused")]))
        error = await r.expect(PublishError)
        assert error.errors == [(1, ResponseCode.STREAM_NOT_AVAILABLE)]
        async with aiohttp.ClientSession(
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
        ) as http:
            url = f"http://127.0.0.1:{reader.admin_port}/api/streams/s"
            async with http.get(url) as response:
                assert response.status == 200
                body = await response.json()
        assert body["state"] == "read-only" and body["remote"]["tiered_offset"] >= 15

        # one poller for every followed stream, whatever the number of consumers
        assert reader.broker.remote.follower.followed() == [
            writer.broker.get("/", "s").record.incarnation  # type: ignore[union-attr]
        ]
        w.close()
        r.close()
    finally:
        await reader.stop()
        await writer.stop()


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_reader_settings_are_validated(bad: str) -> None:
    from tierlog.errors import ConfigError
    from tierlog.server.config import load_config

    with pytest.raises(ConfigError, match="reader"):
        load_config(environ={"TIERLOG_READER_POLL_INTERVAL_SECONDS": bad})
    with pytest.raises(ConfigError, match="reader"):
        load_config(environ={"TIERLOG_READER_MAX_POINTER_READS_PER_SECOND": bad})
    assert load_config(environ={"TIERLOG_READER_READ_ONLY": "true"}).reader.read_only


async def _query(client: AsyncRawClient, reference: str) -> tuple[int, int]:
    response = await client.request(
        c.QueryOffsetRequest(client.next_corr(), reference, "s"), c.QueryOffsetResponse
    )
    return int(response.response_code), int(response.offset)


async def test_offsets_between_a_writer_and_a_read_only_node(tmp_path: Path) -> None:
    writer = Server(shared(tmp_path, "writer", read_only=False))
    reader = Server(shared(tmp_path, "reader", read_only=True))
    await writer.start()
    await reader.start()
    try:
        w = await AsyncRawClient.connect(writer.stream_port)
        await w.request(c.CreateRequest(w.next_corr(), "s", FAST))
        await w.request(c.DeclarePublisherRequest(w.next_corr(), 1, "", "s"))
        await publish(w, 1, range(1, 21))
        w.send(c.StoreOffsetRequest("through-writer", "s", 12).encode())
        assert await _query(w, "through-writer") == (ResponseCode.OK, 12)
        r = await AsyncRawClient.connect(reader.stream_port)
        deadline = time.monotonic() + 10
        # the writer's log (tracking chunk, tiered) answers on the read-only node
        while (got := await _query(r, "through-writer")) != (ResponseCode.OK, 12):
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.2)
        # stored on the read-only node: the MetaStore; the live writer's log has none,
        # so its QueryOffset looks there too
        r.send(c.StoreOffsetRequest("through-reader", "s", 7).encode())
        assert await _query(r, "through-reader") == (ResponseCode.OK, 7)
        assert await _query(w, "through-reader") == (ResponseCode.OK, 7)
        assert await _query(w, "nobody") == (ResponseCode.NO_OFFSET, 0)
        assert await _query(r, "nobody") == (ResponseCode.NO_OFFSET, 0)
        w.close()
        r.close()
    finally:
        await reader.stop()
        await writer.stop()


async def test_next_last_and_sequence_follow_the_leader_answer(tmp_path: Path) -> None:
    """With a leader's committed tail (here the writer's, as a cluster leader answers),
    ``next`` and ``last`` on the read-only node start there, not at the remote tail, and
    nothing below it is delivered; QueryPublisherSequence is the leader's value, and
    STREAM_NOT_AVAILABLE when no leader answers."""
    writer = Server(shared(tmp_path, "writer", read_only=False))
    reader = Server(shared(tmp_path, "reader", read_only=True))
    await writer.start()
    await reader.start()
    try:
        assert isinstance(reader.broker, ReadOnlyBroker)
        slow = {**FAST, "x-tierlog-max-fragment-age": "30s"}  # the remote tier lags
        w = await AsyncRawClient.connect(writer.stream_port)
        assert (await w.request(c.CreateRequest(w.next_corr(), "s", slow))).response_code == 1
        await w.request(c.DeclarePublisherRequest(w.next_corr(), 1, "app", "s"))
        await publish(w, 1, range(1, 11))
        handle = writer.broker.get("/", "s")
        assert handle is not None

        async def leader_tail(record: object, reference: str) -> CommittedTail | None:
            commit = handle.log.commit_point().chunk_id
            end = chunk_end(handle.log, commit)
            assert end is not None
            sequence = handle.log.producer_sequence(reference) if reference else None
            return CommittedTail(end.next_offset, last_user_chunk(handle.log, commit), sequence)

        r = await AsyncRawClient.connect(reader.stream_port)
        deadline = time.monotonic() + 5
        while True:  # the catalog is re-read every second
            meta = await r.request(c.MetadataRequest(r.next_corr(), ["s"]), c.MetadataResponse)
            if meta.streams[0].response_code == ResponseCode.OK or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        query = c.QueryPublisherSequenceRequest(r.next_corr(), "app", "s")
        answer = await r.request(query, c.QueryPublisherSequenceResponse)
        assert answer.response_code == ResponseCode.STREAM_NOT_AVAILABLE  # nobody to ask
        reader.broker.remote.leader_tail = leader_tail
        query = c.QueryPublisherSequenceRequest(r.next_corr(), "app", "s")
        answer = await r.request(query, c.QueryPublisherSequenceResponse)
        assert (answer.response_code, answer.sequence) == (ResponseCode.OK, 10)

        tail = await leader_tail(None, "")
        assert tail is not None and tail.next_offset == 10
        nxt = c.SubscribeRequest(r.next_corr(), 1, "s", c.WireOffsetSpec(OffsetType.NEXT), 100)
        last = c.SubscribeRequest(r.next_corr(), 2, "s", c.WireOffsetSpec(OffsetType.LAST), 100)
        assert (await r.request(nxt)).response_code == ResponseCode.OK
        assert (await r.request(last)).response_code == ResponseCode.OK
        await asyncio.sleep(0.3)  # the cursors resolved against the leader's answer
        await publish(w, 1, range(11, 16))
        assert writer.tiering is not None
        tierer = writer.tiering.tierer_of(handle.record)
        assert tierer is not None
        assert await asyncio.get_running_loop().run_in_executor(None, tierer.flush)
        by_sub: dict[int, list[int]] = {1: [], 2: []}
        deadline = time.monotonic() + 20
        while sum(1 for chunks in by_sub.values() if chunks and chunks[-1] >= 10) < 2:
            frame = await r.expect(Deliver, timeout=max(0.1, deadline - time.monotonic()))
            by_sub[frame.subscription_id].append(decode_header(bytes(frame.chunk)).chunk_id)
        assert by_sub[1][0] == 10 and min(by_sub[1]) >= 10  # nothing below the leader's tail
        assert by_sub[2][0] == tail.last_chunk_id  # the last committed chunk, then on
        w.close()
        r.close()
    finally:
        await reader.stop()
        await writer.stop()
