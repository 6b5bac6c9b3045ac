"""StreamStats on every node of a cluster, as RabbitMQ answers it from a member or the
leader, and Spark's streaming source reading the tail through a node that does not lead
(three ``tierlog serve`` nodes, one etcd, one SeaweedFS). It used to answer only on the
stream's leader (STREAM_NOT_AVAILABLE elsewhere), so Spark's tail read worked only with
``server`` naming the leader (docs/reliability.md, the everything-on soak, defect 5).

A member answers the commit its leader announced (what its own consumers read), a
non-member the leader's committed chunk (asked over the replication link)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.nodes import (
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    Publisher,
    create_replicated,
    id_of,
    running_cluster,
    wait_for,
)
from tests.plugins import seaweed as seaweed_plugin
from tests.plugins.seaweed import SeaweedServer
from tierlog.spark import connections
from tierlog.spark.client import StreamClient, StreamClientError

pytestmark = [pytest.mark.etcd, pytest.mark.s3, pytest.mark.spark]

THREE = "stats-three"
ONE = "stats-one"


@pytest.fixture
def cluster(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: str, seaweed: SeaweedServer
) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("stream-stats")
    with running_cluster(base, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def stats(cluster: Cluster, node: str, stream: str) -> dict[str, int] | str:
    """The node's StreamStats of ``stream`` (the error's text when refused)."""
    port = cluster.node(node).process.stream_port
    try:
        with StreamClient.connect(HOST, port) as client:
            return client.stream_stats(stream)
    except StreamClientError as exc:
        return str(exc)


async def test_stream_stats_on_members_and_non_members_and_spark_through_a_member(
    cluster: Cluster, spark: Any, tmp_path: Any
) -> None:
    await create_replicated(cluster, THREE, {**STREAM_ARGS, "x-initial-cluster-size": "3"})
    await create_replicated(cluster, ONE, {**STREAM_ARGS, "x-initial-cluster-size": "1"})
    assert cluster.leader_of(THREE)[0] == "n1" and cluster.members_of(ONE) == ("n1",)
    publishers = {s: Publisher(cluster, s) for s in (THREE, ONE)}
    for publisher in publishers.values():
        await asyncio.wait_for(publisher.run(lambda p=publisher: len(p.confirmed) >= 200), 60)
    for stream in (THREE, ONE):
        on_leader = stats(cluster, "n1", stream)
        assert isinstance(on_leader, dict), on_leader
        assert on_leader["first_chunk_id"] == 0 and on_leader["committed_chunk_id"] > 0
        for node in ("n2", "n3"):  # members learn the commit; a non-member asks the leader

            def same(node: str = node, stream: str = stream) -> bool:
                return stats(cluster, node, stream) == stats(cluster, "n1", stream)

            await wait_for(same, 3 * TTL, f"{node} answers the leader's stats of {stream}")

    # Spark's streaming source reading the tail through n2, a member that does not lead,
    # while more is published
    os.environ.setdefault("AWS_ACCESS_KEY_ID", seaweed_plugin.ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", seaweed_plugin.SECRET_KEY)
    os.environ.setdefault("AWS_REGION", seaweed_plugin.REGION)
    rows: list[tuple[int, int]] = []

    def collect(df: Any, batch_id: int) -> None:
        got = [(r["offset"], bytes(r["body"])) for r in df.collect()]
        rows.extend(sorted((o, id_of(b[b.find(b"msg-") :])) for o, b in got))

    query = (
        spark.readStream.format("tierlog")
        .options(
            stream=THREE,
            objectStore=cluster.object_uri,
            metaStore=cluster.meta_uri,
            server=f"{HOST}:{cluster.node('n2').process.stream_port}",
        )
        .load()
        .select("offset", "body")
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        three = publishers[THREE]
        await asyncio.wait_for(three.run(lambda: len(three.confirmed) >= 300), 60)
        deadline = time.monotonic() + 90
        while {i for _, i in rows} < three.confirmed:
            assert query.exception() is None, str(query.exception())[:2000]
            assert time.monotonic() < deadline, f"{len(rows)} of {len(three.confirmed)} rows"
            await asyncio.sleep(0.3)
    finally:
        query.stop()
        connections.close_all()
    ids = [i for _, i in rows]
    assert ids == sorted(set(ids)), "gap-free once and in order"
    assert [o for o, _ in rows] == sorted({o for o, _ in rows})
