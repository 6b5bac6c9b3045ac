"""Three ``tierlog serve`` nodes, one etcd, one SeaweedFS, lease TTL 5 s; an ``rstream``
named producer with confirms publishes to a stream led by one node while that node is
killed, paused past its lease, or cut from etcd. Streams have one member (replication
between nodes is not in the server yet), so the other nodes must never take the
stream over: they answer STREAM_NOT_AVAILABLE while its leader is gone and point
Metadata at it once it is back.

Oracle (``tests/cluster/nodes.py``): every confirmed message read back exactly once, in
order; the manifest pointer never goes back; the deposed leader neither confirmed nor
committed a manifest between the moment it could have been deposed and its return in a
higher epoch. Outcomes are asserted, not timings (the waits are upper bounds).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rstream import Producer

from tests.cluster.nodes import (
    DRIFT,
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    PointerWatch,
    Publisher,
    log_time,
    oracle,
    read_stream,
    wait_for,
)
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer
from tests.server.test_inprocess import AsyncRawClient
from tierlog.cluster.membership import ClusterDirectory
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "orders"

for _name, _description in (
    ("cluster-leader-sigkill", "the stream's leader node is SIGKILLed mid-publish"),
    (
        "cluster-leader-paused",
        "the leader is SIGSTOPped past its node lease, then SIGCONTed: it must neither"
        " confirm nor commit a manifest before it leads again in a higher epoch",
    ),
    (
        "cluster-leader-etcd-cut",
        "the leader loses etcd (proxy cut) but keeps its clients: it stops confirming at"
        " its lease deadline",
    ),
):
    register_crash_point(CrashPoint(_name, _description))


def make_cluster(
    tmp_path: Path, etcd_server: str, seaweed: SeaweedServer, proxied: bool = False
) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server, seaweed, proxied_etcd=proxied)
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    yield from make_cluster(tmp_path, etcd_server, seaweed)


@pytest.fixture
def proxied_cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    yield from make_cluster(tmp_path, etcd_server, seaweed, proxied=True)


async def create_on(cluster: Cluster, node: str) -> None:
    port = cluster.node(node).process.stream_port
    async with Producer(HOST, port=port, username="guest", password="guest") as producer:
        await producer.create_stream(STREAM, arguments=STREAM_ARGS)
    assert cluster.leader_of(STREAM)[0] == node


async def metadata_code(port: int) -> tuple[int, int | None]:
    client = await AsyncRawClient.connect(port)
    try:
        answer = await client.request(
            c.MetadataRequest(client.next_corr(), [STREAM]), c.MetadataResponse
        )
    finally:
        client.close()
    stream = answer.streams[0]
    ports = {b.reference: b.port for b in answer.brokers}
    return stream.response_code, ports.get(stream.leader_reference)


async def finish_and_check(
    cluster: Cluster, publisher: Publisher, watch: PointerWatch, more: int = 100
) -> list[int]:
    """Publish ``more`` confirmed messages after the fault, then check the oracle: the
    whole stream read through every member of it (each pinned to that node)."""
    total = len(publisher.confirmed) + more
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)
    leader, _ = cluster.leader_of(STREAM)
    assert leader is not None
    members = cluster.members_of(STREAM)
    assert leader in members
    reads = await asyncio.gather(
        *(
            read_stream(cluster.node(m).process.stream_port, STREAM, total, pinned=True)
            for m in members
        )
    )
    watch.stop()
    for member, read in zip(members, reads, strict=True):
        assert oracle(publisher.confirmed, read) == [], member
    read = reads[members.index(leader)]
    assert watch.regressions() == []
    # every other node points clients at the leader, none holds the stream
    expected = (ResponseCode.OK, cluster.node(leader).process.stream_port)
    for node in cluster.live():
        if node.name != leader:
            # a node that scanned the directory while the stream was leaderless answers
            # "not available" until its next scan: its answer converges on the leader
            deadline = time.monotonic() + 10
            answer = await metadata_code(node.process.stream_port)
            while answer != expected and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                answer = await metadata_code(node.process.stream_port)
            assert answer == expected, node.name
            assert not any((node.process.data_dir / "streams").iterdir())
    return read


async def test_leader_killed_mid_publish(cluster: Cluster) -> None:
    await create_on(cluster, "n1")
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    _, first_epoch = cluster.leader_of(STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
    n1 = cluster.node("n1")
    os.kill(n1.pid, signal.SIGKILL)
    n1.process.kill()
    # once n1's lease is gone the stream has no leader; nobody else may lead a stream
    # whose only member is gone
    n2_port = cluster.node("n2").process.stream_port
    deadline = time.monotonic() + 3 * TTL
    while (await metadata_code(n2_port))[0] != ResponseCode.STREAM_NOT_AVAILABLE:
        assert time.monotonic() < deadline, "n2 still points at the killed leader"
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # a few directory scans of n2 and n3
    assert cluster.leader_of(STREAM)[0] in (None, "n1")
    for name in ("n2", "n3"):
        assert not any((cluster.node(name).process.data_dir / "streams").iterdir())
    n1.process.start()
    read = await finish_and_check(cluster, publisher, watch)
    leader, epoch = cluster.leader_of(STREAM)
    assert leader == "n1" and epoch > first_epoch
    assert len(read) >= 250


async def test_leader_paused_past_its_lease(cluster: Cluster) -> None:
    await create_on(cluster, "n1")
    incarnation = cluster.incarnation(STREAM)
    watch = PointerWatch(cluster.meta, incarnation)
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 100), 60)
    n1 = cluster.node("n1")
    _, paused_epoch = cluster.leader_of(STREAM)
    stopped = asyncio.Event()

    async def pause() -> None:
        await asyncio.sleep(0.5)  # mid-publish
        os.kill(n1.pid, signal.SIGSTOP)
        await asyncio.sleep(TTL + 2.0)
        stopped.set()

    pausing = asyncio.create_task(pause())
    await asyncio.wait_for(publisher.run(stopped.is_set), 60)
    await pausing
    woke_at = time.time()
    os.kill(n1.pid, signal.SIGCONT)

    def led_again() -> bool:
        leader, epoch = cluster.leader_of(STREAM)
        return leader == "n1" and epoch > paused_epoch

    await wait_for(led_again, 4 * TTL, "n1 leads again in a higher epoch")
    await finish_and_check(cluster, publisher, watch)
    steps = [e for e in n1.log_events("cluster_stream_step_down") if log_time(e) >= woke_at - 1]
    assert steps and "lease" in steps[0]["reason"]
    relead = [e for e in n1.log_events("cluster_stream_leading") if int(e["epoch"]) > paused_epoch]
    relead_at = log_time(relead[0])
    confirmed_while_deposed = [
        i for i, t in publisher.confirm_times.items() if woke_at <= t < relead_at
    ]
    assert confirmed_while_deposed == []
    assert watch.commits_in_epoch_after(paused_epoch, woke_at) == []


async def test_leader_cut_from_etcd_stops_confirming_at_its_lease_end(
    proxied_cluster: Cluster,
) -> None:
    cluster = proxied_cluster
    await create_on(cluster, "n1")
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 100), 60)
    n1 = cluster.node("n1")
    proxy = n1.etcd_proxy
    assert proxy is not None
    _, cut_epoch = cluster.leader_of(STREAM)
    cut_at = time.time()
    proxy.cut()
    healed = asyncio.Event()

    async def heal_later() -> None:
        await asyncio.sleep(TTL + 3.0)
        healed.set()

    healing = asyncio.create_task(heal_later())
    await asyncio.wait_for(publisher.run(healed.is_set), 60)
    await healing
    proxy.heal()
    deadline = cut_at + TTL - DRIFT  # the lease was renewed at most at the cut
    late = [i for i, t in publisher.confirm_times.items() if deadline + 0.5 < t]
    assert late == []

    def led_again() -> bool:
        leader, epoch = cluster.leader_of(STREAM)
        return leader == "n1" and epoch > cut_epoch

    await wait_for(led_again, 4 * TTL, "n1 leads again in a higher epoch")
    await finish_and_check(cluster, publisher, watch)
    assert watch.commits_in_epoch_after(cut_epoch, deadline + 0.5) == []
    record = ClusterDirectory(cluster.meta).require_stream(cluster.incarnation(STREAM))
    assert record.epoch > cut_epoch
