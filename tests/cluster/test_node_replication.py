"""Three in-process servers as nodes of one cluster with replication (one SQLite
MetaStore, one object store, a data directory each): a stream created with
``x-initial-cluster-size = 3`` is led by its creator and followed by the two others;
confirms come at the majority commit; the followers' segment and index files are
byte-identical to the leader's; when the leader stops, a follower takes the stream over
in a higher epoch with every confirmed message, exactly once, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cluster.test_node_servers import (
    AsyncRawClient,
    metadata,
    node_config,
    publish_confirmed,
    start,
    until,
)
from tierlog.cluster.membership import ClusterDirectory
from tierlog.formats.chunk import decode_header
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.remote.catalog import Catalog
from tierlog.server.app import Server

SECRET = "replication-secret-for-tests"
ARGS = {"x-initial-cluster-size": "3", "x-tierlog-max-segment-chunks": "8"}


def stream_files(directory: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.suffix in (".segment", ".index")
    }


def records(server: Server, name: str) -> list[bytes]:
    assert server.broker is not None
    handle = server.broker.get("/", name)
    assert handle is not None
    with handle.log.reader(OffsetSpec.first()) as reader:
        return [bytes(r) for _, r in reader.records()]


def visible_records(server: Server, incarnation: str) -> list[bytes]:
    """What the leader's consumers may read: the log up to the cluster commit."""
    assert server.cluster is not None
    view = server.cluster.read_views[incarnation]
    leader = server.cluster.node.leaders[incarnation]
    assert view.limit == leader.committed
    with LogReader(view, OffsetSpec.first()) as reader:
        return [bytes(r) for _, r in reader.records()]


async def member_reads(port: int, count: int) -> list[int]:
    """Offsets of the first ``count`` messages a consumer on that node gets from the first
    offset (retrying while the member has not learned a commit yet)."""
    client = await AsyncRawClient.connect(port)
    try:
        spec = c.WireOffsetSpec(OffsetType.FIRST)
        for _ in range(100):
            subscribe = c.SubscribeRequest(client.next_corr(), 1, "orders", spec, 100)
            answer = await client.request(subscribe)
            if answer.response_code == ResponseCode.OK:
                break
            assert answer.response_code == ResponseCode.STREAM_NOT_AVAILABLE
            await asyncio.sleep(0.05)
        offsets: list[int] = []
        while len(offsets) < count:
            header = decode_header(bytes((await client.expect(Deliver)).chunk))
            offsets.extend(range(header.chunk_id, header.next_offset))
        return offsets
    finally:
        client.close()


async def test_three_members_replicate_and_a_follower_takes_over(tmp_path: Path) -> None:
    servers = {n: await start(node_config(tmp_path, n, secret=SECRET)) for n in ("a", "b", "c")}
    try:
        a = servers["a"]
        assert a.cluster is not None

        async def all_known() -> bool:
            await a.cluster.scan()  # type: ignore[union-attr]
            return len(a.cluster.view.nodes) == 3  # type: ignore[union-attr]

        await until(all_known)
        ca = await AsyncRawClient.connect(a.stream_port)
        created = await ca.request(c.CreateRequest(ca.next_corr(), "orders", ARGS))
        assert created.response_code == ResponseCode.OK
        await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        await publish_confirmed(ca, range(1, 61))
        meta = a.meta
        assert meta is not None
        incarnation = Catalog(meta).require("/", "orders").incarnation
        record = ClusterDirectory(meta).require_stream(incarnation)
        assert record.membership.voters == ("a", "b", "c") and record.leader == "a"
        assert visible_records(a, incarnation) == [f"m{i}".encode() for i in range(1, 61)]
        answer = await ca.request(c.MetadataRequest(ca.next_corr(), ["orders"]), c.MetadataResponse)
        # members serve consumers: Metadata lists them as replicas
        ports = {b.reference: b.port for b in answer.brokers}
        replicas = {ports[r] for r in answer.streams[0].replica_references}
        assert replicas == {servers["b"].stream_port, servers["c"].stream_port}
        # a consumer on a member reads every confirmed message once the commit reached it
        view = a.cluster.read_views[incarnation]
        with LogReader(view, OffsetSpec.first()) as reader:
            offsets = [offset for offset, _ in reader.records()]
        assert len(offsets) == 60
        assert await member_reads(servers["b"].stream_port, 60) == offsets

        handle = a.broker.get("/", "orders")  # type: ignore[union-attr]
        assert handle is not None
        leader_dir = Path(handle.log.stream_dir)

        async def replicated() -> bool:
            expected = stream_files(leader_dir)
            return all(
                stream_files(tmp_path / n / "streams" / incarnation) == expected for n in ("b", "c")
            )

        await until(replicated)
        assert len(stream_files(leader_dir)) > 4  # several segments: rolls at the same chunk
        ca.close()
        await a.stop()  # resigns; b or c takes over

        def new_leader() -> str | None:
            current = ClusterDirectory(servers["b"].meta).require_stream(incarnation)  # type: ignore[arg-type]
            return current.leader if current.epoch > record.epoch else None

        async def taken_over() -> bool:
            name = new_leader()
            if name not in ("b", "c"):
                return False
            handle = servers[name].broker.get("/", "orders")  # type: ignore[union-attr]
            return handle is not None and handle.unavailable is None

        await until(taken_over)
        successor = servers[new_leader()]  # type: ignore[index]
        client = await AsyncRawClient.connect(successor.stream_port)
        declared = await client.request(
            c.DeclarePublisherRequest(client.next_corr(), 1, "p", "orders")
        )
        assert declared.response_code == ResponseCode.OK
        await publish_confirmed(client, range(50, 81))  # 50..60 are deduplicated
        assert records(successor, "orders") == [f"m{i}".encode() for i in range(1, 81)]
        assert visible_records(successor, incarnation) == [f"m{i}".encode() for i in range(1, 81)]
        assert await metadata(client, "orders") == (ResponseCode.OK, successor.stream_port)
        client.close()
    finally:
        for server in servers.values():
            await server.stop()


async def test_a_stream_without_a_majority_is_not_available(tmp_path: Path) -> None:
    servers = {n: await start(node_config(tmp_path, n, secret=SECRET)) for n in ("a", "b", "c")}
    stopped: set[str] = set()
    try:
        a = servers["a"]

        async def all_known() -> bool:
            await a.cluster.scan()  # type: ignore[union-attr]
            return len(a.cluster.view.nodes) == 3  # type: ignore[union-attr]

        await until(all_known)
        ca = await AsyncRawClient.connect(a.stream_port)
        await ca.request(c.CreateRequest(ca.next_corr(), "orders", ARGS))
        await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        await publish_confirmed(ca, range(1, 11))
        ca.close()
        for name in ("a", "b"):
            await servers[name].stop()
            stopped.add(name)
        cc = await AsyncRawClient.connect(servers["c"].stream_port)
        await asyncio.sleep(2.0)  # several scans and election attempts of c
        code, _ = await metadata(cc, "orders")
        assert code == ResponseCode.STREAM_NOT_AVAILABLE
        assert servers["c"].broker.get("/", "orders") is None  # type: ignore[union-attr]
        cc.close()
    finally:
        for name, server in servers.items():
            if name not in stopped:
                await server.stop()
