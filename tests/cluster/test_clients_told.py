"""Clients are told what is wrong, and nothing else: in-process nodes of one cluster.

* Declaring a stream that exists answers STREAM_ALREADY_EXISTS whatever the cluster's
  state (as RabbitMQ does), so an application that declares its stream at start
  (rstream's ``create_stream(..., exists_ok=True)``) starts while a node is down;
  PRECONDITION_FAILED stays for arguments that are invalid and for a new stream the
  cluster cannot run now.
"""

from __future__ import annotations

from pathlib import Path

from rstream import Producer

from tests.cluster.test_node_replication import SECRET
from tests.cluster.test_node_servers import AsyncRawClient, node_config, start, until
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
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
