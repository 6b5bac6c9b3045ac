"""Filtering on a cluster: three ``tierlog serve`` nodes (one etcd, one SeaweedFS), a stream
with two members. Publish v2 frames go to the leader (one chunk each: red, green, blue and
an unfiltered v1 chunk, in turn); a ``filter.0=green`` subscription is then served only the
green chunks by the leader, by the other member (its replica's chunks carry the leader's
blooms byte for byte) and by the non-member, which reads the remote tier (the fragment
index's blooms; chunks ruled out are never fetched). Oracle: the chunk ids delivered on
each node are exactly the green chunks'."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    STREAM_ARGS,
    TTL,
    Cluster,
    admin_json,
    create_replicated,
    running_cluster,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer
from tests.server.test_filtering import _filtered_delivery, _publish_colours
from tests.server.test_inprocess import AsyncRawClient
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "filtered"
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "2"}


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


async def test_filtered_reads_on_leader_member_and_non_member(cluster: Cluster) -> None:
    await create_replicated(cluster, STREAM, ARGS)
    members = cluster.members_of(STREAM)
    assert len(members) == 2
    leader = None
    deadline = time.monotonic() + 3 * TTL
    while leader is None and time.monotonic() < deadline:
        leader, _ = cluster.leader_of(STREAM)
    assert leader is not None
    (member,) = [n for n in members if n != leader]
    (outsider,) = [n for n in cluster.nodes if n not in members]
    base = admin_json(cluster.node(leader), f"/api/streams/{STREAM}")["local"]["next_offset"]
    client = await AsyncRawClient.connect(cluster.node(leader).process.stream_port)
    firsts = await _publish_colours(client, STREAM, 6, base)
    client.close()
    green = firsts[1::4]
    end = firsts[-1] + 10

    def tiered() -> bool:
        status = admin_json(cluster.node(leader), f"/api/streams/{STREAM}")
        return bool(status["remote"]["tiered_offset"] >= end)

    await wait_for(tiered, 60, "everything tiered")
    first = c.WireOffsetSpec(OffsetType.FIRST)
    for node in (leader, member, outsider):
        port = cluster.node(node).process.stream_port
        got: list[int] = []
        deadline = time.monotonic() + 6 * TTL
        while got != green and time.monotonic() < deadline:  # a node learns of it late
            try:
                got = await _filtered_delivery(
                    port, STREAM, first, {"filter.0": "green"}, green[-1]
                )
            except AssertionError:  # not served there yet (STREAM_NOT_AVAILABLE)
                got = []
        assert got == green, (node, got, green)
