"""The long randomized cluster fault campaign on a stream of three members: three
``tierlog serve`` nodes with replication (each reaching etcd and taking replication
links through its own TCP proxy), one stream created with ``x-initial-cluster-size = 3``
whose segments roll every 64 KiB, an ``rstream`` named producer publishing throughout,
and one fault per cycle:

* ``kill-leader``: the stream's leader is SIGKILLed; another member takes over in a
  higher epoch; the old leader is restarted and rejoins as a member.
* ``pause-leader``: the leader is SIGSTOPped past its lease until another member took
  over, then woken: it must commit no manifest in its old epoch after waking.
* ``cut-leader-from-etcd``: the leader loses etcd but still reaches its members; it must
  confirm nothing after its lease deadline; another member takes over.
* ``cut-replication``: every replication proxy is cut (each node alone; the leader keeps
  its etcd lease): no side holds a majority, so nothing is confirmed after the cut
  (beyond confirms already in flight) until healed.
* ``isolate-leader``: the leader's replication links are cut both ways by the proxies
  that know each link's dialer (it keeps etcd, its peers still reach each other): the
  leader, alone, must confirm nothing after the cut (beyond confirms in flight) until
  the majority side elected a new leader.
* ``kill-follower``: a member that does not lead is SIGKILLed and restarted; it catches up.
* ``remove-and-add``: a voter that does not lead is removed through the admin API (the
  replication factor shrinks), then added back (a learner, promoted once caught up).
* ``retire-node``: a random node (possibly the leader, which then hands the stream over)
  is retired until it holds nothing and released its lease; the retirement is withdrawn,
  the node restarted, and the leader adds it back as a learner to restore the factor.

After every cycle the campaign waits for a leader with three voters and the oracle runs:
every confirmed message read back exactly once, in order, through the leader and on
every member (a consumer pinned to that node); every member's segment and index files
byte-identical to the leader's for the range both hold; at the end, the manifest pointer
never went back, and no confirm (and no manifest commit in the old epoch) while the old
leader could have been deposed.

Used by ``scripts/cluster_nodes_campaign.py --members 3`` and, bounded, by
``tests/cluster/test_nodes_campaign.py``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.nodes import (
    DRIFT,
    STREAM_ARGS,
    TTL,
    Cluster,
    Node,
    PointerWatch,
    Publisher,
    admin_call,
    create_replicated,
    log_time,
    oracle,
    read_stream,
    wait_for,
)
from tests.cluster.nodes_campaign import NodesCampaignResult
from tests.plugins.seaweed import SeaweedServer
from tierlog.cluster.membership import ClusterDirectory

STREAM = "campaign3"
ARGS = {**STREAM_ARGS, "x-initial-cluster-size": "3"}
FAULTS = (
    "kill-leader",
    "pause-leader",
    "cut-leader-from-etcd",
    "cut-replication",
    "isolate-leader",
    "kill-follower",
    "remove-and-add",
    "retire-node",
)
NAMES = ("n1", "n2", "n3")
# confirms whose majority was heard just before a cut may land a little after it
IN_FLIGHT_SECONDS = 1.0


@dataclass
class Deposed:
    """No confirm (from anyone) between ``start`` and ``end``, and no manifest commit in
    ``epoch`` after ``commits_after`` (wall-clock times of the test process)."""

    fault: str
    epoch: int
    start: float
    end: float
    commits_after: float


@dataclass
class _Run:
    cluster: Cluster
    publisher: Publisher
    watch: PointerWatch
    rng: random.Random
    result: NodesCampaignResult
    deposed: list[Deposed] = field(default_factory=list)


async def run_replicated_campaign(
    workdir: Path,
    etcd_endpoint: str,
    s3: SeaweedServer,
    cycles: int,
    seed: int,
    faults: tuple[str, ...] = FAULTS,
    in_order: bool = False,
    progress: Callable[[str], None] | None = None,
) -> NodesCampaignResult:
    """``cycles`` faults: rounds of ``faults`` shuffled by ``seed`` (taken in turn when
    ``in_order``); the counts and the problems found (the campaign stops at the first
    cycle with a problem and leaves the cluster as it was for the logs)."""
    rng = random.Random(seed)
    schedule = _schedule(rng, faults, cycles, in_order)
    result = NodesCampaignResult(faults={f: 0 for f in faults})
    started = time.monotonic()
    cluster = Cluster(
        workdir,
        etcd_endpoint,
        s3,
        proxied_etcd=True,
        replicated=True,
        proxied_replication=True,
    ).start()
    watch: PointerWatch | None = None
    try:
        await create_replicated(cluster, STREAM, ARGS)
        watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
        run = _Run(cluster, Publisher(cluster, STREAM), watch, rng, result)
        for cycle, fault in enumerate(schedule):
            where = f"cycle {cycle + 1} ({fault})"
            await _publish_for(run.publisher, rng.uniform(0.3, 1.5))
            result.faults[fault] += 1
            result.cycles += 1
            try:
                await _FAULT_STEPS[fault](run)
            except Exception as exc:  # a fault that did not play out is a finding too
                result.problems.append(f"{where}: {exc!r}")
                break
            problems = await check_cycle(run, where)
            if progress is not None:
                progress(
                    f"{where}: confirmed {len(run.publisher.confirmed)}, epoch"
                    f" {cluster.leader_of(STREAM)[1]}, problems {problems or 'none'}"
                )
            result.problems += problems
            if problems:
                break  # keep the cluster as it failed: the logs say why
        if not result.problems:
            result.problems += await check_cycle(run, "end", more=100)
        watch.stop()
        result.problems += watch.regressions()
        result.problems += deposed_problems(run)
        result.confirmed = len(run.publisher.confirmed)
        result.refused_publishes = run.publisher.refused
        result.publisher_sessions = run.publisher.sessions
        result.epochs = cluster.leader_of(STREAM)[1]
        result.pointer_samples = len(watch.samples)
    finally:
        if watch is not None:
            watch.stop()
        cluster.close()
    result.seconds = time.monotonic() - started
    return result


def _schedule(
    rng: random.Random, faults: tuple[str, ...], cycles: int, in_order: bool
) -> list[str]:
    """Rounds of every fault once (shuffled, unless ``in_order``), cut to ``cycles``: a
    long run meets every kind about as often."""
    out: list[str] = []
    while len(out) < cycles:
        round_ = list(faults)
        if not in_order:
            rng.shuffle(round_)
        out += round_
    return out[:cycles]


# -- the oracle ---------------------------------------------------------------------------


async def check_cycle(run: _Run, where: str, more: int = 20) -> list[str]:
    """Publish ``more`` confirmed messages (the stream works again), wait for a leader
    with three voters and no learner, read everything back through it (Metadata's
    choice) and through every member itself, and compare every member's files with the
    leader's; the problems found, prefixed with ``where``."""
    cluster, publisher = run.cluster, run.publisher
    try:
        total = len(publisher.confirmed) + more
        await asyncio.wait_for(publisher.run(lambda: False, limit=total), 120)
        await wait_for(lambda: _settled(cluster), 12 * TTL, "a leader with three voters")
        leader, _ = cluster.leader_of(STREAM)
        assert leader is not None
        read = await read_stream(
            cluster.node(leader).process.stream_port, STREAM, len(publisher.confirmed), timeout=120
        )
    except (AssertionError, TimeoutError) as exc:
        return [f"{where}: {exc!r}"]
    run.result.read_back = len(read)
    problems = oracle(publisher.confirmed, read)
    for member in cluster.members_of(STREAM):  # each member serves consumers itself
        try:
            mine = await read_stream(
                cluster.node(member).process.stream_port,
                STREAM,
                len(publisher.confirmed),
                timeout=60,
                pinned=True,
            )
        except Exception as exc:
            problems.append(f"reading on {member}: {exc!r}{_why_refused(cluster.node(member))}")
            continue
        run.result.member_reads += 1
        problems += [f"read on {member}: {p}" for p in oracle(publisher.confirmed, mine)]
    deadline = time.monotonic() + 6 * TTL
    while True:
        leader, _ = cluster.leader_of(STREAM)
        differences = (
            [f"no leader {leader}"]
            if leader is None
            else [
                d
                for member in cluster.members_of(STREAM)
                if member != leader
                for d in file_differences(cluster, leader, member)
            ]
        )
        if not differences or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    return [f"{where}: {p}" for p in problems + differences]


