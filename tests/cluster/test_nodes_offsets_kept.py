"""A consumer offset that QueryOffset answered is never answered lower later, on any node
(three ``tierlog serve`` nodes, one etcd, one SeaweedFS, lease TTL 5 s, every node's
replication listener behind its own proxy). The soak's "consumers" oracle found two ways
it went back (docs/reliability.md, the everything-on soak, defect 4):

* the leader answered from its own log, including a tracking chunk no member had written
  yet; cut from its members, it answered the new offset, and the majority's new leader,
  which never had that chunk, answered the older one. Now the leader answers only once the
  stream's cluster commit holds what it answers, and refuses (STREAM_NOT_AVAILABLE) when
  the commit does not come.
* a node whose QueryOffset the leader did not answer (it was down, an election ran)
  answered from the remote tier's tracking state, which lags the leader's log by the
  tiering delay: a lower offset, or none at all. Now it answers only a value stored in
  the MetaStore while no leader answered (the consumer's newest), else refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from rstream.exceptions import OffsetNotFound, StreamNotAvailable

from tests.cluster.nodes import (
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    PinnedConsumer,
    Publisher,
    create_replicated,
    running_cluster,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

REFERENCE = "kept-consumer"
UNAVAILABLE = -2  # QueryOffset answered STREAM_NOT_AVAILABLE


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: str, seaweed: SeaweedServer
) -> Iterator[Cluster]:
    """One cluster for both tests (each has its own stream; the first heals its cut)."""
    base = tmp_path_factory.mktemp("offsets-kept")
    with running_cluster(base, etcd_server, seaweed, proxied_replication=True) as cluster:
        yield cluster


async def query(consumer: PinnedConsumer, stream: str) -> int | None:
    """The stored offset (None: none stored; ``UNAVAILABLE``: refused for now)."""
    try:
        return await asyncio.wait_for(consumer.query_offset(stream, REFERENCE), 15)
    except OffsetNotFound:
        return None
    except StreamNotAvailable:
        return UNAVAILABLE


def connect(cluster: Cluster, node: str) -> PinnedConsumer:
    port = cluster.node(node).process.stream_port
    return PinnedConsumer(HOST, port=port, username="guest", password="guest", heartbeat=0)


async def stored_and_answered(consumer: PinnedConsumer, stream: str, offset: int) -> None:
    await consumer.store_offset(stream, REFERENCE, offset)
    deadline = time.monotonic() + 3 * TTL
    while (got := await query(consumer, stream)) != offset and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert got == offset


async def test_an_answer_of_a_leader_cut_from_its_members_survives_the_failover(
    cluster: Cluster,
) -> None:
    """The leader, cut from both members, gets a StoreOffset and a QueryOffset: whatever
    it answers, the majority's new leader answers no less."""
    stream = "kept-three"
    await create_replicated(cluster, stream, {**STREAM_ARGS, "x-initial-cluster-size": "3"})
    assert cluster.leader_of(stream)[0] == "n1"
    publisher = Publisher(cluster, stream)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 60), 60)
    _, epoch = cluster.leader_of(stream)
    on_leader = connect(cluster, "n1")
    await on_leader.start()
    try:
        await stored_and_answered(on_leader, stream, 10)
        answered = [10]
        own = cluster.node("n1").replication_proxy
        assert own is not None
        own.cut()
        for name in ("n2", "n3"):
            proxy = cluster.node(name).replication_proxy
            assert proxy is not None
            proxy.cut_from("n1")
        await on_leader.store_offset(stream, REFERENCE, 40)
        got = await query(on_leader, stream)  # old code: 40, from a chunk only n1 has
        if got is not None and got >= 0:
            answered.append(got)

        def moved() -> bool:
            leader, now = cluster.leader_of(stream)
            return leader in ("n2", "n3") and now > epoch

        await wait_for(moved, 6 * TTL, "the majority takes the stream over")
        leader, _ = cluster.leader_of(stream)
        assert leader is not None
        on_new = connect(cluster, leader)
        await on_new.start()
        try:
            deadline = time.monotonic() + 3 * TTL
            while (now := await query(on_new, stream)) == UNAVAILABLE:
                assert time.monotonic() < deadline, "the new leader never answered"
                await asyncio.sleep(0.2)
        finally:
            await on_new.close()
        assert now is not None and now >= max(answered), (now, answered)
    finally:
        await on_leader.close()
        for node in cluster.nodes.values():
            assert node.replication_proxy is not None
            node.replication_proxy.heal()
            node.replication_proxy.heal_from("n1")


async def test_a_node_the_leader_does_not_answer_never_answers_an_older_offset(
    cluster: Cluster,
) -> None:
    """A stream with one member (n1) whose fragments stay local for a minute, so the
    remote tier holds none of its tracking chunks; a consumer on a non-member stores and
    reads back its offset through the leader. With the leader killed, that node answers
    nothing lower (it refuses) and, once the leader is back, the same offset."""
    stream = "kept-one"
    arguments = {**STREAM_ARGS, "x-initial-cluster-size": "1", "x-tierlog-max-fragment-age": "60s"}
    await create_replicated(cluster, stream, arguments)
    assert cluster.members_of(stream) == ("n1",)
    publisher = Publisher(cluster, stream)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 30), 60)
    on_other = connect(cluster, "n2")
    await on_other.start()
    try:
        await stored_and_answered(on_other, stream, 25)
        cluster.node("n1").process.kill()
        for _ in range(3):  # old code: no offset (the remote tier holds no tracking chunk)
            got = await query(on_other, stream)
            assert got in (25, UNAVAILABLE), got
        cluster.node("n1").process.start()
        deadline = time.monotonic() + 6 * TTL
        while (got := await query(on_other, stream)) != 25:
            assert got == UNAVAILABLE, got
            assert time.monotonic() < deadline, "the leader never answered again"
            await asyncio.sleep(0.3)
    finally:
        await on_other.close()
