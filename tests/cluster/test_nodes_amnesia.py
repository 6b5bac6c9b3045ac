"""A member that lost its disk must not vote (Raft's amnesia hazard), with three real
``tierlog serve`` nodes, one etcd, one SeaweedFS, lease TTL 5 s.

The sequence (issue 29, item 4): batch A confirmed on all three members; n3 paused
(SIGSTOP); batch B committed on n1 + n2; n1 and n2 SIGKILLed; n2's data directory
emptied; n3 woken; n2 started, and only once n3 had every chance to win an election
with n2's vote, n1. Before member identities, n2 adopted n3's epoch with an empty tail,
n3 + n2 made a majority, n3 led with A only and cut B from n1 when it came back: every
confirmed message of B was lost. Now n2's directory does not carry the identity the
stream's record expects, so it never votes: n3 cannot be elected until n1 is back, the
election takes n1's log (A and B), and n2 is demoted to a learner, catches up and is
promoted again.

Oracle: every confirmed message (A, B and a batch after the recovery) read back exactly
once, in order, through every member; n2 ends as a voter again with a new identity.
Nothing is tiered during the sequence (a long fragment age), so the local logs alone
decide what survives.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.nodes import (
    STREAM_ARGS,
    TTL,
    Cluster,
    Publisher,
    create_replicated,
    log_time,
    oracle,
    read_stream,
    running_cluster,
    same_files_as_leader,
    wait_for,
)
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer
from tierlog.cluster.membership import stream_key

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "amnesia"
ARGS = {
    **STREAM_ARGS,
    "x-initial-cluster-size": "3",
    "x-tierlog-max-fragment-age": "600s",  # nothing reaches the remote tier meanwhile
    "x-tierlog-fragment-bytes": str(64 << 20),
}

register_crash_point(
    CrashPoint(
        "cluster-member-disk-lost",
        "a member's data directory is emptied while it is down and the leader restarts:"
        " the member must not vote until it caught up again",
    )
)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def raw_record(cluster: Cluster) -> dict[str, Any]:
    stored = cluster.meta.get(stream_key(cluster.incarnation(STREAM)))
    assert stored is not None
    data: dict[str, Any] = json.loads(stored.value)
    return data


def led_after(cluster: Cluster, node: str, since: float) -> bool:
    """``node`` finished an election (it leads, clients let in) after ``since``."""
    return any(
        log_time(f) >= since for f in cluster.node(node).log_events("cluster_stream_leading")
    )


async def test_member_with_an_emptied_disk_never_votes(cluster: Cluster) -> None:
    await create_replicated(cluster, STREAM, ARGS)
    assert cluster.members_of(STREAM) == ("n1", "n2", "n3")
    assert cluster.leader_of(STREAM)[0] == "n1"
    publisher = Publisher(cluster, STREAM)
    n1, n2, n3 = (cluster.node(n) for n in ("n1", "n2", "n3"))

    # batch A: confirmed, and on every member's disk
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 60), 60)
    await wait_for(
        lambda: all(same_files_as_leader(cluster, STREAM, n) for n in ("n2", "n3")),
        3 * TTL,
        "batch A on every member",
    )
    batch_a = set(publisher.confirmed)

    # batch B: n3 paused, committed on n1 + n2
    os.kill(n3.pid, signal.SIGSTOP)
    try:
        target = len(publisher.confirmed) + 60
        await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= target), 60)
        _, epoch = cluster.leader_of(STREAM)
        n1.process.kill()
        n2.process.kill()
        shutil.rmtree(n2.process.data_dir)  # a replaced disk: the directory is empty
        n2.process.data_dir.mkdir()
    finally:
        woke = time.time()
        os.kill(n3.pid, signal.SIGCONT)
    batch_b = set(publisher.confirmed) - batch_a
    assert len(batch_b) >= 60

    n2.process.start()

    # n3 acquires the stream once n1's lease is gone and asks n2 and n1 to adopt its
    # epoch. Give that election every chance to finish with n2's vote before n1 is
    # back: it does on the old code (n3 leads with A only); now n2 is recorded as a
    # member whose disk is lost and n3 waits for n1.
    def decided() -> bool:
        if led_after(cluster, "n3", woke):
            return True
        record = raw_record(cluster)
        return "n2" in record.get("lost_disks", []) and record["epoch"] > epoch

    await wait_for(decided, 6 * TTL, "n3 won an election or n2 is recorded as lost")
    if not led_after(cluster, "n3", woke):
        await asyncio.sleep(TTL)  # an election n3 started meanwhile has its time
        assert not led_after(cluster, "n3", woke), "n3 was elected without n1"
    n1.process.start()

    # the stream is led again, with A and B, and takes new messages
    total = len(publisher.confirmed) + 40
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)
    leader, _ = cluster.leader_of(STREAM)
    assert leader in ("n1", "n3")

    names = sorted(cluster.nodes)
    reads = await asyncio.gather(
        *(
            read_stream(cluster.node(n).process.stream_port, STREAM, total, pinned=True)
            for n in names
        )
    )
    for name, read in zip(names, reads, strict=True):
        assert oracle(publisher.confirmed, read) == [], name
    assert batch_a | batch_b <= publisher.confirmed

    # n2 rejoined as a learner with a new identity and was promoted once caught up
    def promoted() -> bool:
        record = raw_record(cluster)
        return (
            sorted(record["voters"]) == ["n1", "n2", "n3"]
            and not record.get("lost_disks")
            and bool(record.get("disks", {}).get("n2"))
        )

    await wait_for(promoted, 6 * TTL, "n2 is a voter again")


async def test_records_from_before_identities_keep_working(cluster: Cluster) -> None:
    """The upgrade: a stream whose record and directories were written before member
    identities (no ``disks`` in the record, no ``member.id`` on disk). After a restart of
    the whole cluster every member whose log holds chunks keeps its place and records an
    identity; n3, whose directory was emptied during the upgrade, is marked lost,
    demoted, and rejoins. Every confirmed message is read back through every member."""
    await create_replicated(cluster, STREAM, ARGS)
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 60), 60)
    await wait_for(
        lambda: all(same_files_as_leader(cluster, STREAM, n) for n in ("n2", "n3")),
        3 * TTL,
        "every member holds the stream",
    )
    for node in cluster.nodes.values():
        node.process.stop()
    # what the code before identities left behind
    incarnation = cluster.incarnation(STREAM)
    key = stream_key(incarnation)
    stored = cluster.meta.get(key)
    assert stored is not None
    legacy = json.loads(stored.value)
    del legacy["disks"], legacy["lost_disks"]
    cluster.meta.put_if(key, json.dumps(legacy).encode(), stored.version, stored.epoch)
    for node in cluster.nodes.values():
        (node.process.data_dir / "streams" / incarnation / "member.id").unlink()
    n3 = cluster.node("n3").process
    shutil.rmtree(n3.data_dir)
    n3.data_dir.mkdir()
    for node in cluster.nodes.values():
        node.process.start(wait_streams=False)

    total = len(publisher.confirmed) + 40
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)

    def upgraded() -> bool:
        record = raw_record(cluster)
        disks = record.get("disks", {})
        return (
            sorted(record["voters"]) == ["n1", "n2", "n3"]
            and not record.get("lost_disks")
            and all(disks.get(n) for n in ("n1", "n2", "n3"))
        )

    await wait_for(upgraded, 6 * TTL, "every member recorded its identity, n3 a voter again")
    assert any(f.get("node") == "n3" for f in n3_lost(cluster))
    names = sorted(cluster.nodes)
    reads = await asyncio.gather(
        *(
            read_stream(cluster.node(n).process.stream_port, STREAM, total, pinned=True)
            for n in names
        )
    )
    for name, read in zip(names, reads, strict=True):
        assert oracle(publisher.confirmed, read) == [], name


def n3_lost(cluster: Cluster) -> list[dict[str, str]]:
    return cluster.node("n3").log_events("cluster_member_disk_lost")