def _why_refused(node: Node) -> str:
    """The node's last logged reason for refusing a Subscribe (empty if none): a failed
    member read says why the member did not serve."""
    lines = node.log_events("subscribe_refused_member") + node.log_events(
        "subscribe_refused_not_available"
    )
    if not lines:
        return ""
    last = max(lines, key=lambda fields: fields["ts"])
    fields = {k: v for k, v in last.items() if k in ("ts", "event", "reason", "opening", "error")}
    return f" (last refusal: {fields})"


def _settled(cluster: Cluster) -> bool:
    record = ClusterDirectory(cluster.meta).require_stream(cluster.incarnation(STREAM))
    return (
        record.leader is not None
        and len(record.membership.voters) == 3
        and not record.membership.learners
        and all(cluster.node(n).process.alive() for n in record.membership.voters)
    )


def file_differences(cluster: Cluster, leader: str, member: str) -> list[str]:
    """How ``member``'s segment and index files differ from the leader's over the range
    both hold: from the later of the two first files on (the leader may have dropped
    tiered segments; a member that joined late starts at one of the leader's segments),
    every file must be on both and byte-identical."""
    try:
        theirs = cluster.stream_files(leader, STREAM)
        mine = cluster.stream_files(member, STREAM)
    except FileNotFoundError as exc:
        return [f"{member}: no stream directory ({exc.filename})"]
    if not mine or not theirs:
        return [f"{member}: {len(mine)} files, leader {leader}: {len(theirs)}"]
    first = max(min(mine), min(theirs))
    names = sorted(n for n in set(mine) | set(theirs) if n >= first)
    out = []
    for name in names:
        if name not in mine or name not in theirs:
            where = member if name not in mine else leader
            out.append(f"{name} missing on {where} (leader {leader}, member {member})")
        elif mine[name] != theirs[name]:
            out.append(
                f"{name} differs: {member} {len(mine[name])} bytes,"
                f" leader {leader} {len(theirs[name])} bytes"
            )
    return out


