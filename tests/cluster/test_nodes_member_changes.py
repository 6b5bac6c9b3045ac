"""Member changes and node retirement on three ``tierlog serve`` nodes (one etcd, one
SeaweedFS, lease TTL 5 s) while an ``rstream`` named producer publishes with confirms.

* A late joiner: a two-member stream whose segments roll every few chunks gets the
  third node through the admin API of the member that does not lead (forwarded to the
  leader); it joins as a learner under load, catches up from the leader's first local
  segment and is promoted; its segment and index files are byte-identical to the
  leader's for the same range.
* Retiring the leader node (``tierlog node retire``) under load, with a consumer that
  stored its offset: the spare node replaces it learner-first, tiering finishes up to
  the commit offset, the leadership is handed over, the retired node is removed,
  releases its lease and reports retired; the consumer resumes at its stored offset on
  the new leader.
* Faults: the leader is killed after adding a learner and before promoting it (the new
  leader finishes the change); the retiring node is killed mid-retirement and restarted
  (the retirement resumes).

Oracle: every confirmed message read back exactly once, in order; the manifest pointer
never goes back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import ConsumerOffsetSpecification, OffsetType
from rstream.consumer import Consumer, MessageContext

from tests.cluster.nodes import (
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    PointerWatch,
    Publisher,
    admin_call,
    create_replicated,
    id_of,
    oracle,
    read_stream,
    running_cluster,
    same_files_as_leader,
    subscribe_retrying,
    wait_for,
)
from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.seaweed import SeaweedServer
from tierlog.cluster.membership import ClusterDirectory

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "members"
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "2", "x-tierlog-max-segment-chunks": "4"}

register_crash_point(
    CrashPoint(
        "cluster-leader-killed-mid-member-change",
        "the leader of a stream is SIGKILLed after adding a learner and before promoting it:"
        " the next leader finishes the change",
    )
)
register_crash_point(
    CrashPoint(
        "cluster-retiring-node-killed",
        "a node being retired is SIGKILLed mid-retirement and restarted: the retirement resumes",
    )
)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def record(cluster: Cluster) -> Any:
    return ClusterDirectory(cluster.meta).require_stream(cluster.incarnation(STREAM))


async def start(cluster: Cluster) -> tuple[Publisher, PointerWatch]:
    await create_replicated(cluster, STREAM, ARGS)
    assert cluster.members_of(STREAM) == ("n1", "n2")
    assert cluster.leader_of(STREAM)[0] == "n1"
    watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 100), 60)
    return publisher, watch


async def finish(cluster: Cluster, publisher: Publisher, watch: PointerWatch) -> str:
    """Publish 100 more, then the oracle through the leader; the leader's name."""
    total = len(publisher.confirmed) + 100
    await asyncio.wait_for(publisher.run(lambda: False, limit=total), 90)
    leader, _ = cluster.leader_of(STREAM)
    assert leader is not None
    read = await read_stream(cluster.node(leader).process.stream_port, STREAM, total)
    watch.stop()
    assert oracle(publisher.confirmed, read) == []
    assert watch.regressions() == []
    return leader


async def publish_while(publisher: Publisher, done: Any, timeout: float) -> None:
    await asyncio.wait_for(publisher.run(done), timeout)
    await wait_for(done, timeout, "the change under load")


