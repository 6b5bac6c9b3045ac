"""Read anywhere: a read-only ``tierlog serve`` (a member of no stream) serves consumers
from the remote tier while another node publishes and tiers, on SeaweedFS + etcd.

Oracle: every confirmed message is delivered by the read-only node exactly once, in
order, across a SIGKILL of the publishing node and its restart (its confirmed but untiered
tail reaches the remote tier after the restart); consumers' offsets stored on the
read-only node live in the MetaStore and are taken over by the writer when it opens.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.remote_ack_run import Published, check_oracle, create, publish_for
from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_remote_ack_disk_loss import remote_config, s3_env
from tests.support import streams
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode

pytestmark = [pytest.mark.s3, pytest.mark.etcd]

STREAM = "anywhere"
FAST_TIERING = {
    **streams.FAST_TIERING,
    "x-tierlog-max-fragment-age": "0.3s",
    "stream-max-segment-size-bytes": "262144",
}
READER = """
[reader]
read_only = true
poll_interval_seconds = 0.1
"""


@pytest.fixture
def nodes(
    tmp_path: Path, seaweed: SeaweedServer, etcd_server: str
) -> Iterator[tuple[TierlogServerProcess, TierlogServerProcess]]:
    prefix = f"anywhere-{uuid.uuid4().hex}"
    writer = TierlogServerProcess(
        tmp_path / "writer",
        config_text=remote_config(seaweed, etcd_server, prefix),
        env=s3_env(seaweed),
    )
    reader = TierlogServerProcess(
        tmp_path / "reader",
        config_text=remote_config(seaweed, etcd_server, prefix, READER),
        env=s3_env(seaweed),
    )
    try:
        yield writer, reader
    finally:
        for node in (writer, reader):
            try:
                node.stop()
            finally:
                node.kill()


class Collected:
    """What an rstream consumer on the read-only node received."""

    def __init__(self) -> None:
        self.got: list[tuple[int, bytes]] = []
        self.last = time.monotonic()

    async def on_message(self, msg: object, ctx: object) -> None:
        self.got.append((ctx.offset, bytes(msg)))  # type: ignore[attr-defined, call-overload]
        self.last = time.monotonic()

    async def until_quiet(self, quiet: float, limit: float = 60.0) -> None:
        started = time.monotonic()
        while time.monotonic() - self.last < quiet and time.monotonic() - started < limit:
            await asyncio.sleep(0.1)


async def test_read_only_node_follows_the_writer_through_its_kill(
    nodes: tuple[TierlogServerProcess, TierlogServerProcess],
) -> None:
    from rstream import ConsumerOffsetSpecification, OffsetType
    from rstream.consumer import Consumer

    writer, reader = nodes
    writer.start()
    reader.start()
    await create(writer.stream_port, STREAM, FAST_TIERING)

    # the read-only node learns of the stream from the catalog (refreshed every second)
    client = await AsyncRawClient.connect(reader.stream_port)
    deadline = time.monotonic() + 10
    while True:
        meta = await client.request(
            c.MetadataRequest(client.next_corr(), [STREAM]), c.MetadataResponse
        )
        if meta.streams[0].response_code == ResponseCode.OK or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert meta.streams[0].response_code == ResponseCode.OK
    # it does not write: creating or publishing is refused
    refused = await client.request(c.CreateRequest(client.next_corr(), "nope", {}))
    assert refused.response_code == ResponseCode.PRECONDITION_FAILED
    client.close()

    collected = Collected()
    consumer = Consumer("127.0.0.1", port=reader.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(
            STREAM,
            collected.on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        published = Published()
        publishing = asyncio.create_task(
            publish_for(writer.stream_port, STREAM, 10.0, producer="p", state=published)
        )
        await asyncio.sleep(2.5)
        writer.kill()  # the publishing node dies mid-publish
        await publishing
        seen_at_kill = len(collected.got)
        assert seen_at_kill > 0  # tiered messages arrived while it published
        await collected.until_quiet(2.0)
        # the writer comes back (same disk), tiers its confirmed tail: the reader follows
        writer.start()
        published.next_seq = max(published.confirmed) + 1
        await publish_for(writer.stream_port, STREAM, 1.0, producer="p", state=published)
        await collected.until_quiet(3.0)
    finally:
        await consumer.close()
    print(
        f"confirmed {len(published.confirmed)}, seen by the read-only node at the kill "
        f"{seen_at_kill}, in all {len(collected.got)}"
    )
    assert len(published.confirmed) > 100
    assert check_oracle(published.confirmed, collected.got) == []
    offsets = [o for o, _ in collected.got]
    assert offsets == sorted(set(offsets))
    assert len(collected.got) >= len(published.confirmed)


async def _query(port: int, reference: str) -> tuple[int, int]:
    client = await AsyncRawClient.connect(port)
    try:
        response = await client.request(
            c.QueryOffsetRequest(client.next_corr(), reference, STREAM), c.QueryOffsetResponse
        )
        return int(response.response_code), int(response.offset)
    finally:
        client.close()


async def _store(port: int, reference: str, offset: int) -> None:
    client = await AsyncRawClient.connect(port)
    try:
        client.send(c.StoreOffsetRequest(reference, STREAM, offset).encode())
        # QueryOffset waits for the StoreOffsets sent before it on the stream
        await client.request(
            c.QueryOffsetRequest(client.next_corr(), reference, STREAM), c.QueryOffsetResponse
        )
    finally:
        client.close()


async def _eventually(fn, expected, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = await fn()
        if got == expected or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


async def test_consumer_offsets_without_a_live_member(
    nodes: tuple[TierlogServerProcess, TierlogServerProcess],
) -> None:
    writer, reader = nodes
    writer.start()
    reader.start()
    await create(writer.stream_port, STREAM, FAST_TIERING)
    await publish_for(writer.stream_port, STREAM, 0.5, producer="p")
    # stored through the writer: in its log, tiered; the read-only node reads it there
    await _store(writer.stream_port, "c1", 10)
    ok = (int(ResponseCode.OK), 10)
    assert await _eventually(lambda: _query(reader.stream_port, "c1"), ok) == ok

    writer.kill()  # no live member any more
    await _store(reader.stream_port, "c1", 25)
    assert await _query(reader.stream_port, "c1") == (ResponseCode.OK, 25)
    await _store(reader.stream_port, "c1", 20)  # an older store arriving late: ignored
    assert await _query(reader.stream_port, "c1") == (ResponseCode.OK, 25)
    await _store(reader.stream_port, "c2", 7)
    assert await _query(reader.stream_port, "c3") == (ResponseCode.NO_OFFSET, 0)

    reader.kill()  # the read-only node's disk holds none of it
    reader.start()
    assert await _query(reader.stream_port, "c1") == (ResponseCode.OK, 25)

    # a writer opening the stream takes the MetaStore offsets over into its log
    writer.start()
    assert await _query(writer.stream_port, "c1") == (ResponseCode.OK, 25)
    assert await _query(writer.stream_port, "c2") == (ResponseCode.OK, 7)
    # stored through the writer again: the read-only node sees it once it is tiered
    await _store(writer.stream_port, "c1", 40)
    ok = (int(ResponseCode.OK), 40)
    assert await _eventually(lambda: _query(reader.stream_port, "c1"), ok) == ok
    assert await _query(reader.stream_port, "c2") == (ResponseCode.OK, 7)
