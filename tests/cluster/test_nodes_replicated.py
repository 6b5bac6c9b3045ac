"""Three ``tierlog serve`` nodes with replication (one etcd, one SeaweedFS, lease TTL
5 s): a stream created with ``x-initial-cluster-size = 3`` while an ``rstream`` named
producer publishes with confirms and the leader is SIGKILLed, or SIGSTOPped past its
lease and woken. Another member takes over in a higher epoch; the old leader comes back
as a member, cutting any uncommitted suffix. Oracle: every confirmed message read back
exactly once, in order, from every member (each read through that node itself, up to
the commit it learned); a consumer on a member reading through the kill (it resumes
after its last offset when the member ends its subscription with a MetadataUpdate)
gets every confirmed message exactly once, in order; a consumer on a member stores its
offsets there: they go to the leader's log (not the MetaStore), the leader and the third
node answer the latest one, and after the kill every node answers it and a consumer
resuming after it gets exactly the messages after it; every member's segment and index files
byte-identical once they caught up; the manifest pointer never goes back; the woken
leader neither confirmed nor committed a manifest in its old epoch after waking. Once
caught up, the leader's /metrics shows the stream led with its members' lag 0 and a
majority, and every other node shows it followed over an open link."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rstream import ConsumerOffsetSpecification, OffsetType
from rstream.consumer import MessageContext
from rstream.exceptions import OffsetNotFound, StreamNotAvailable

from tests.cluster.nodes import (
    DRIFT,
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    Node,
    PinnedConsumer,
    PointerWatch,
    Publisher,
    ResumingReader,
    create_replicated,
    id_of,
    log_time,
    oracle,
    read_stream,
    running_cluster,
    same_files_as_leader,
    wait_for,
)
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer
from tierlog.remote.consumer_offsets import ConsumerOffsets

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "replicated"
TRACKED = "tracked-consumer"
STORED_AT = 50
Seen = tuple[int, int]  # (offset, message id)
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "3", "x-tierlog-max-segment-chunks": "4"}

register_crash_point(
    CrashPoint(
        "cluster-replicated-leader-sigkill",
        "the leader of a stream with three members is SIGKILLed mid-publish; a member takes over",
    )
)
register_crash_point(
    CrashPoint(
        "cluster-replicated-leader-paused",
        "the leader of a stream with three members is SIGSTOPped past its lease, a member takes"
        " over, the old leader wakes and rejoins as a member",
    )
)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


async def create(cluster: Cluster) -> None:
    await create_replicated(cluster, STREAM, ARGS)
    assert cluster.members_of(STREAM) == ("n1", "n2", "n3")
    assert cluster.leader_of(STREAM)[0] == "n1"


async def check(cluster: Cluster, publisher: Publisher, watch: PointerWatch) -> None:
    total = len(publisher.confirmed) + 100
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)
    leader, _ = cluster.leader_of(STREAM)
    assert leader is not None
    # every member serves its consumers: read the whole stream through each of them
    names = sorted(cluster.nodes)
    reads = await asyncio.gather(
        *(
            read_stream(cluster.node(n).process.stream_port, STREAM, total, pinned=True)
            for n in names
        )
    )
    watch.stop()
    for name, read in zip(names, reads, strict=True):
        assert oracle(publisher.confirmed, read) == [], name
    assert watch.regressions() == []

    def identical() -> bool:
        expected = cluster.stream_files(leader, STREAM)
        return all(cluster.stream_files(name, STREAM) == expected for name in cluster.nodes)

    await wait_for(identical, 6 * TTL, "every member's files equal the leader's")
    assert len(cluster.stream_files(leader, STREAM)) >= 4  # rolled segments too
    await check_metrics(cluster, leader)


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The node's /metrics (admin API, guest:guest), parsed: (name, labels) -> value."""
    request = urllib.request.Request(
        node.process.admin_url + "/metrics", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def check_metrics(cluster: Cluster, leader: str) -> None:
    """The leader's scrape: the stream led, every member's lag 0, a majority, the lease
    held, three live nodes; every other node's: the stream followed, a link up to the
    leader that carried the chunks."""
    lag = ("tierlog_cluster_member_lag_offsets", (("stream", STREAM), ("vhost", "/")))

    def caught_up() -> bool:
        samples = scrape(cluster.node(leader))
        return samples.get(lag) == 0 and samples.get(("tierlog_cluster_live_nodes", ())) == 3

    await wait_for(caught_up, 3 * TTL, "the leader's metrics show every member caught up")
    on_leader = scrape(cluster.node(leader))
    assert on_leader[("tierlog_cluster_streams_led", ())] >= 1
    assert on_leader[("tierlog_cluster_streams_without_majority", ())] == 0
    assert on_leader[("tierlog_cluster_lease_held", ())] == 1
    assert 0 <= on_leader[("tierlog_cluster_lease_renewal_age_seconds", ())] < TTL
    assert on_leader[("tierlog_cluster_leaderships_acquired_total", ())] >= 1
    for name in cluster.nodes:
        if name == leader:
            continue
        samples = scrape(cluster.node(name))
        assert samples[("tierlog_cluster_streams_followed", ())] >= 1, name
        assert samples[("tierlog_cluster_link_up", (("peer", leader),))] == 1, name
        received = samples[("tierlog_cluster_link_received_bytes_total", (("peer", leader),))]
        assert received > 0, name
        sent = on_leader[("tierlog_cluster_link_sent_bytes_total", (("peer", name),))]
        assert sent > 0, name


async def test_replicated_leader_killed_mid_publish(cluster: Cluster) -> None:
    await create(cluster)
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    # a consumer on a member (not the leader) reads through the kill
    reader = ResumingReader(cluster.node("n2").process.stream_port, STREAM)
    done = asyncio.Event()
    reading = asyncio.create_task(reader.run(done.is_set))
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
    await wait_for(lambda: len(reader.ids) > 0, 3 * TTL, "the member serves its consumer")
    tracked = await store_offsets_on_a_member(cluster)
    _, epoch = cluster.leader_of(STREAM)
    cluster.node("n1").process.kill()

    def taken_over() -> bool:
        leader, now = cluster.leader_of(STREAM)
        return leader in ("n2", "n3") and now > epoch

    await asyncio.wait_for(publisher.run(taken_over), 6 * TTL)
    await wait_for(taken_over, 6 * TTL, "a member takes over")
    await resume_at_the_stored_offset(cluster, tracked)
    cluster.node("n1").process.start()  # comes back as a member
    await check(cluster, publisher, watch)
    await wait_for(
        lambda: set(reader.ids) >= publisher.confirmed, 3 * TTL, "the member's consumer read all"
    )
    done.set()
    await reading
    assert oracle(publisher.confirmed, reader.ids) == []
    if cluster.leader_of(STREAM)[0] == "n2":  # it took the stream over: told, resumed
        assert reader.ended >= 1


async def read_pinned(port: int, spec: ConsumerOffsetSpecification, count: int) -> list[Seen]:
    """(offset, id) of the first ``count`` messages a consumer on that node gets."""
    seen: list[Seen] = []

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        if spec.offset_type is OffsetType.OFFSET and ctx.offset < spec.offset:
            return  # the rest of the chunk the subscription starts inside
        seen.append((ctx.offset, id_of(bytes(msg))))

    consumer = PinnedConsumer(HOST, port=port, username="guest", password="guest", heartbeat=0)
    await consumer.start()
    try:
        await consumer.subscribe(STREAM, on_message, offset_specification=spec)
        await wait_for(lambda: len(seen) >= count, 3 * TTL, f"{count} messages read")
    finally:
        await consumer.close()
    return seen[:count]


async def query_offset(port: int) -> int | None:
    """The stored offset (None: none, or refused while no leader answers)."""
    async with PinnedConsumer(HOST, port=port, username="guest", password="guest") as consumer:
        try:
            return await consumer.query_offset(STREAM, TRACKED)
        except (OffsetNotFound, StreamNotAvailable):
            return None


async def store_offsets_on_a_member(cluster: Cluster) -> list[Seen]:
    """A consumer on member n2 (the leader is n1) stores its offset as it goes; the leader
    and n3 answer its latest one. It went to the leader's log, not to the MetaStore; what
    it read is returned, the stored offset being that of ``seen[STORED_AT]``."""
    port = cluster.node("n2").process.stream_port
    seen = await read_pinned(port, ConsumerOffsetSpecification(OffsetType.FIRST), 60)
    async with PinnedConsumer(HOST, port=port, username="guest", password="guest") as consumer:
        for index in (10, 30, STORED_AT):
            await consumer.store_offset(STREAM, TRACKED, seen[index][0])
        assert await consumer.query_offset(STREAM, TRACKED) == seen[STORED_AT][0]
    for node in ("n1", "n3"):
        assert await query_offset(cluster.node(node).process.stream_port) == seen[STORED_AT][0]
    assert ConsumerOffsets(cluster.meta).query(cluster.incarnation(STREAM), TRACKED) is None
    # the leader's tracking chunk reaches both members before it is killed
    await wait_for(
        lambda: all(same_files_as_leader(cluster, STREAM, n) for n in ("n2", "n3")),
        3 * TTL,
        "the members hold the leader's tracking chunk",
    )
    return seen


async def resume_at_the_stored_offset(cluster: Cluster, before: list[Seen]) -> None:
    """After the failover every live node answers the stored offset, and a consumer
    resuming after it gets exactly what came after it: no re-delivery, no skip."""
    stored = before[STORED_AT][0]
    for node in ("n2", "n3"):
        port = cluster.node(node).process.stream_port
        deadline = time.monotonic() + 2 * TTL
        while (got := await query_offset(port)) != stored and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # the node learns the new leader
        assert got == stored, node
    port = cluster.node("n3").process.stream_port
    spec = ConsumerOffsetSpecification(OffsetType.OFFSET, stored + 1)
    after = await read_pinned(port, spec, len(before) - STORED_AT - 1)
    assert after == before[STORED_AT + 1 :]


async def test_replicated_leader_paused_past_its_lease(cluster: Cluster) -> None:
    await create(cluster)
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    # a consumer on n1 reads through its pause: from n1 as the leader, then (told by a
    # MetadataUpdate at its step-down) from n1 as a member that cut its uncommitted suffix
    reader = ResumingReader(cluster.node("n1").process.stream_port, STREAM)
    done = asyncio.Event()
    reading = asyncio.create_task(reader.run(done.is_set))
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
    _, epoch = cluster.leader_of(STREAM)
    n1 = cluster.node("n1")
    os.kill(n1.pid, signal.SIGSTOP)

    def taken_over() -> bool:
        leader, now = cluster.leader_of(STREAM)
        return leader in ("n2", "n3") and now > epoch

    await asyncio.wait_for(publisher.run(taken_over), 6 * TTL)
    await wait_for(taken_over, 6 * TTL, "a member takes over")
    await asyncio.wait_for(publisher.run(lambda: False, limit=len(publisher.confirmed) + 50), 60)
    woke_at = time.time()
    os.kill(n1.pid, signal.SIGCONT)
    await check(cluster, publisher, watch)
    await wait_for(
        lambda: set(reader.ids) >= publisher.confirmed, 3 * TTL, "n1's consumer read all"
    )
    done.set()
    await reading
    assert oracle(publisher.confirmed, reader.ids) == []  # no uncommitted chunk, no gap
    assert reader.ended >= 1  # n1 stopped leading: its consumer was told
    assert watch.commits_in_epoch_after(epoch, woke_at) == []
    steps = [e for e in n1.log_events("cluster_stream_step_down")]
    assert steps, "the woken leader stepped down"
    assert scrape(n1)[("tierlog_cluster_step_downs_total", ())] >= 1


register_crash_point(
    CrashPoint(
        "cluster-replicated-leader-etcd-cut",
        "the leader of a stream with three members loses etcd (proxy cut) but still reaches"
        " its members: it stops confirming at its lease deadline, a member takes over",
    )
)


@pytest.fixture
def proxied_cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server, seaweed, replicated=True, proxied_etcd=True)
    try:
        yield cluster.start()
    finally:
        cluster.close()


