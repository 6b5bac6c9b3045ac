"""Several in-process servers as nodes of one cluster (one SQLite MetaStore, one object
store, a data directory each), streams with one member: only the leader writes a
stream; every other node answers STREAM_NOT_AVAILABLE and points Metadata at it; a
restarted leader takes its streams back in a higher epoch, with every confirmed
message exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.server.test_inprocess import AsyncRawClient
from tests.support import waiting
from tierlog.cluster.membership import ClusterDirectory
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.log.offset_spec import OffsetSpec
from tierlog.remote.catalog import Catalog
from tierlog.server.app import Server
from tierlog.server.config import (
    ClusterSection,
    ServerConfig,
    ServerSection,
    StorageSection,
    TierSection,
)

TTL = 5.0


def node_config(tmp_path: Path, name: str, **cluster: object) -> ServerConfig:
    return replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(
            data_dir=str(tmp_path / name),
            object_store=f"file://{tmp_path / 'objects'}",
            meta_store=f"sqlite://{tmp_path / 'meta.db'}",
        ),
        tier=replace(TierSection(), delete_grace_seconds=0.0, retention_interval_seconds=0.1),
        cluster=replace(
            ClusterSection(),
            node=name,
            lease_ttl_seconds=TTL,
            drift_seconds=1.0,
            scan_interval_seconds=0.2,
            **cluster,  # type: ignore[arg-type]
        ),
    ).validate()


async def start(config: ServerConfig) -> Server:
    server = Server(config)
    await server.start()
    assert server.cluster is not None
    await asyncio.wait_for(server.cluster.registered.wait(), 3 * TTL)
    await server.streams_opened(3 * TTL)
    return server


async def metadata(client: AsyncRawClient, name: str) -> tuple[int, int | None]:
    """(response code, leader's stream port or None)."""
    answer = await client.request(c.MetadataRequest(client.next_corr(), [name]), c.MetadataResponse)
    stream = answer.streams[0]
    ports = {b.reference: b.port for b in answer.brokers}
    return stream.response_code, ports.get(stream.leader_reference)


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 4 * TTL) -> None:
    await waiting.until(predicate, timeout, interval=0.1)


async def publish_confirmed(client: AsyncRawClient, ids: range, publisher: int = 1) -> None:
    for i in ids:
        client.send(encode_publish(publisher, [(i, f"m{i}".encode())]))
        confirm = await client.expect(PublishConfirm)
        assert list(confirm.publishing_ids) == [i]


async def test_only_the_leader_writes_and_metadata_points_at_it(tmp_path: Path) -> None:
    a = await start(node_config(tmp_path, "a"))
    b = await start(node_config(tmp_path, "b"))
    try:
        ca = await AsyncRawClient.connect(a.stream_port)
        cb = await AsyncRawClient.connect(b.stream_port)
        created = await ca.request(c.CreateRequest(ca.next_corr(), "orders", {}))
        assert created.response_code == ResponseCode.OK
        declared = await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        assert declared.response_code == ResponseCode.OK
        await publish_confirmed(ca, range(1, 11))
        assert await metadata(ca, "orders") == (ResponseCode.OK, a.stream_port)

        async def b_points_at_a() -> bool:
            return await metadata(cb, "orders") == (ResponseCode.OK, a.stream_port)

        await until(b_points_at_a)
        # the other node neither writes the stream nor accepts a publisher for it
        refused = await cb.request(c.DeclarePublisherRequest(cb.next_corr(), 1, "p", "orders"))
        assert refused.response_code == ResponseCode.STREAM_NOT_AVAILABLE
        assert b.broker is not None and b.broker.get("/", "orders") is None
        assert not list((tmp_path / "b" / "streams").iterdir())
        # a second creation of the same name from the other node is refused
        again = await cb.request(c.CreateRequest(cb.next_corr(), "orders", {}))
        assert again.response_code == ResponseCode.STREAM_ALREADY_EXISTS
        # a replication factor above one cannot be run yet: refused, not ignored
        bigger = {"x-initial-cluster-size": "3"}
        refused_rf = await ca.request(c.CreateRequest(ca.next_corr(), "wide", bigger))
        assert refused_rf.response_code == ResponseCode.PRECONDITION_FAILED
        ca.close()
        cb.close()
    finally:
        await b.stop()
        await a.stop()