def deposed_problems(run: _Run) -> list[str]:
    out = []
    for window in run.deposed:
        late = [i for i, t in run.publisher.confirm_times.items() if window.start < t < window.end]
        if late:
            out.append(
                f"{window.fault}: {len(late)} confirms while the epoch-{window.epoch}"
                f" leader could be deposed ({window.start:.3f}..{window.end:.3f}),"
                f" first id {min(late)}"
            )
        commits = run.watch.commits_in_epoch_after(window.epoch, window.commits_after)
        if commits:
            out.append(
                f"{window.fault}: manifest commits in epoch {window.epoch} after"
                f" {window.start:.3f}: {commits[:3]}"
            )
    return out


# -- the faults ---------------------------------------------------------------------------


def _leader(run: _Run) -> tuple[Node, int]:
    name, epoch = run.cluster.leader_of(STREAM)
    assert name is not None
    return run.cluster.node(name), epoch


async def _taken_over(run: _Run, old: str, epoch: int) -> tuple[str, float]:
    """Publish until another member leads in a higher epoch; its name and the wall time
    its election ended (its ``cluster_stream_leading`` log line)."""

    def taken() -> bool:
        leader, now = run.cluster.leader_of(STREAM)
        return leader is not None and leader != old and now > epoch

    await asyncio.wait_for(run.publisher.run(taken), 12 * TTL)
    await wait_for(taken, 12 * TTL, f"a member other than {old} takes over")
    leader, _ = run.cluster.leader_of(STREAM)
    assert leader is not None
    leading = [
        e
        for e in run.cluster.node(leader).log_events("cluster_stream_leading")
        if int(e["epoch"]) > epoch
    ]
    return leader, log_time(leading[0]) if leading else time.time()


async def kill_leader(run: _Run) -> None:
    node, epoch = _leader(run)
    node.process.kill()
    await _taken_over(run, node.name, epoch)
    await _publish_for(run.publisher, run.rng.uniform(0.0, TTL))
    node.process.start()


async def pause_leader(run: _Run) -> None:
    node, epoch = _leader(run)
    os.kill(node.pid, signal.SIGSTOP)
    try:
        await _publish_for(run.publisher, TTL + run.rng.uniform(0.5, 2.0))
        await _taken_over(run, node.name, epoch)
    finally:
        woke = time.time()
        os.kill(node.pid, signal.SIGCONT)
    # the woken leader's pending confirms go to connections the producer dropped; what
    # it must not do is commit a manifest in its old epoch
    run.deposed.append(Deposed("pause-leader", epoch, woke, woke, commits_after=woke))


async def cut_leader_from_etcd(run: _Run) -> None:
    node, epoch = _leader(run)
    proxy = node.etcd_proxy
    assert proxy is not None
    cut = time.time()
    proxy.cut()
    try:
        _, taken_at = await _taken_over(run, node.name, epoch)
    finally:
        proxy.heal()
    # its lease was renewed at the cut at the latest; confirms after the take-over come
    # from the new leader
    deadline = cut + TTL - DRIFT + 0.5
    run.deposed.append(Deposed("cut-leader-from-etcd", epoch, deadline, taken_at, deadline))


async def cut_replication(run: _Run) -> None:
    _, epoch = _leader(run)
    proxies = [n.replication_proxy for n in run.cluster.nodes.values()]
    cut = time.time()
    for proxy in proxies:
        assert proxy is not None
        proxy.cut()
    try:
        await _publish_for(run.publisher, TTL + run.rng.uniform(1.0, 3.0))
    finally:
        healed = time.time()
        for proxy in proxies:
            assert proxy is not None
            proxy.heal()
    # no side holds a majority: nobody may confirm, in any epoch (the leader may still
    # commit manifests of chunks committed before the cut: no manifest check)
    run.deposed.append(
        Deposed("cut-replication", epoch, cut + IN_FLIGHT_SECONDS, healed, float("inf"))
    )