async def test_late_joiner_is_added_under_load_and_promoted(cluster: Cluster) -> None:
    publisher, watch = await start(cluster)
    # asked of the member that does not lead: forwarded to the leader
    status, answer = admin_call(
        cluster.node("n2"), "POST", f"/api/streams/{STREAM}/members", {"add": "n3"}
    )
    assert status == 200, answer
    assert answer["learners"] == ["n3"] and answer["replication_factor"] == 3
    status, again = admin_call(
        cluster.node("n1"), "POST", f"/api/streams/{STREAM}/members", {"add": "n2"}
    )
    assert status == 409, again  # one change at a time (and n2 is a member)
    status, bad = admin_call(cluster.node("n1"), "POST", f"/api/streams/{STREAM}/members", {})
    assert status == 400, bad

    def promoted() -> bool:
        r = record(cluster)
        return r.membership.voters == ("n1", "n2", "n3") and not r.membership.learners

    await publish_while(publisher, promoted, 6 * TTL)
    assert record(cluster).epoch == cluster.leader_of(STREAM)[1]
    _, runtime = admin_call(cluster.node("n1"), "GET", "/api/cluster")
    assert runtime["member_changes"] >= 1 and runtime["retiring"] is False
    leader = await finish(cluster, publisher, watch)
    assert leader == "n1"  # a member change, not a new election
    for member in ("n2", "n3"):
        await wait_for(
            lambda m=member: same_files_as_leader(cluster, STREAM, m),  # type: ignore[misc]
            6 * TTL,
            f"{member}'s files equal the leader's",
        )
    assert len(cluster.stream_files("n3", STREAM)) >= 4  # rolled segments too


