"""Delayed delivery across a whole-cluster restart (three ``tierlog serve`` nodes, one
etcd, one SeaweedFS, lease TTL 5 s): every node is SIGKILLed, then all start again at
once. The boot-time opening asks the same question as the directory scan's takeover
(``may_take_over``), so the system stream is led by the node that leads its stream and
the scheduler runs there; the scheduled messages are delivered once, none early.

The boot race (which node opens which stream first) is not forced: a run without the
check fails only when a node other than the stream's leader wins the system stream."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    TTL,
    Cluster,
    running_cluster,
    wait_for,
)
from tests.delayed.test_cluster_failover import (
    STREAM,
    SYSTEM,
    create,
    publish,
    scheduler_running,
)
from tests.delayed.test_process import QUIET, body_of, consume_all
from tests.plugins.seaweed import SeaweedServer

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

MESSAGES = 60


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


async def test_whole_cluster_restart_keeps_stream_and_system_stream_together(
    cluster: Cluster,
) -> None:
    await create(cluster)
    n1 = cluster.node("n1")
    await wait_for(lambda: scheduler_running(n1), 3 * TTL, "the scheduler runs on n1")
    start = int(time.time() * 1000)
    messages = {
        pid: (f"msg-{pid:05d}".encode(), start + 3_000 + 200 * pid)
        for pid in range(1, MESSAGES + 1)
    }
    confirmed = await asyncio.wait_for(publish(n1, messages), 20)
    assert confirmed == set(messages)

    _, epoch = cluster.leader_of(STREAM)
    for node in cluster.nodes.values():
        node.process.kill()
    for node in cluster.nodes.values():
        node.process.start(wait_streams=False)

    def together() -> bool:  # in a new epoch: the records of the killed leader do not count
        leader, now = cluster.leader_of(STREAM)
        return leader is not None and now > epoch and cluster.leader_of(SYSTEM)[0] == leader

    await wait_for(together, 8 * TTL, "one node leads the stream and its system stream")
    leader, _ = cluster.leader_of(STREAM)
    assert leader is not None
    node = cluster.node(leader)
    await wait_for(lambda: scheduler_running(node), 3 * TTL, f"the scheduler runs on {leader}")

    last_due = max(due for _b, due in messages.values())
    await asyncio.sleep(max(0.0, (last_due - time.time() * 1000 + 1500) / 1000))
    got = await consume_all(node.process, STREAM, MESSAGES, timeout=6, quiet=QUIET)
    due_of = {body: due for body, due in messages.values()}
    counts = collections.Counter(body_of(raw) for _ts, raw in got)
    assert set(counts) == set(due_of), f"{len(set(due_of) - set(counts))} missing"
    assert max(counts.values()) == 1, "appended twice"
    early = [body_of(raw) for ts, raw in got if ts < due_of[body_of(raw)]]
    assert not early, f"appended early: {early[:5]}"
