"""Read anywhere on a cluster: three ``tierlog serve`` nodes (one etcd, one SeaweedFS,
lease TTL 5 s), a stream with two members; the third node serves its consumers read-only
from the remote tier while an ``rstream`` named producer publishes with confirms and the
leader is SIGKILLed (the other member takes over once the old leader comes back as a
member: two voters need both for a majority). A consumer subscribing on the non-member
while the leader is down reads what was tiered.
Oracle: every confirmed message is read through the non-member exactly once, in order;
``next`` and ``last`` on the non-member resolve against the leader's committed tail (not
the lagging remote tier) while the leader is up, and against the remote tier (logged with
its lag) while it is down; Metadata on the non-member names the leader; DeclarePublisher
there gets STREAM_NOT_AVAILABLE and QueryPublisherSequence the leader's answer; consumer
offsets stored on the non-member are read back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import ConsumerOffsetSpecification, OffsetType, Producer, schema
from rstream.consumer import Consumer, MessageContext
from rstream.exceptions import StreamNotAvailable

from tests.cluster.nodes import (
    HOST,
    PRODUCER,
    STREAM_ARGS,
    TTL,
    Cluster,
    PinnedConsumer,
    Publisher,
    id_of,
    oracle,
    wait_for,
)
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer
from tierlog.formats.protocol.constants import ResponseCode

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "read-anywhere"
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "2"}

register_crash_point(
    CrashPoint(
        "cluster-non-member-read-leader-sigkill",
        "a non-member node serves a consumer read-only while the stream's leader is SIGKILLed",
    )
)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server, seaweed, replicated=True)
    try:
        yield cluster.start()
    finally:
        cluster.close()


async def create(cluster: Cluster) -> None:
    port = cluster.node("n1").process.stream_port
    deadline = time.monotonic() + 3 * TTL
    while True:  # the nodes learn of each other through the directory scan
        try:
            async with Producer(HOST, port=port, username="guest", password="guest") as p:
                await p.create_stream(STREAM, arguments=ARGS)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def subscribe(
    port: int, got: list[int], offset_type: OffsetType = OffsetType.FIRST
) -> PinnedConsumer:
    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append(id_of(bytes(msg)))

    deadline = time.monotonic() + 3 * TTL
    while True:  # the non-member learns of the stream through its directory scan
        consumer = PinnedConsumer(HOST, port=port, username="guest", password="guest", heartbeat=0)
        await consumer.start()
        try:
            await consumer.subscribe(
                STREAM,
                on_message,
                offset_specification=ConsumerOffsetSpecification(offset_type),
            )
            return consumer
        except StreamNotAvailable:
            await consumer.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_non_member_reads_through_a_leader_kill(cluster: Cluster) -> None:
    await create(cluster)
    members = cluster.members_of(STREAM)
    assert len(members) == 2
    (outsider,) = [n for n in cluster.nodes if n not in members]
    outsider_node = cluster.node(outsider)
    port = outsider_node.process.stream_port
    got: list[int] = []
    consumer = await subscribe(port, got)
    try:
        publisher = Publisher(cluster, STREAM)
        await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
        # at once, while the remote tier still lags the leader: next / last on the
        # non-member are the leader's committed tail
        before = max(publisher.confirmed)
        next_ids: list[int] = []
        last_ids: list[int] = []
        next_consumer = await subscribe(port, next_ids, OffsetType.NEXT)
        last_consumer = await subscribe(port, last_ids, OffsetType.LAST)
        await wait_for(lambda: len(got) > 0, 3 * TTL, "the non-member serves tiered messages")
        old_leader, epoch = cluster.leader_of(STREAM)
        assert old_leader in members
        cluster.node(old_leader).process.kill()
        at_kill = len(got)

        def taken_over() -> bool:
            leader, now = cluster.leader_of(STREAM)
            return leader in members and leader != old_leader and now > epoch

        await asyncio.wait_for(publisher.run(taken_over), 6 * TTL)
        await wait_for(taken_over, 6 * TTL, "the other member takes over")
        # with two members nothing commits while one is down; what was tiered stays
        # readable on the non-member: a consumer subscribing now reads it
        during: list[int] = []
        second = await subscribe(port, during)
        fallbacks = len(outsider_node.log_events("read_anywhere_tail_from_remote"))
        third = await subscribe(port, [], OffsetType.NEXT)  # no leader tail: the remote's
        try:
            await wait_for(lambda: len(during) >= at_kill, 2 * TTL, "tiered ids read during")
            await wait_for(
                lambda: len(outsider_node.log_events("read_anywhere_tail_from_remote")) > fallbacks,
                2 * TTL,
                "next falls back to the remote tier's tail, its lag stated",
            )
        finally:
            await second.close()
            await third.close()
        assert during[:at_kill] == got[:at_kill]
        cluster.node(old_leader).process.start()  # comes back as a member
        total = len(publisher.confirmed) + 100
        await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)
        await wait_for(lambda: set(got) >= publisher.confirmed, 6 * TTL, "every confirmed id read")
        later = {i for i in publisher.confirmed if i > before}
        await wait_for(lambda: set(next_ids) >= later, 3 * TTL, "next read every later id")
        await wait_for(lambda: set(last_ids) >= later, 3 * TTL, "last read every later id")
        await asyncio.sleep(1.0)  # nothing more may arrive twice
        assert oracle(publisher.confirmed, got) == []
        # next: exactly what came after the leader's committed tail at Subscribe
        assert next_ids[0] > before and oracle(later, next_ids) == []
        # last: from the last committed chunk, which holds the last confirmed id
        assert last_ids[0] <= before and before in last_ids
        assert last_ids == sorted(set(last_ids)) and set(last_ids) >= later
        assert fallbacks == 0  # before the kill: the leader answered next and last

        # Metadata on the non-member names the leader from the directory
        async with Producer(HOST, port=port, username="guest", password="guest") as p:
            client = await p.default_client
            leader, _ = await client.query_leader_and_replicas(STREAM)
            # commands that need the leader are refused there (clients reconnect)
            with pytest.raises(StreamNotAvailable):
                await client.declare_publisher(STREAM, "writer-on-outsider", 7)
            # QueryPublisherSequence is the leader's answer (rstream's own call hides the
            # code, and a producer would resume from a wrong 0)
            for reference, expected in (("writer-on-outsider", 0), (PRODUCER, None)):
                sequence = await client.sync_request(
                    schema.QueryPublisherSequence(
                        client._corr_id_seq.next(), publisher_ref=reference, stream=STREAM
                    ),
                    resp_schema=schema.QueryPublisherSequenceResponse,
                    raise_exception=False,
                )
                assert sequence.response_code == ResponseCode.OK
                if expected is None:
                    assert sequence.sequence >= max(publisher.confirmed)
                else:
                    assert sequence.sequence == expected
        leader_name, _ = cluster.leader_of(STREAM)
        assert leader_name is not None
        assert leader.port == cluster.node(leader_name).process.stream_port

        # consumer offsets stored on the non-member are read back there
        await consumer.store_offset(STREAM, "reader-1", 42)
        await wait_for_offset(consumer, 42)
    finally:
        await consumer.close()
        await next_consumer.close()
        await last_consumer.close()


async def wait_for_offset(consumer: Consumer, expected: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        offset = await consumer.query_offset(STREAM, "reader-1")
        if offset == expected or time.monotonic() > deadline:
            assert offset == expected
            return
        await asyncio.sleep(0.2)
