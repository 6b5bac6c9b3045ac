"""Clients are told what is wrong, and nothing else: in-process nodes of one cluster.

* A member serves consumers only while it follows its leader within a bound: a member
  whose log work is stuck (here: its writer lane blocked) refuses Subscribe with
  STREAM_NOT_AVAILABLE, its attached consumers get a MetadataUpdate, its own Metadata
  stops naming it; once it moves again it serves again.
* Declaring a stream that exists answers STREAM_ALREADY_EXISTS whatever the cluster's
  state (as RabbitMQ does), so an application that declares its stream at start
  (rstream's ``create_stream(..., exists_ok=True)``) starts while a node is down;
  PRECONDITION_FAILED stays for arguments that are invalid and for a new stream the
  cluster cannot run now.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from rstream import Producer

from tests.cluster.test_node_replication import SECRET, orders_on_three_nodes
from tests.cluster.test_node_servers import (
    AsyncRawClient,
    metadata,
    node_config,
    publish_confirmed,
    start,
    until,
)
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.remote.catalog import Catalog
from tierlog.server.app import Server


async def create(client: AsyncRawClient, name: str, arguments: dict[str, str]) -> int:
    answer = await client.request(c.CreateRequest(client.next_corr(), name, arguments))
    return int(answer.response_code)


async def knows(server: Server, nodes: int) -> None:
    cluster = server.cluster
    assert cluster is not None

    async def known() -> bool:
        await cluster.scan()
        return len(cluster.view.nodes) == nodes

    await until(known)


async def test_declaring_an_existing_stream_while_a_node_is_down(tmp_path: Path) -> None:
    def config(name: str) -> object:
        return node_config(tmp_path, name, secret=SECRET, initial_cluster_size=2)

    a = await start(config("a"))  # type: ignore[arg-type]
    b = await start(config("b"))  # type: ignore[arg-type]
    try:
        await knows(a, 2)
        ca = await AsyncRawClient.connect(a.stream_port)
        # one member (b's stop must not leave a stream without its majority: a leader
        # that cannot commit waits for its tiering flush when it stops)
        assert await create(ca, "orders", {"x-initial-cluster-size": "1"}) == ResponseCode.OK
        await b.stop()  # its lease is released: the cluster has one live node
        await knows(a, 1)
        # the stream exists: that is the answer, whatever the cluster's state (the
        # default replication factor, 2, cannot be run now)
        assert await create(ca, "orders", {}) == ResponseCode.STREAM_ALREADY_EXISTS
        async with Producer(
            "127.0.0.1", port=a.stream_port, username="guest", password="guest"
        ) as p:
            await p.create_stream("orders", exists_ok=True)  # an app starting up
        # invalid arguments are refused first, existing stream or not (RabbitMQ validates
        # a declaration's arguments before it looks the stream up)
        bad = {"x-initial-cluster-size": "two"}
        assert await create(ca, "orders", bad) == ResponseCode.PRECONDITION_FAILED
        assert await create(ca, "orders", {"x-initial-cluster-size": "0"}) == (
            ResponseCode.PRECONDITION_FAILED
        )
        # a new stream that needs two live nodes cannot be created now: a real precondition
        assert await create(ca, "payments", {}) == ResponseCode.PRECONDITION_FAILED
        ca.close()
    finally:
        await a.stop()


TTL = 2.0


async def subscribe(client: AsyncRawClient, sub_id: int) -> int:
    spec = c.WireOffsetSpec(OffsetType.FIRST)
    answer = await client.request(
        c.SubscribeRequest(client.next_corr(), sub_id, "orders", spec, 100)
    )
    return int(answer.response_code)


async def test_a_stuck_member_refuses_consumers_and_tells_attached_ones(tmp_path: Path) -> None:
    def config(name: str) -> object:
        base = node_config(tmp_path, name, secret=SECRET)
        return replace(
            base, cluster=replace(base.cluster, lease_ttl_seconds=TTL, drift_seconds=0.5)
        )

    servers = {n: await start(config(n)) for n in ("a", "b", "c")}  # type: ignore[arg-type]
    release = threading.Event()
    try:
        ca = await orders_on_three_nodes(servers, {"x-initial-cluster-size": "3"}, 10)
        b = servers["b"]
        assert b.cluster is not None and b.cluster.followers is not None and b.meta is not None
        cb = await AsyncRawClient.connect(b.stream_port)

        async def serving() -> bool:
            return await subscribe(cb, 1) == ResponseCode.OK

        await until(serving)  # b follows a and serves
        assert (await cb.expect(Deliver)) is not None
        # b's log work gets stuck: its writer lane runs nothing more
        incarnation = Catalog(b.meta).require("/", "orders").incarnation
        lane = b.cluster.followers.streams[incarnation].lane
        lane.submit(release.wait)
        await publish_confirmed(ca, range(11, 21))  # a and c commit without b
        # the attached consumer is told (within the lease TTL and one check)
        update = await cb.expect(c.MetadataUpdate, timeout=4 * TTL)
        assert update.code == ResponseCode.STREAM_NOT_AVAILABLE and update.stream == "orders"
        # a new subscription is refused rather than left waiting
        assert await subscribe(cb, 2) == ResponseCode.STREAM_NOT_AVAILABLE
        # b's Metadata names the leader and no longer b itself
        answer = await cb.request(c.MetadataRequest(cb.next_corr(), ["orders"]), c.MetadataResponse)
        ports = {x.reference: x.port for x in answer.brokers}
        assert ports[answer.streams[0].leader_reference] == servers["a"].stream_port
        assert b.stream_port not in {ports[r] for r in answer.streams[0].replica_references}
        assert await metadata(cb, "orders") == (ResponseCode.OK, servers["a"].stream_port)
        release.set()  # b moves again: it catches up and serves again

        async def serving_again() -> bool:
            return await subscribe(cb, 3) == ResponseCode.OK

        await until(serving_again)
        cb.close()
        ca.close()
    finally:
        release.set()
        for server in servers.values():
            await server.stop()


def test_the_member_bound() -> None:
    """When a member serves consumers (the pure rule; real replica runner states)."""
    from tierlog.cluster.replica_runner import ReplicaStatus
    from tierlog.server.member_reads import MemberBound

    def status(state: str, behind: int = 0, error: str | None = None) -> ReplicaStatus:
        return ReplicaStatus(
            "a",
            3,
            state,
            10,
            11,
            10,
            10 + behind,
            behind,
            error,
            None,
            0,
            0,  # type: ignore[arg-type]
        )

    bound = MemberBound(heard_within=5.0, max_behind=100)
    assert bound.refusal(status("following"), 1.0) is None
    assert bound.refusal(status("catching-up", 100), 1.0) is None  # within the bound
    assert bound.refusal(status("catching-up", 101), 1.0) == (
        "catching up from 101 offsets behind the commit"
    )
    assert bound.refusal(status("following"), 5.5) == "no word from leader a for 5.5 s"
    failed = status("failed", error="OSError(28, 'No space left on device')")
    assert bound.refusal(failed, 0.1) == "failed: OSError(28, 'No space left on device')"