async def isolate_leader(run: _Run) -> None:
    node, epoch = _leader(run)
    cut = time.time()
    for peer in run.cluster.nodes.values():  # its links both ways, whoever dialed
        assert peer.replication_proxy is not None
        if peer is node:
            peer.replication_proxy.cut()
        else:
            peer.replication_proxy.cut_from(node.name)
    try:
        _, taken_at = await _taken_over(run, node.name, epoch)
    finally:
        for peer in run.cluster.nodes.values():
            assert peer.replication_proxy is not None
            peer.replication_proxy.heal()
            peer.replication_proxy.heal_from(node.name)
    # the leader alone hears no acks: nothing confirmed from the cut (beyond confirms in
    # flight) until the majority side elected its leader; once it did, the old epoch is
    # fenced on the manifest pointer
    run.deposed.append(
        Deposed("isolate-leader", epoch, cut + IN_FLIGHT_SECONDS, taken_at, taken_at)
    )


async def kill_follower(run: _Run) -> None:
    leader, _ = _leader(run)
    others = [m for m in run.cluster.members_of(STREAM) if m != leader.name]
    node = run.cluster.node(run.rng.choice(others))
    node.process.kill()
    await _publish_for(run.publisher, run.rng.uniform(0.5, 2.0))
    node.process.start()


async def _change(run: _Run, action: str, member: str) -> None:
    """Ask for a member change (through a random live node: forwarded to the leader),
    publishing between attempts while the leader refuses it for now."""
    deadline = time.monotonic() + 12 * TTL
    while True:
        via = run.rng.choice(run.cluster.live())
        try:
            status, answer = admin_call(
                via, "POST", f"/api/streams/{STREAM}/members", {action: member}
            )
        except OSError as exc:
            status, answer = 0, repr(exc)
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{action} {member}: {status} {answer}")
        await _publish_for(run.publisher, 0.5)


def _record(run: _Run) -> tuple[tuple[str, ...], tuple[str, ...]]:
    record = ClusterDirectory(run.cluster.meta).require_stream(run.cluster.incarnation(STREAM))
    return record.membership.voters, record.membership.learners


async def _publish_until(run: _Run, done: object, timeout: float, what: str) -> None:
    assert callable(done)
    await asyncio.wait_for(run.publisher.run(done), timeout)
    await wait_for(done, timeout, what)


async def remove_and_add(run: _Run) -> None:
    leader, _ = _leader(run)
    member = run.rng.choice([m for m in _record(run)[0] if m != leader.name])
    await _change(run, "remove", member)
    await _publish_until(
        run, lambda: member not in run.cluster.members_of(STREAM), 6 * TTL, f"{member} removed"
    )
    await _publish_for(run.publisher, run.rng.uniform(0.5, 2.0))
    await _change(run, "add", member)

    def promoted() -> bool:
        voters, learners = _record(run)
        return member in voters and not learners

    await _publish_until(run, promoted, 12 * TTL, f"{member} added back and promoted")


def _retired(run: _Run, node: str) -> bool:
    for via in run.cluster.live():
        if via.name == node:
            continue
        try:
            status, answer = admin_call(via, "GET", f"/api/nodes/{node}")
        except OSError:
            continue
        return status == 200 and bool(answer["retired"])
    return False


async def retire_node(run: _Run) -> None:
    name = run.rng.choice(NAMES)
    via = run.cluster.node(run.rng.choice([n for n in NAMES if n != name]))
    status, answer = admin_call(via, "POST", f"/api/nodes/{name}/retire", {})
    assert status == 202, (status, answer)
    await _publish_until(run, lambda: _retired(run, name), 24 * TTL, f"{name} retired")
    status, answer = admin_call(via, "DELETE", f"/api/nodes/{name}/retire")
    assert status == 200 and answer["restart"] is True, (status, answer)
    node = run.cluster.node(name)
    try:
        node.process.stop()
    except RuntimeError:
        node.process.kill()
    node.process.start()

    def restored() -> bool:
        voters, learners = _record(run)
        return name in voters and len(voters) == 3 and not learners

    await _publish_until(run, restored, 12 * TTL, f"{name} rejoined as a voter")


_FAULT_STEPS = {
    "kill-leader": kill_leader,
    "pause-leader": pause_leader,
    "cut-leader-from-etcd": cut_leader_from_etcd,
    "cut-replication": cut_replication,
    "isolate-leader": isolate_leader,
    "kill-follower": kill_follower,
    "remove-and-add": remove_and_add,
    "retire-node": retire_node,
}


async def _publish_for(publisher: Publisher, seconds: float) -> None:
    end = time.monotonic() + seconds
    await asyncio.wait_for(publisher.run(lambda: time.monotonic() > end), seconds + 30)
