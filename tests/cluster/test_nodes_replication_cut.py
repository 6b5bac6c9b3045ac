"""Three ``tierlog serve`` nodes with replication (one etcd, one SeaweedFS, lease TTL
5 s), every node's replication listener behind its own TCP proxy (the address it
advertises to its peers). An ``rstream`` named producer publishes with confirms to a
stream of three members; then every replication proxy is cut: the leader keeps its etcd
lease but hears no member, so nothing new reaches a majority and it must confirm
nothing more (whether it steps down by check-quorum or stays is the design's choice:
outcomes are asserted, not timings). The directory holds one replication address per
node, so a node's proxy cuts the links dialed *to* it; cutting all three is what
isolates the leader from both members whoever dialed (the members are then cut from
each other too, so no side holds a majority). Once healed: every confirmed message read
back exactly once, in order, from the leader; every member's segment and index files
byte-identical; the manifest pointer never goes back. The proxies also know who dialed
(``ReplicationProxy``): cutting the leader alone leaves the members a majority."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import TTL, Cluster, PointerWatch, Publisher, log_time
from tests.cluster.test_nodes_replicated import STREAM, check, create
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

register_crash_point(
    CrashPoint(
        "cluster-leader-only-cut",
        "a three-member stream's leader alone is cut from its members (they still reach"
        " each other) while it keeps its etcd lease: the majority side takes the stream",
    )
)
register_crash_point(
    CrashPoint(
        "cluster-replication-cut",
        "the replication links of a three-member stream's leader are cut by proxies while"
        " it keeps its etcd lease: it confirms nothing more until healed",
    )
)

# confirms already in flight at the cut (their WRITTEN heard just before) may land a
# little after it; anything later was confirmed without a majority
IN_FLIGHT_SECONDS = 1.0


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server, seaweed, proxied_replication=True)
    try:
        yield cluster.start()
    finally:
        cluster.close()


async def test_leader_cut_from_its_members_stops_confirming(cluster: Cluster) -> None:
    await create(cluster)
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
    _, epoch = cluster.leader_of(STREAM)
    proxies = [n.replication_proxy for n in cluster.nodes.values()]
    assert all(p is not None for p in proxies)
    cut_at = time.time()
    for proxy in proxies:
        assert proxy is not None
        proxy.cut()
    healed = asyncio.Event()

    async def heal_later() -> None:
        await asyncio.sleep(TTL + 3.0)  # past one check-quorum period
        healed.set()

    healing = asyncio.create_task(heal_later())
    await asyncio.wait_for(publisher.run(healed.is_set), 30)
    await healing
    late = sorted(i for i, t in publisher.confirm_times.items() if t > cut_at + IN_FLIGHT_SECONDS)
    healed_at = time.time()
    for proxy in proxies:
        assert proxy is not None
        proxy.heal()
    assert late == [], f"confirmed while no member was reachable: {late[:5]}"
    # either outcome of the design: the leader stepped down by check-quorum, or it is
    # still the leader of the same epoch (having confirmed nothing, above)
    leader, now = cluster.leader_of(STREAM)
    quorum_steps = [
        e
        for e in cluster.node("n1").log_events("cluster_stream_step_down")
        if log_time(e) >= cut_at and "check-quorum" in e["reason"]
    ]
    assert quorum_steps or (leader, now) == ("n1", epoch)
    await check(cluster, publisher, watch)
    assert max(publisher.confirm_times.values()) > healed_at  # it confirms again


async def test_leader_cut_from_its_members_alone_loses_the_stream_to_the_majority(
    cluster: Cluster,
) -> None:
    """Only the leader is cut (its own proxy, and its dials through the members'
    proxies); the members still reach each other. The leader keeps its etcd lease but
    confirms nothing more; it steps down by check-quorum and lets the other voters take
    the stream (it does not win the leaderless record straight back), one of them leads
    in a higher epoch and the publisher goes on through it. Healed, the old leader
    follows: every confirmed message read back exactly once, in order, from every
    member; files byte-identical; the pointer never goes back."""
    await create(cluster)
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 150), 60)
    old, epoch = cluster.leader_of(STREAM)
    assert old == "n1"
    others = [n for n in cluster.nodes.values() if n.name != old]
    cut_at = time.time()
    own = cluster.node(old).replication_proxy
    assert own is not None
    own.cut()
    for node in others:
        assert node.replication_proxy is not None
        node.replication_proxy.cut_from(old)

    def moved() -> bool:
        leader, now = cluster.leader_of(STREAM)
        return leader not in (None, old) and now > epoch

    before = len(publisher.confirmed)
    taken = asyncio.Event()

    async def watch_take_over() -> None:
        while not moved():
            await asyncio.sleep(0.1)
        taken.set()

    watching = asyncio.create_task(watch_take_over())
    await asyncio.wait_for(
        publisher.run(lambda: taken.is_set() and len(publisher.confirmed) >= before + 100), 60
    )
    await watching
    new, new_epoch = cluster.leader_of(STREAM)
    assert new is not None
    leading = [
        log_time(e)
        for e in cluster.node(new).log_events("cluster_stream_leading")
        if int(e["epoch"]) == new_epoch
    ]
    assert leading, f"{new} leads epoch {new_epoch} but logged no start"
    # between the cut (plus what was in flight) and the new leader's start nobody confirmed
    gap = sorted(
        i for i, t in publisher.confirm_times.items() if cut_at + IN_FLIGHT_SECONDS < t < leading[0]
    )
    assert gap == [], f"confirmed while the leader was cut off: {gap[:5]}"
    own.heal()
    for node in others:
        assert node.replication_proxy is not None
        node.replication_proxy.heal_from(old)
    await check(cluster, publisher, watch)
    assert cluster.leader_of(STREAM)[1] >= new_epoch
