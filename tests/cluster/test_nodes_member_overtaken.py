"""A member holding a stale segment (data retention removed from the stream) refuses a
Subscribe below the stream's first offset once, with its reason, on real nodes (three
``tierlog serve`` nodes, one etcd, one SeaweedFS).

The case the soak found: a stream whose segments are larger than what retention keeps,
so every node's one local segment still holds offsets the remote tier's retention
removed. A member's first offset used to be its local segment's, so a Subscribe there
was accepted, the reader then found the offset overtaken and ended the subscription
with a MetadataUpdate, and rstream subscribed again at the same offset, for ever (every
1.7 s in the soak). Now it is refused at once (PRECONDITION_FAILED) and a Subscribe at
the first offset is served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import ConsumerOffsetSpecification, OffsetType
from rstream.consumer import MessageContext
from rstream.exceptions import PreconditionFailed

from tests.cluster.nodes import (
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    PinnedConsumer,
    Publisher,
    admin_json,
    create_replicated,
    read_stream,
    running_cluster,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "stale-member"
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "3", "max-age": "3s"}


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def remote_first(cluster: Cluster) -> int:
    status = admin_json(cluster.node("n1"), f"/api/streams/{STREAM}")
    first = status["remote"]["first_offset"]
    return -1 if first is None else int(first)


async def test_a_member_with_a_stale_segment_refuses_an_overtaken_subscribe_once(
    cluster: Cluster,
) -> None:
    await create_replicated(cluster, STREAM, ARGS)
    assert cluster.leader_of(STREAM)[0] == "n1"
    publisher = Publisher(cluster, STREAM, batch=5)
    # small batches over several seconds: many fragments, one local segment (64 KiB)
    for _ in range(16):
        total = len(publisher.confirmed) + 5
        await asyncio.wait_for(publisher.run(lambda t=total: len(publisher.confirmed) >= t), 30)  # type: ignore[misc]
        await asyncio.sleep(0.5)
    await wait_for(lambda: remote_first(cluster) > 10, 6 * TTL, "retention trims the remote tier")
    first = remote_first(cluster)
    incarnation = cluster.incarnation(STREAM)
    segments = sorted(
        (cluster.node("n2").process.data_dir / "streams" / incarnation).glob("*.segment")
    )
    assert segments[0].name == f"{0:020d}.segment"  # the member's stale segment, from 0
    # the member serves the stream from its first offset (this also loads its view)
    got = await read_stream(cluster.node("n2").process.stream_port, STREAM, 1, pinned=True)
    assert got and got[0] > 1

    delivered: list[int] = []

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        delivered.append(ctx.offset)

    spec = ConsumerOffsetSpecification(OffsetType.OFFSET, 5)
    for _ in range(2):  # asked again (a client resuming at its stored offset): the same
        consumer = PinnedConsumer(
            HOST, port=cluster.node("n2").process.stream_port, username="guest", password="guest"
        )
        await consumer.start()
        try:
            with pytest.raises(PreconditionFailed):
                await consumer.subscribe(STREAM, on_message, offset_specification=spec)
        finally:
            await consumer.close()
    await asyncio.sleep(1.0)  # nothing more: never accepted, so never ended and resumed
    assert delivered == []
    refused = cluster.node("n2").log_events("subscribe_refused_overtaken")
    assert len(refused) == 2 and int(refused[0]["first_offset"]) >= first
