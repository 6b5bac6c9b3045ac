"""A member whose disk fills up, on three ``tierlog serve`` nodes (one etcd, one
SeaweedFS, lease TTL 5 s); the member's data directory is a small tmpfs (needs root).

The member's writes fail (ENOSPC) while the stream goes on confirming with the other
two members. Once space frees, the member recovers its log in place and catches up,
with no restart; while it fails it logs the failure a bounded number of times, not an
error with a traceback per retry.

Oracle: the member's segment and index files equal the leader's, every confirmed
message is read back through the member, in order.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    STREAM_ARGS,
    TTL,
    Cluster,
    Publisher,
    create_replicated,
    oracle,
    read_stream,
    running_cluster,
    same_files_as_leader,
    wait_for,
)
from tests.faults.test_disk_full import fill, tmpfs
from tests.plugins.seaweed import SeaweedServer

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.s3,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting tmpfs needs root"),
]

STREAM = "full"


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with (
        tmpfs(tmp_path / "n2", "16m"),
        running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster,
    ):
        yield cluster


def failures(cluster: Cluster, node: str) -> list[dict[str, str]]:
    n = cluster.node(node)
    return n.log_events("replica_write_failed") + n.log_events("replica_stream_failed")


async def test_a_member_whose_disk_filled_catches_up_once_space_frees(cluster: Cluster) -> None:
    await create_replicated(cluster, STREAM, {**STREAM_ARGS, "x-initial-cluster-size": "3"})
    assert cluster.members_of(STREAM) == ("n1", "n2", "n3")
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 100), 60)
    await wait_for(lambda: same_files_as_leader(cluster, STREAM, "n2"), 3 * TTL, "n2 follows")
    filler = fill(cluster.node("n2").process.data_dir)
    # the stream goes on with n1 and n3; n2 cannot write
    total = len(publisher.confirmed) + 300
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 60)
    await wait_for(lambda: bool(failures(cluster, "n2")), 3 * TTL, "n2's write fails")
    assert "No space left on device" in cluster.node("n2").process.log_path.read_text()
    assert not same_files_as_leader(cluster, STREAM, "n2")
    await asyncio.sleep(2.0)  # a few retries while the disk stays full
    filler.unlink()
    # no restart: the member recovers its log and catches up
    await wait_for(
        lambda: same_files_as_leader(cluster, STREAM, "n2"),
        6 * TTL,
        "n2 catches up once its disk has space",
    )
    assert cluster.node("n2").log_events("replica_log_recovered")
    assert len(failures(cluster, "n2")) <= 3  # logged once, not per retry
    total = len(publisher.confirmed) + 50
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 60)
    read = await read_stream(cluster.node("n2").process.stream_port, STREAM, total, pinned=True)
    assert oracle(publisher.confirmed, read) == []