async def test_a_restarted_leader_takes_its_stream_back_in_a_higher_epoch(
    tmp_path: Path,
) -> None:
    a = await start(node_config(tmp_path, "a"))
    b = await start(node_config(tmp_path, "b"))
    try:
        ca = await AsyncRawClient.connect(a.stream_port)
        await ca.request(c.CreateRequest(ca.next_corr(), "orders", {}))
        await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        await publish_confirmed(ca, range(1, 21))
        ca.close()
        meta = a.meta
        assert meta is not None
        record = Catalog(meta).require("/", "orders")
        first_epoch = ClusterDirectory(meta).require_stream(record.incarnation).epoch
        await a.stop()  # resigns: the stream has no leader, and b is not a member

        cb = await AsyncRawClient.connect(b.stream_port)

        async def unavailable_on_b() -> bool:
            return (await metadata(cb, "orders"))[0] == ResponseCode.STREAM_NOT_AVAILABLE

        await until(unavailable_on_b)
        a = await start(node_config(tmp_path, "a"))
        ca = await AsyncRawClient.connect(a.stream_port)
        declared = await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        assert declared.response_code == ResponseCode.OK
        # a retry of confirmed ids is deduplicated; new ids are confirmed in the new epoch
        await publish_confirmed(ca, range(15, 31))
        record_after = ClusterDirectory(a.meta).require_stream(record.incarnation)  # type: ignore[arg-type]
        assert record_after.epoch > first_epoch and record_after.leader == "a"
        handle = a.broker.get("/", "orders")  # type: ignore[union-attr]
        assert handle is not None and handle.log.epoch == record_after.epoch
        with handle.log.reader(OffsetSpec.first()) as reader:
            bodies = [bytes(r) for _, r in reader.records()]
        assert bodies == [f"m{i}".encode() for i in range(1, 31)]

        async def b_points_at_a() -> bool:
            return await metadata(cb, "orders") == (ResponseCode.OK, a.stream_port)

        await until(b_points_at_a)
        ca.close()
        cb.close()
    finally:
        await b.stop()
        await a.stop()


async def test_a_leader_whose_lease_is_lost_stops_confirming_and_hands_the_stream_back(
    tmp_path: Path,
) -> None:
    """The MetaStore drops the node's lease (as after a pause past the TTL): the leader
    steps down before any further confirm, tells its clients, and takes the stream
    back in a new epoch once registered again."""
    a = await start(node_config(tmp_path, "a"))
    try:
        ca = await AsyncRawClient.connect(a.stream_port)
        await ca.request(c.CreateRequest(ca.next_corr(), "orders", {}))
        await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        await publish_confirmed(ca, range(1, 6))
        service = a.cluster
        assert service is not None and service.lease is not None
        lease = service.lease.lease
        assert lease is not None
        leader = next(iter(service.node.leaders.values()))
        epoch = leader.epoch
        service.directory.release_node(lease)  # the store forgets the lease
        update = await ca.expect(c.MetadataUpdate, timeout=3 * TTL)
        assert update.code == ResponseCode.STREAM_NOT_AVAILABLE
        assert leader.stepped_down

        async def led_again() -> bool:
            handle = a.broker.get("/", "orders")  # type: ignore[union-attr]
            return (
                any(lead.epoch > epoch for lead in service.node.leaders.values())
                and handle is not None
                and handle.unavailable is None
            )

        await until(led_again)
        ca.close()
        ca = await AsyncRawClient.connect(a.stream_port)
        declared = await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "orders"))
        assert declared.response_code == ResponseCode.OK
        await publish_confirmed(ca, range(6, 11))
        ca.close()
    finally:
        await a.stop()


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"initial_cluster_size": 3}, "set cluster.secret"),
        ({"replication_port": 5553}, "needs cluster.secret"),
        ({"replication_address": "127.0.0.1:5553"}, "needs cluster.secret"),
        ({"secret": "short"}, "at least 16"),
        ({"initial_cluster_size": 0}, "1..9"),
    ],
)
def test_replication_settings_need_the_cluster_secret(
    tmp_path: Path, settings: dict[str, object], error: str
) -> None:
    from tierlog.errors import ConfigError

    with pytest.raises(ConfigError, match=error):
        node_config(tmp_path, "a", **settings)