async def subscribe_and_store(cluster: Cluster, upto: int) -> tuple[int, int]:
    """A consumer named ``reader`` reads ``upto`` messages and stores the offset of the
    last: that offset and the message's id."""
    got: list[tuple[int, int]] = []

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append((ctx.offset, id_of(bytes(msg))))

    consumer = Consumer(  # offsets are stored and queried through the leader
        HOST,
        port=cluster.node("n1").process.stream_port,
        username="guest",
        password="guest",
        heartbeat=0,
    )
    await consumer.start()
    try:
        await subscribe_retrying(
            consumer,
            STREAM,
            on_message,
            subscriber_name="reader",
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        await wait_for(lambda: len(got) >= upto, 3 * TTL, "the consumer reads")
        offset, message_id = got[upto - 1]
        await consumer.store_offset(STREAM, "reader", offset)
        await wait_for_offset(consumer, offset)
    finally:
        await consumer.close()
    return offset, message_id


async def wait_for_offset(consumer: Consumer, expected: int) -> None:
    for _ in range(100):
        try:
            if await consumer.query_offset(STREAM, "reader") == expected:
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    assert await consumer.query_offset(STREAM, "reader") == expected


async def resume_from_stored(cluster: Cluster, node: str) -> tuple[int, int]:
    """A consumer on ``node`` asks for its stored offset and resumes after it: the
    stored offset and the id of the first message it then reads."""
    first: list[int] = []

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        first.append(id_of(bytes(msg)))

    consumer = Consumer(
        HOST,
        port=cluster.node(node).process.stream_port,
        username="guest",
        password="guest",
        heartbeat=0,
    )
    await consumer.start()
    try:
        stored = await consumer.query_offset(STREAM, "reader")
        await subscribe_retrying(
            consumer,
            STREAM,
            on_message,
            subscriber_name="reader",
            offset_specification=ConsumerOffsetSpecification(OffsetType.OFFSET, stored + 1),
        )
        await wait_for(lambda: bool(first), 3 * TTL, "the consumer resumes")
    finally:
        await consumer.close()
    return stored, first[0]


def retire_with_cli(cluster: Cluster, node: str, via: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierlog",
            "node",
            "retire",
            node,
            "--wait",
            "--timeout",
            "90",
            "--admin",
            cluster.node(via).process.admin_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def retired(cluster: Cluster, node: str) -> bool:
    status, answer = admin_call(cluster.node("n2"), "GET", f"/api/nodes/{node}")
    return status == 200 and bool(answer["retired"])


async def test_retire_the_leader_node_under_load(cluster: Cluster) -> None:
    publisher, watch = await start(cluster)
    stored, stored_id = await subscribe_and_store(cluster, 60)
    cli = retire_with_cli(cluster, "n1", via="n3")

    await publish_while(publisher, lambda: retired(cluster, "n1"), 12 * TTL)
    out, err = cli.communicate(timeout=30)
    assert cli.returncode == 0, err.decode()
    assert b'"retired": true' in out
    r = record(cluster)
    assert r.membership.voters == ("n2", "n3") and not r.membership.learners
    assert r.replication_factor == 2
    directory = ClusterDirectory(cluster.meta)
    assert not directory.node_alive("n1")  # its node lease was released
    assert cluster.node("n1").process.alive()  # retiring does not stop the process
    leader = await finish(cluster, publisher, watch)
    assert leader in ("n2", "n3")
    # the replacement joined late, under load, across segment rolls: same files
    for member in ("n2", "n3"):
        if member != leader:
            await wait_for(
                lambda m=member: same_files_as_leader(cluster, STREAM, m),  # type: ignore[misc]
                6 * TTL,
                f"{member}'s files equal the leader's",
            )
    assert len(cluster.stream_files("n3", STREAM)) >= 4
    # the retired node led, and was handed over only once tiering reached the commit
    tiered = cluster.node("n1").log_events("cluster_retiring_tiered")
    assert tiered and all(e["tiered"] == "true" for e in tiered)
    # the consumer resumes where it stored its offset, on the new leader
    again, first = await resume_from_stored(cluster, leader)
    assert again == stored and first == stored_id + 1
    # a retired node is no candidate: creating a stream there is refused
    _, status = admin_call(cluster.node("n2"), "GET", "/api/nodes")
    assert {n["node"]: n["retired"] for n in status["nodes"]}["n1"] is True


async def test_leader_killed_between_adding_a_learner_and_promoting_it(
    cluster: Cluster,
) -> None:
    publisher, watch = await start(cluster)
    n3 = cluster.node("n3")
    os.kill(n3.pid, signal.SIGSTOP)  # the learner cannot catch up: no promotion yet
    try:
        status, answer = admin_call(
            cluster.node("n1"), "POST", f"/api/streams/{STREAM}/members", {"add": "n3"}
        )
        assert status == 200, answer
        await asyncio.sleep(0.5)
        assert record(cluster).membership.learners == ("n3",)
        _, epoch = cluster.leader_of(STREAM)
        cluster.node("n1").process.kill()
    finally:
        os.kill(n3.pid, signal.SIGCONT)
    cluster.node("n1").process.start()  # two voters: the stream needs both back

    def finished() -> bool:
        r = record(cluster)
        return r.epoch > epoch and r.membership.voters == ("n1", "n2", "n3")

    await publish_while(publisher, finished, 12 * TTL)
    await finish(cluster, publisher, watch)
    await wait_for(lambda: same_files_as_leader(cluster, STREAM, "n3"), 6 * TTL, "n3 caught up")


async def test_retiring_node_killed_mid_retirement_resumes_after_restart(
    cluster: Cluster,
) -> None:
    publisher, watch = await start(cluster)
    status, answer = admin_call(cluster.node("n2"), "POST", "/api/nodes/n1/retire", {})
    assert status == 202 and answer["retiring"] is True, answer

    def replacing() -> bool:
        return "n3" in record(cluster).membership.members

    await publish_while(publisher, replacing, 6 * TTL)
    cluster.node("n1").process.kill()
    assert not retired(cluster, "n1")
    led_before = len(cluster.node("n1").log_events("cluster_stream_leading"))
    cluster.node("n1").process.start()
    await publish_while(publisher, lambda: retired(cluster, "n1"), 12 * TTL)
    # restarted while retiring, it never led again: another voter took the stream over
    assert len(cluster.node("n1").log_events("cluster_stream_leading")) == led_before
    r = record(cluster)
    assert r.membership.voters == ("n2", "n3") and not r.membership.learners
    assert not ClusterDirectory(cluster.meta).node_alive("n1")
    await finish(cluster, publisher, watch)
