"""Delayed delivery in a three-node cluster (``tierlog serve`` processes, one etcd, one
SeaweedFS, lease TTL 5 s): a delayed stream with three voters gets a system stream with
the same voters; messages scheduled a few seconds ahead with ``rstream`` are due while
the leader is SIGKILLed, or SIGSTOPped past its lease and woken, at a random moment
(the woken leader's scheduler must not get a dispatch confirmed). A member takes over
both streams, rebuilds the scheduler from the replicated system stream and the
dispatcher's producer sequence in its log, and delivers the rest.

Oracle: every confirmed scheduled message appended to the stream exactly once, none
before its due time (chunk timestamp >= due); the system stream's leader follows the
stream's."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import signal
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
from rstream import AMQPMessage, Producer

from tests.cluster.nodes import (
    HOST,
    TTL,
    Cluster,
    Node,
    admin_json,
    create_replicated,
    running_cluster,
    wait_for,
)
from tests.delayed.test_process import QUIET, body_of, consume_all
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer
from tierlog.server.delayed_intake import system_stream_name

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "reminders"
SYSTEM = system_stream_name(STREAM)
ARGS = {"x-initial-cluster-size": "3", "x-tierlog-delayed": "true"}
MESSAGES = 300

register_crash_point(
    CrashPoint(
        "delayed-cluster-leader-sigkill",
        "the leader of a delayed stream with three voters is SIGKILLed while scheduled"
        " messages are due; a member takes over the stream, its system stream and the"
        " scheduler",
    )
)
register_crash_point(
    CrashPoint(
        "delayed-cluster-leader-paused",
        "the leader of a delayed stream is SIGSTOPped past its lease while scheduled messages"
        " are due, a member takes over, the old leader wakes with dispatch rounds due",
    )
)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def scheduler_running(node: Node) -> bool:
    with contextlib.suppress(OSError, ValueError, urllib.error.HTTPError):
        status = admin_json(node, f"/api/streams/{STREAM}/delayed")
        return isinstance(status, dict) and "scheduled" in status
    return False


async def create(cluster: Cluster) -> None:
    await create_replicated(cluster, STREAM, ARGS)


async def publish(node: Node, messages: dict[int, tuple[bytes, int]]) -> set[int]:
    confirmed: set[int] = set()

    async def on_confirm(status: object) -> None:
        if getattr(status, "is_confirmed", False):
            confirmed.add(status.message_id)  # type: ignore[attr-defined]

    port = node.process.stream_port
    async with Producer(HOST, port=port, username="guest", password="guest") as p:
        batch = []
        for pid, (body, due) in sorted(messages.items()):
            message = AMQPMessage(body=body, application_properties={"x-deliver-at": due})
            message.publishing_id = pid
            batch.append(message)
        for k in range(0, len(batch), 100):
            await p.send_batch(
                STREAM, batch[k : k + 100], publisher_name="app", on_publish_confirm=on_confirm
            )
        for _ in range(200):
            if len(confirmed) >= len(messages):
                break
            await asyncio.sleep(0.05)
    return confirmed


@pytest.mark.parametrize("fault", ["sigkill", "sigstop"])
async def test_leader_lost_while_messages_are_due(cluster: Cluster, fault: str) -> None:
    """SIGKILL: the leader dies. SIGSTOP: the leader sleeps past its lease while a
    member takes over, then wakes with its scheduler's rounds due at once: its
    dispatches must fail at its confirm gate, and it rejoins as a member."""
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    await create(cluster)
    n1 = cluster.node("n1")
    await wait_for(lambda: scheduler_running(n1), 3 * TTL, "the scheduler runs on n1")
    assert cluster.members_of(STREAM) == ("n1", "n2", "n3")
    assert cluster.members_of(SYSTEM) == ("n1", "n2", "n3"), "system stream: same voters"
    assert cluster.leader_of(SYSTEM)[0] == "n1"

    start = int(time.time() * 1000)
    messages = {
        pid: (f"msg-{pid:05d}".encode(), start + 1500 + rng.randint(0, 6000))
        for pid in range(1, MESSAGES + 1)
    }
    confirmed = await asyncio.wait_for(publish(n1, messages), 20)
    assert confirmed == set(messages), f"seed {seed}: {len(confirmed)} confirmed"

    await asyncio.sleep(rng.uniform(1.5, 5.0))  # some delivered, some due, some later
    _, epoch = cluster.leader_of(STREAM)
    killed_at = time.time()
    if fault == "sigkill":
        n1.process.kill()
    else:
        os.kill(n1.pid, signal.SIGSTOP)

    def both_taken_over() -> bool:
        leader, now = cluster.leader_of(STREAM)
        return leader in ("n2", "n3") and now > epoch and cluster.leader_of(SYSTEM)[0] == leader

    await wait_for(both_taken_over, 6 * TTL, "a member leads the stream and its system stream")
    leader, _ = cluster.leader_of(STREAM)
    assert leader is not None
    new = cluster.node(leader)
    await wait_for(lambda: scheduler_running(new), 3 * TTL, f"the scheduler runs on {leader}")
    taken_over_at = time.time()
    if fault == "sigstop":
        os.kill(n1.pid, signal.SIGCONT)
        await wait_for(
            lambda: bool(n1.log_events("cluster_stream_step_down")),
            3 * TTL,
            "the woken leader steps down",
        )

    last_due = max(due for _b, due in messages.values())
    await asyncio.sleep(max(0.0, (last_due - time.time() * 1000 + 1500) / 1000))
    got = await consume_all(new.process, STREAM, MESSAGES, timeout=6, quiet=QUIET)

    due_of = {body: due for body, due in messages.values()}
    counts = collections.Counter(body_of(raw) for _ts, raw in got)
    missing = set(due_of) - set(counts)
    assert not missing, f"seed {seed}: {len(missing)} missing"
    assert max(counts.values()) == 1, f"seed {seed}: appended twice"
    early = [
        (body_of(raw), due_of[body_of(raw)] - ts) for ts, raw in got if ts < due_of[body_of(raw)]
    ]
    assert not early, f"seed {seed}: appended early {early[:5]}"
    late = sorted(ts - due_of[body_of(raw)] for ts, raw in got)
    print(
        f"{fault} seed {seed}: {len(got)} delivered once, leader lost"
        f" {killed_at * 1000 - start:.0f} ms after publishing,"
        f" takeover {taken_over_at - killed_at:.1f} s, max lateness {late[-1]} ms"
    )
