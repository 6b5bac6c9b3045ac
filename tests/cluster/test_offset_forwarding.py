"""Consumer offsets forwarded to the stream's leader over loopback replication hubs: a
writer server (the leader) and a read-only server (as a member or non-member serves
consumers) in one process, sharing a SQLite MetaStore and a filesystem object store; the
read-only node's StoreOffset and QueryOffset go through hub n2 to hub n1, whose answerer
is the writer's. Oracle: a store on the reader lands in the leader's log (not the
MetaStore); with the leader unreachable it lands in the MetaStore, is visible to the next
QueryOffset on the same connection, and is the leader's answer once it is back (its
older log value never shadows it); an older MetaStore value never shadows a newer log
value."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.cluster.hub_helpers import Cluster, until
from tests.cluster.test_cluster_metrics import scrape, value, watched
from tests.log.acceptor_helpers import SMALL
from tests.read.test_read_anywhere_inprocess import FAST, _query, publish, shared
from tests.server.test_inprocess import AsyncRawClient
from tierlog.cluster.hub import ReplicationHub
from tierlog.cluster.offset_requests import NOT_LEADING
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import StreamRecord
from tierlog.remote.consumer_offsets import ConsumerOffsets
from tierlog.server.app import Server
from tierlog.server.broker import StreamHandle
from tierlog.server.leader_offsets import answer_as_writer, forward_to
from tierlog.server.meta_offsets import take_over
from tierlog.server.read_only import ReadOnlyBroker
from tierlog.server.remote_stream import LeaderOffset
from tierlog.storage.meta_store import open_meta_store

TIMEOUT = 0.5


@pytest.fixture
async def hubs() -> AsyncIterator[Cluster]:
    c = Cluster()
    yield c
    await c.stop()


def linked(hub: ReplicationHub, peer: str) -> bool:
    link = hub.links.get(peer)
    return link is not None and not link.closed


async def leader_hub(hubs: Cluster, handle: StreamHandle) -> ReplicationHub:
    """Hub n1 answering for the writer's stream (a fresh one each time it comes back)."""
    hub = await hubs.add("n1")

    async def answer(stream: str, reference: str, store: int | None) -> object:
        if stream != handle.record.incarnation:
            return NOT_LEADING
        return await answer_as_writer(handle, reference, store)

    hub.offset_answerer = answer
    return hub


