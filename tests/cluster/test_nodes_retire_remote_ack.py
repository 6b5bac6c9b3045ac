"""Retiring a node that is a voter of an ``ack = remote`` stream, on three ``tierlog
serve`` nodes (one etcd, one SeaweedFS).

Found by the soak (``docs/reliability.md``, defect 3): the leaders of ``ack = remote``
streams waited for ever with "the voters staying after nX leaves are catching up".
Here the retirement completes, the stream keeps its replication factor where a spare
exists (or says why not), and every confirmed message reads back through each node
still a member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    STREAM_ARGS,
    TTL,
    Cluster,
    Publisher,
    admin_call,
    create_replicated,
    oracle,
    read_stream,
    running_cluster,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer
from tierlog.cluster.membership import ClusterDirectory

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "remote-acked"
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "3", "x-tierlog-ack": "remote"}


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def retired(cluster: Cluster, node: str, via: str) -> bool:
    status, answer = admin_call(cluster.node(via), "GET", f"/api/nodes/{node}")
    return status == 200 and bool(answer["retired"])


async def test_retiring_a_voter_of_an_ack_remote_stream_completes(cluster: Cluster) -> None:
    await create_replicated(cluster, STREAM, ARGS)
    assert cluster.members_of(STREAM) == ("n1", "n2", "n3")
    assert cluster.leader_of(STREAM)[0] == "n1"
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 200), 60)
    status, _ = admin_call(cluster.node("n1"), "POST", "/api/nodes/n3/retire", {})
    assert status == 202
    await wait_for(lambda: retired(cluster, "n3", "n1"), 6 * TTL, "n3 retires")
    record = ClusterDirectory(cluster.meta).require_stream(cluster.incarnation(STREAM))
    assert record.membership.voters == ("n1", "n2") and not record.membership.learners

    # no spare node: the stream runs one copy short, and its leader says why
    def says_why() -> bool:
        _, status = admin_call(cluster.node("n1"), "GET", "/api/cluster")
        reason = status["changes_waiting"].get(record.incarnation, "")
        return "no spare node" in reason

    await wait_for(says_why, 3 * TTL, "the leader says why the stream runs short")
    total = len(publisher.confirmed) + 100
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 60)
    for node in ("n1", "n2"):
        port = cluster.node(node).process.stream_port
        read = await read_stream(port, STREAM, total, pinned=True)
        assert oracle(publisher.confirmed, read) == [], node
