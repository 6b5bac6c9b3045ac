"""Read anywhere on a cluster: three ``tierlog serve`` nodes (one etcd, one SeaweedFS,
lease TTL 5 s), a stream with two members; the third node serves its consumers read-only
from the remote tier while an ``rstream`` named producer publishes with confirms and the
leader is SIGKILLed (the other member takes over once the old leader comes back as a
member: two voters need both for a majority). A consumer subscribing on the non-member
while the leader is down reads what was tiered.
Oracle: every confirmed message is read through the non-member exactly once, in order;
Metadata on the non-member names the leader; DeclarePublisher and
QueryPublisherSequence there get STREAM_NOT_AVAILABLE; consumer offsets stored on the non-member
are read back."""

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


async def subscribe(port: int, got: list[int]) -> PinnedConsumer:
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
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
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
    port = cluster.node(outsider).process.stream_port
    got: list[int] = []
    consumer = await subscribe(port, got)
    try:
        publisher = Publisher(cluster, STREAM)
        await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
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
        try:
            await wait_for(lambda: len(during) >= at_kill, 2 * TTL, "tiered ids read during")
        finally:
            await second.close()
        assert during[:at_kill] == got[:at_kill]
        cluster.node(old_leader).process.start()  # comes back as a member
        total = len(publisher.confirmed) + 100
        await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)
        await wait_for(lambda: set(got) >= publisher.confirmed, 6 * TTL, "every confirmed id read")
        await asyncio.sleep(1.0)  # nothing more may arrive twice
        assert oracle(publisher.confirmed, got) == []

        # Metadata on the non-member names the leader from the directory
        async with Producer(HOST, port=port, username="guest", password="guest") as p:
            client = await p.default_client
            leader, _ = await client.query_leader_and_replicas(STREAM)
            # commands that need the leader are refused there (clients reconnect)
            with pytest.raises(StreamNotAvailable):
                await client.declare_publisher(STREAM, "writer-on-outsider", 7)
            sequence = await client.sync_request(  # rstream's own call hides the code
                schema.QueryPublisherSequence(
                    client._corr_id_seq.next(), publisher_ref="writer-on-outsider", stream=STREAM
                ),
                resp_schema=schema.QueryPublisherSequenceResponse,
                raise_exception=False,
            )
            assert sequence.response_code == ResponseCode.STREAM_NOT_AVAILABLE
        leader_name, _ = cluster.leader_of(STREAM)
        assert leader_name is not None
        assert leader.port == cluster.node(leader_name).process.stream_port

        # consumer offsets stored on the non-member are read back there
        await consumer.store_offset(STREAM, "reader-1", 42)
        await wait_for_offset(consumer, 42)
    finally:
        await consumer.close()


async def wait_for_offset(consumer: Consumer, expected: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        offset = await consumer.query_offset(STREAM, "reader-1")
        if offset == expected or time.monotonic() > deadline:
            assert offset == expected
            return
        await asyncio.sleep(0.2)
