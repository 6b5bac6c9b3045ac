"""Super streams on a three-node cluster (one etcd, one SeaweedFS): created through n1
with replicated partitions (``x-initial-cluster-size`` 3), the catalog entry is the
cluster's — n2 and n3 answer Partitions and Route for it at once. An rstream
``SuperStreamProducer`` publishes through n2, n1 (which created, and so led, every
partition) is SIGKILLed, the partitions are taken over by n2 and n3, and an rstream
``SuperStreamConsumer`` on n3 reads every confirmed message exactly once; then
DeleteSuperStream through n3 removes the partitions and the entry cluster-wide."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    RouteType,
    SuperStreamConsumer,
    SuperStreamProducer,
    amqp_decoder,
)
from rstream.producer import ConfirmationStatus

from tests.cluster.nodes import HOST, STREAM_ARGS, TTL, Cluster, running_cluster, wait_for
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import RawClient
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode as R
from tierlog.remote.catalog import Catalog
from tierlog.remote.super_streams import SuperStreamCatalog

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

NAME = "ss-cluster"
PARTS = [f"{NAME}-{i}" for i in range(3)]
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "3"}
COUNT = 90


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def _client(cluster: Cluster, node: str) -> RawClient:
    raw = RawClient(HOST, cluster.node(node).process.stream_port, timeout=30)
    assert raw.handshake() == R.OK
    return raw


def _ask(raw: RawClient, request: object) -> object:
    raw.send(request.encode())  # type: ignore[attr-defined]
    while True:
        answer = raw.recv_frame()
        assert answer is not None, "connection closed"
        if getattr(answer, "correlation_id", None) == request.correlation_id:  # type: ignore[attr-defined]
            return answer


def _create_when_the_nodes_know_each_other(cluster: Cluster) -> None:
    raw = _client(cluster, "n1")
    try:
        deadline = time.monotonic() + 3 * TTL
        while True:
            request = c.CreateSuperStreamRequest(
                raw.next_corr(), NAME, PARTS, ["0", "1", "2"], ARGS
            )
            answer = _ask(raw, request)
            assert isinstance(answer, c.SimpleResponse)
            if answer.response_code == R.OK:
                return
            # PRECONDITION_FAILED while n1 does not see two other live nodes yet
            assert answer.response_code == R.PRECONDITION_FAILED, answer
            assert time.monotonic() < deadline, "n1 never saw three live nodes"
            time.sleep(0.3)
    finally:
        raw.close()


def _wait_available_on(cluster: Cluster, node: str) -> None:
    """Until Metadata on ``node`` answers OK for every partition (the new leaders opened
    them and ``node``'s scan saw it), as a client retries STREAM_NOT_AVAILABLE."""
    raw = _client(cluster, node)
    try:
        deadline = time.monotonic() + 3 * TTL
        while True:
            answer = _ask(raw, c.MetadataRequest(raw.next_corr(), PARTS))
            assert isinstance(answer, c.MetadataResponse)
            codes = {s.name: s.response_code for s in answer.streams}
            if set(codes.values()) == {R.OK}:
                return
            assert set(codes.values()) <= {R.OK, R.STREAM_NOT_AVAILABLE}, codes
            assert time.monotonic() < deadline, codes
            time.sleep(0.2)
    finally:
        raw.close()


async def _key(message: AMQPMessage) -> str:
    return str(message.application_properties["key"])


async def _publish(cluster: Cluster) -> list[int]:
    confirmed: list[int] = []  # publishing ids are per partition: count them, all of them

    async def on_confirm(status: ConfirmationStatus) -> None:
        if status.is_confirmed:
            confirmed.append(status.message_id)

    producer = SuperStreamProducer(
        HOST,
        cluster.node("n2").process.stream_port,
        username="guest",
        password="guest",
        super_stream=NAME,
        routing_extractor=_key,
        routing=RouteType.Hash,
    )
    async with producer:
        for i in range(COUNT):
            message = AMQPMessage(body=f"m-{i}".encode(), application_properties={"key": f"k{i}"})
            await producer.send(message, on_publish_confirm=on_confirm)
        await wait_for(lambda: len(confirmed) == COUNT, 30, "every message confirmed")
    return confirmed


async def _consume(cluster: Cluster, expected: int) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    consumer = SuperStreamConsumer(
        HOST,
        cluster.node("n3").process.stream_port,
        username="guest",
        password="guest",
        super_stream=NAME,
    )

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        seen.setdefault(bytes(message.body).decode(), []).append(context.stream)

    await consumer.start()
    try:
        first = ConsumerOffsetSpecification(OffsetType.FIRST, None)
        await consumer.subscribe(
            callback=on_message, offset_specification=first, decoder=amqp_decoder
        )
        await wait_for(lambda: sum(map(len, seen.values())) >= expected, 30, "every message")
        await asyncio.sleep(0.5)  # nothing more arrives
    finally:
        await consumer.close()
    return seen


def test_super_stream_across_nodes_through_a_leader_kill(cluster: Cluster) -> None:
    _create_when_the_nodes_know_each_other(cluster)
    for node in ("n2", "n3"):  # the entry is the cluster's: answered everywhere at once
        raw = _client(cluster, node)
        try:
            parts = _ask(raw, c.PartitionsRequest(raw.next_corr(), NAME))
            assert isinstance(parts, c.PartitionsResponse)
            assert (parts.response_code, list(parts.streams)) == (R.OK, PARTS)
            route = _ask(raw, c.RouteRequest(raw.next_corr(), "2", NAME))
            assert isinstance(route, c.RouteResponse)
            assert (route.response_code, list(route.streams)) == (R.OK, [f"{NAME}-2"])
        finally:
            raw.close()
    assert {p: cluster.leader_of(p)[0] for p in PARTS} == dict.fromkeys(PARTS, "n1")
    assert all(len(cluster.members_of(p)) == 3 for p in PARTS)  # replicated, tiered streams

    asyncio.run(_publish(cluster))
    cluster.node("n1").process.kill()
    asyncio.run(
        wait_for(
            lambda: all(cluster.leader_of(p)[0] in ("n2", "n3") for p in PARTS),
            6 * TTL,
            "the partitions taken over by n2 and n3",
        )
    )
    leaders = {p: cluster.leader_of(p)[0] for p in PARTS}
    _wait_available_on(cluster, "n3")
    seen = asyncio.run(_consume(cluster, COUNT))
    assert sorted(seen) == sorted(f"m-{i}" for i in range(COUNT)), leaders
    assert all(len(where) == 1 for where in seen.values())  # each read exactly once
    assert {w[0] for w in seen.values()} <= set(PARTS)

    incarnations = [cluster.incarnation(p) for p in PARTS]
    raw = _client(cluster, "n3")
    try:
        gone = _ask(raw, c.DeleteSuperStreamRequest(raw.next_corr(), NAME))
        assert isinstance(gone, c.SimpleResponse) and gone.response_code == R.OK
    finally:
        raw.close()
    assert SuperStreamCatalog(cluster.meta).get("/", NAME) is None
    assert all(Catalog(cluster.meta).get("/", p) is None for p in PARTS)
    # each partition deleted as Delete deletes a stream: its incarnation's tombstone, and
    # its remote data through the stream-cleanup queue
    assert all(Catalog(cluster.meta).is_deleted(i) for i in incarnations)