async def test_offsets_forwarded_to_the_leader_and_kept_while_it_is_away(
    tmp_path, hubs: Cluster
) -> None:
    writer = Server(shared(tmp_path, "writer", read_only=False))
    reader = Server(shared(tmp_path, "reader", read_only=True))
    await writer.start()
    await reader.start()
    try:
        w = await AsyncRawClient.connect(writer.stream_port)
        await w.request(c.CreateRequest(w.next_corr(), "s", FAST))
        await w.request(c.DeclarePublisherRequest(w.next_corr(), 1, "", "s"))
        await publish(w, 1, range(1, 21))
        handle = writer.broker.get("/", "s")
        assert handle is not None
        incarnation = handle.record.incarnation
        offsets = ConsumerOffsets(writer.broker.catalog.meta)
        n1 = await leader_hub(hubs, handle)
        n2 = await hubs.add("n2")

        async def forward(
            record: StreamRecord, reference: str, store: int | None
        ) -> LeaderOffset | None:
            return await forward_to(n2, record, "n1", reference, store, TIMEOUT)

        assert isinstance(reader.broker, ReadOnlyBroker)
        reader.broker.remote.forward_offset = forward
        r = await AsyncRawClient.connect(reader.stream_port)
        deadline = time.monotonic() + 5
        while True:  # the catalog is re-read every second
            meta = await r.request(c.MetadataRequest(r.next_corr(), ["s"]), c.MetadataResponse)
            if meta.streams[0].response_code == ResponseCode.OK or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)

        # forwarded: into the leader's log, never the MetaStore
        r.send(c.StoreOffsetRequest("c", "s", 5).encode())
        assert await _query(r, "c") == (ResponseCode.OK, 5)
        assert handle.log.query_offset("c") == 5
        assert offsets.query(incarnation, "c") is None
        assert await _query(w, "c") == (ResponseCode.OK, 5)
        assert n1.offsets.answered == 3  # a query opening the link, the store, the query
        answered = "tierlog_cluster_offset_requests_answered_total"
        assert value(scrape(watched(n1)), answered) == 3
        # a node that does not lead the stream says so at once
        started = time.monotonic()
        assert await n1.forward_offset(incarnation, "n2", "c", None, timeout=5) is None
        assert time.monotonic() - started < 2

        # the leader unreachable: the MetaStore keeps the store once the timeout passed
        # (a store never waits in a dial queue), and the next QueryOffset on the
        # connection sees it
        await n1.stop()
        del hubs.hubs["n1"]
        for link in list(n2.links.values()):
            link.close()
        r.send(c.StoreOffsetRequest("c", "s", 9).encode())
        r.send(c.StoreOffsetRequest("older", "s", 3).encode())
        started = time.monotonic()
        # no leader answers: refused rather than a guess that could be lower than the
        # leader answered before (docs/cluster.md, what is guaranteed)
        assert await _query(r, "c") == (ResponseCode.STREAM_NOT_AVAILABLE, 0)
        assert TIMEOUT <= time.monotonic() - started < 5 * TIMEOUT
        assert n2.offsets.unanswered == 3  # two opening queries, the query
        unanswered = "tierlog_cluster_offset_requests_unanswered_total"
        assert value(scrape(watched(n2)), unanswered) == 3
        stored = offsets.query(incarnation, "c")
        assert stored is not None and (stored.offset, stored.taken_at) == (9, None)
        assert handle.log.query_offset("c") == 5  # the leader's log is behind
        # meanwhile the writer's own consumer stores a newer offset for "older"
        w.send(c.StoreOffsetRequest("older", "s", 11).encode())
        assert await _query(w, "older") == (ResponseCode.OK, 11)

        # the leader back: its answer is the MetaStore's newer value, taken over into
        # its log; an older MetaStore value does not replace its newer one
        await leader_hub(hubs, handle)
        await until(lambda: linked(n2, "n1"), what="n2 dials the leader again")
        assert await _query(r, "c") == (ResponseCode.OK, 9)
        assert handle.log.query_offset("c") == 9
        taken = offsets.query(incarnation, "c")
        assert taken is not None and taken.taken_at is not None
        assert await _query(w, "c") == (ResponseCode.OK, 9)
        assert await _query(r, "older") == (ResponseCode.OK, 11)
        assert handle.log.query_offset("older") == 11
        # forwarding resumes: a newer store goes to the log again
        r.send(c.StoreOffsetRequest("c", "s", 15).encode())
        assert await _query(r, "c") == (ResponseCode.OK, 15)
        assert await _query(w, "c") == (ResponseCode.OK, 15)
        assert handle.log.query_offset("c") == 15
        assert await _query(r, "nobody") == (ResponseCode.NO_OFFSET, 0)
        w.close()
        r.close()
    finally:
        await reader.stop()
        await writer.stop()


def test_a_writer_opening_the_stream_keeps_its_newer_log_values(tmp_path) -> None:
    """The take-over at open: a pending MetaStore value above the log's is written into
    the log, one at or below it is only marked taken; both are then taken."""
    meta = open_meta_store(f"sqlite://{tmp_path / 'meta.db'}")
    log = StreamLog.create(str(tmp_path / "log"), "v", "s", SMALL, created_ns=1)
    try:
        log.append([b"m"] * 30)
        log.store_offset("kept", 20)
        log.store_offset("raised", 5)
        log.sync()
        offsets = ConsumerOffsets(meta)
        assert offsets.store("inc", "kept", 12, 1)  # older than the log's 20
        assert offsets.store("inc", "raised", 9, 1)  # newer than the log's 5
        assert offsets.store("inc", "new", 3, 1)  # the log has none
        assert take_over(log, offsets, "inc") == 3
        assert (log.query_offset("kept"), log.query_offset("raised")) == (20, 9)
        assert log.query_offset("new") == 3
        assert all(v.taken_at == log.next_offset for v in offsets.list("inc").values())
        assert take_over(log, offsets, "inc") == 0  # nothing pending any more
    finally:
        log.close()
        meta.close()
