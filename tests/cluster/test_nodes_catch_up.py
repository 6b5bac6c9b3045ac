"""Catch-up from a distance, on three ``tierlog serve`` nodes (one etcd, one SeaweedFS,
lease TTL 5 s), with logs of one-message chunks (what publishers waiting for each
confirm write) in segments large enough to hold them all:

* a voter of a three-member stream is killed while the stream grows by thousands of
  chunks, then restarted: it catches up (one fetch answer then carries more chunks than
  the kernel takes buffers in one write, ``IOV_MAX`` = 1,024) and its files equal the
  leader's;
* a learner added to a two-member stream that already holds thousands of such chunks
  catches up from the leader's first segment and is promoted.

Oracle: byte-identical segment and index files, every published message read back
through the caught-up node, and no replica failure in its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    TTL,
    Cluster,
    admin_call,
    create_replicated,
    read_stream,
    running_cluster,
    same_files_as_leader,
    wait_for,
)
from tests.cluster.one_message_chunks import publish_one_per_chunk
from tests.plugins.seaweed import SeaweedServer
from tierlog.cluster.membership import ClusterDirectory

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

BEHIND = 2500  # one-message chunks each stream grows by while n3 is away
ARGS = {  # the default segment size: every chunk in one segment
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1s",
}


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


async def caught_up(cluster: Cluster, stream: str, what: str) -> None:
    """Wait until n3 holds the leader's files of ``stream``; a time-out names n3's
    replica failures, if any (the reason it did not catch up)."""
    try:
        await wait_for(lambda: same_files_as_leader(cluster, stream, "n3"), 6 * TTL, what)
    except AssertionError as exc:
        n3 = cluster.node("n3")
        failures = n3.log_events("replica_stream_failed") + n3.log_events("replica_write_failed")
        raise AssertionError(f"{exc}; n3's replica failures: {failures[:1]}") from None


async def test_a_member_and_a_learner_thousands_of_chunks_behind_catch_up(
    cluster: Cluster,
) -> None:
    await create_replicated(cluster, "voters", {**ARGS, "x-initial-cluster-size": "3"})
    await create_replicated(cluster, "pair", {**ARGS, "x-initial-cluster-size": "2"})
    assert cluster.members_of("voters") == ("n1", "n2", "n3")
    assert cluster.members_of("pair") == ("n1", "n2")
    n1_port = cluster.node("n1").process.stream_port
    await publish_one_per_chunk(n1_port, "voters", 50, name="before")
    await wait_for(lambda: same_files_as_leader(cluster, "voters", "n3"), 3 * TTL, "n3 follows")
    n3 = cluster.node("n3")
    n3.process.kill()
    # both streams grow by thousands of one-message chunks while n3 is away
    await asyncio.gather(
        publish_one_per_chunk(n1_port, "voters", BEHIND, name="away"),
        publish_one_per_chunk(n1_port, "pair", BEHIND, name="away"),
    )
    n3.process.start()
    await caught_up(cluster, "voters", f"n3 catches up {BEHIND} chunks of 'voters'")
    # the learner: added to 'pair', which holds thousands of chunks in its first segment
    status, answer = admin_call(
        cluster.node("n1"), "POST", "/api/streams/pair/members", {"add": "n3"}
    )
    assert status == 200, answer

    def promoted() -> bool:
        record = ClusterDirectory(cluster.meta).require_stream(cluster.incarnation("pair"))
        return record.membership.voters == ("n1", "n2", "n3") and not record.membership.learners

    await wait_for(promoted, 6 * TTL, "the learner n3 catches up and is promoted")
    await caught_up(cluster, "pair", "n3's files of 'pair'")
    for stream, total in (("voters", 50 + BEHIND), ("pair", BEHIND)):
        read = await read_stream(n3.process.stream_port, stream, total, pinned=True)
        assert len(read) == total, stream
    assert n3.log_events("replica_write_failed") == []
    assert n3.log_events("replica_stream_failed") == []
