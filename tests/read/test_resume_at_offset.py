"""A consumer resuming at its stored offset gets, as its first chunk, the chunk that holds
that offset, whichever tier and node serves it (RabbitMQ attaches there too). Clients skip
records below the offset only inside the first chunk they get (rstream does), so a first
chunk that ends below the offset hands the application messages it already processed.

The node reading lags the stream here, deterministically: fragments are cut by size only
(1 MiB, a maximum fragment age of an hour), so the chunks of the last, unfilled fragment
are on the writer's disk but not in the remote tier. A consumer asks for an offset in that
part; the chunks below it that get tiered first must not reach it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType

from tests.read.test_read_anywhere_inprocess import shared
from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import config
from tests.support.waiting import until
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.server.app import Server

BY_SIZE = {
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1h",
    "x-tierlog-debounce-seconds": "0.01",
}
MESSAGE = 100_000  # ~10 one-message chunks per fragment


async def send(server: Server, client: AsyncRawClient, ids: range) -> None:
    """One chunk per message: each Publish frame is sent once the one before it is
    written (frames queued together would be group-committed into one chunk)."""
    assert server.broker is not None
    handle = server.broker.get("/", "s")
    assert handle is not None
    for i in ids:
        client.send(encode_publish(1, [(i, b"%08d" % i + bytes(MESSAGE))]))
        while handle.log.next_offset <= i:
            await asyncio.sleep(0.002)


async def confirmed(client: AsyncRawClient, count: int) -> None:
    got = 0
    while got < count:
        got += len((await client.expect(PublishConfirm)).publishing_ids)


async def remote_next_offset(server: Server, name: str) -> int:
    """The next offset the remote tier holds, as the writer's tierer committed it."""
    assert server.tiering is not None and server.broker is not None
    handle = server.broker.get("/", name)
    assert handle is not None
    tierer = server.tiering.tierer_of(handle.record)
    assert tierer is not None
    return tierer.committed_tree().next_offset


async def settled_tail(server: Server, name: str) -> int:
    """The remote tier's next offset once every full fragment is committed (unchanged for
    a second: the rest waits for more data, the maximum fragment age being long)."""
    tail, since = await remote_next_offset(server, name), time.monotonic()
    while time.monotonic() - since < 1.0 or tail == 0:
        await asyncio.sleep(0.05)
        now = await remote_next_offset(server, name)
        if now != tail:
            tail, since = now, time.monotonic()
    return tail


class Resumed:
    """An rstream consumer subscribed at ``offset``: the offsets it hands the app."""

    def __init__(self, port: int, name: str, offset: int) -> None:
        self.port, self.name, self.offset = port, name, offset
        self.offsets: list[int] = []
        self.consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")

    async def __aenter__(self) -> Resumed:
        await self.consumer.start()

        async def on_message(message: AMQPMessage, context: MessageContext) -> None:
            self.offsets.append(context.offset)

        spec = ConsumerOffsetSpecification(OffsetType.OFFSET, self.offset)
        await self.consumer.subscribe(self.name, on_message, offset_specification=spec)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.close()


async def test_a_non_member_reader_resumes_at_the_chunk_holding_the_offset(
    tmp_path: Path,
) -> None:
    writer = Server(shared(tmp_path, "writer", read_only=False))
    reader = Server(shared(tmp_path, "reader", read_only=True))
    await writer.start()
    await reader.start()
    try:
        w = await AsyncRawClient.connect(writer.stream_port)
        assert (await w.request(c.CreateRequest(w.next_corr(), "s", BY_SIZE))).response_code == 1
        await w.request(c.DeclarePublisherRequest(w.next_corr(), 1, "", "s"))
        await send(writer, w, range(30))
        await confirmed(w, 30)
        r = await AsyncRawClient.connect(reader.stream_port)

        async def reader_knows() -> bool:  # it re-reads the catalog every second
            meta = await r.request(c.MetadataRequest(r.next_corr(), ["s"]), c.MetadataResponse)
            return bool(meta.streams[0].response_code == 1)

        await until(reader_knows)
        r.close()
        tail = await settled_tail(writer, "s")
        assert 0 < tail < 27  # the last fragment is not full: its chunks are local only
        stored = tail + 3  # where the consumer resumes: on the writer, not remote yet
        async with Resumed(reader.stream_port, "s", stored) as consumer:
            await asyncio.sleep(0.5)  # it waits at the remote tier's end
            assert consumer.offsets == []
            await send(
                writer, w, range(30, 60)
            )  # the fragment holding ``stored`` fills and is tiered
            await confirmed(w, 30)

            async def got_some() -> bool:
                return len(consumer.offsets) >= 10

            await until(got_some)
            below = [o for o in consumer.offsets if o < stored]
            assert below == [], f"{len(below)} messages below offset {stored} delivered again"
            assert consumer.offsets[0] == stored
            assert consumer.offsets == list(range(stored, stored + len(consumer.offsets)))
        w.close()
    finally:
        await reader.stop()
        await writer.stop()


async def test_an_ack_remote_stream_resumes_at_the_chunk_holding_the_offset(
    tmp_path: Path,
) -> None:
    """The same on the writer itself: an ``ack = remote`` stream's consumers read only
    what the remote tier committed, through the local log."""
    base = config(tmp_path)
    # fragments of an ack = remote stream are cut at most this long after their first
    # chunk: an interval longer than the test leaves them cut by size only
    server = Server(replace(base, tier=replace(base.tier, remote_ack_interval_seconds=60.0)))
    await server.start()
    try:
        w = await AsyncRawClient.connect(server.stream_port)
        arguments = {**BY_SIZE, "x-tierlog-ack": "remote"}
        assert (await w.request(c.CreateRequest(w.next_corr(), "s", arguments))).response_code == 1
        await w.request(c.DeclarePublisherRequest(w.next_corr(), 1, "", "s"))
        await send(server, w, range(30))
        tail = await settled_tail(server, "s")
        assert 0 < tail < 27
        stored = tail + 3
        async with Resumed(server.stream_port, "s", stored) as consumer:
            await asyncio.sleep(0.5)
            assert consumer.offsets == []
            await send(server, w, range(30, 60))

            async def got_some() -> bool:
                return len(consumer.offsets) >= 10

            await until(got_some)
            below = [o for o in consumer.offsets if o < stored]
            assert below == [], f"{len(below)} messages below offset {stored} delivered again"
            assert consumer.offsets[0] == stored
        w.close()
    finally:
        await server.stop()