async def test_replicated_leader_cut_from_etcd_but_not_from_its_members(
    proxied_cluster: Cluster,
) -> None:
    cluster = proxied_cluster
    await create(cluster)
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
    _, epoch = cluster.leader_of(STREAM)
    n1 = cluster.node("n1")
    assert n1.etcd_proxy is not None
    cut_at = time.time()
    n1.etcd_proxy.cut()

    def taken_over() -> bool:
        leader, now = cluster.leader_of(STREAM)
        return leader in ("n2", "n3") and now > epoch

    await asyncio.wait_for(publisher.run(taken_over), 6 * TTL)
    await wait_for(taken_over, 6 * TTL, "a member takes over")
    leader, _ = cluster.leader_of(STREAM)
    assert leader is not None

    def leading() -> list[dict[str, str]]:
        return [
            e
            for e in cluster.node(leader).log_events("cluster_stream_leading")
            if int(e["epoch"]) > epoch
        ]

    # the directory names the new leader when it acquired the stream; its election (adopt,
    # catch up, the disk identities checked) ends a moment later
    await wait_for(lambda: bool(leading()), 6 * TTL, "the new leader's election ends")
    taken_at = log_time(leading()[0])  # the new leader's election ended (its clock = ours)
    n1.etcd_proxy.heal()
    # n1 confirmed nothing after its lease deadline (the lease was renewed at most at
    # the cut); confirms after the take-over come from the new leader
    n1_late = [
        i for i, t in publisher.confirm_times.items() if cut_at + TTL - DRIFT + 0.5 < t < taken_at
    ]
    assert n1_late == []
    await check(cluster, publisher, watch)
    assert watch.commits_in_epoch_after(epoch, cut_at + TTL - DRIFT + 0.5) == []
