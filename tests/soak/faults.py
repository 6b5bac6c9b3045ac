"""The soak's faults, one coroutine per kind: each injects its fault, waits for what the
cluster must do about it (a take-over, a retirement) and heals it; ``FaultRecord`` keeps
what happened for the per-fault table. Failures to play out are findings, kept in the
record, never raised past the run."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rstream import ConsumerOffsetSpecification, OffsetType, Producer
from rstream.consumer import Consumer, MessageContext
from rstream.producer import ConfirmationStatus
from rstream.utils import RawMessage

from tests.cluster.nodes import HOST, TTL, Node, admin_call, body, wait_for
from tests.soak.consumers import id_of_raw
from tests.soak.profile import Profile
from tests.soak.resources import ResourceSampler
from tests.soak.streams import BASE_ARGS, StreamSpec
from tests.soak.world import CHURN, NAMES, S3_FAULT_KINDS, SoakWorld
from tierlog.cluster.membership import ClusterDirectory


@dataclass
class FaultRecord:
    kind: str
    target: str = ""
    started: float = 0.0  # wall clock
    healed: float = 0.0
    catchup_s: float | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""


@dataclass
class FaultContext:
    world: SoakWorld
    specs: list[StreamSpec]
    sampler: ResourceSampler
    profile: Profile
    rng: random.Random
    churned: int = 0
    expected_down: set[str] = field(default_factory=set)  # nodes the harness stopped

    @property
    def cluster(self):  # type: ignore[no-untyped-def]
        return self.world.cluster

    def rf3(self) -> list[StreamSpec]:
        return [s for s in self.specs if s.replicas == 3]

    def leader_node(self) -> tuple[Node, int, str] | None:
        """The leader node of a random RF-3 stream, its epoch and the stream."""
        spec = self.rng.choice(self.rf3())
        leader, epoch = self.cluster.leader_of(spec.name)
        if leader is None:
            return None
        return self.cluster.node(leader), epoch, spec.name

    async def start_node(self, node: Node) -> None:
        """Start a stopped node (off the event loop: start-up waits for its streams)."""
        try:
            await asyncio.to_thread(node.process.start)
        except RuntimeError:
            await asyncio.sleep(2)
            await asyncio.to_thread(node.process.start)
        finally:
            self.expected_down.discard(node.name)

    def kill(self, node: Node) -> None:
        self.expected_down.add(node.name)
        node.process.kill()


async def _taken_over(ctx: FaultContext, stream: str, old: str, epoch: int) -> None:
    def taken() -> bool:
        leader, now = ctx.cluster.leader_of(stream)
        return leader is not None and leader != old and now > epoch

    await wait_for(taken, 12 * TTL, f"a member other than {old} takes {stream} over")


async def kill_leader(ctx: FaultContext, record: FaultRecord) -> None:
    found = ctx.leader_node()
    if found is None:
        record.skipped = "no leader"
        return
    node, epoch, stream = found
    record.target = f"{node.name} ({stream})"
    ctx.kill(node)
    try:
        await _taken_over(ctx, stream, node.name, epoch)
        await asyncio.sleep(ctx.rng.uniform(0.0, TTL))
    finally:
        await ctx.start_node(node)


async def pause_leader(ctx: FaultContext, record: FaultRecord) -> None:
    found = ctx.leader_node()
    if found is None:
        record.skipped = "no leader"
        return
    node, epoch, stream = found
    record.target = f"{node.name} ({stream})"
    os.kill(node.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(TTL + ctx.rng.uniform(1.0, 3.0))
        await _taken_over(ctx, stream, node.name, epoch)
    finally:
        os.kill(node.pid, signal.SIGCONT)


async def disk_full(ctx: FaultContext, record: FaultRecord) -> None:
    name = ctx.rng.choice(NAMES)
    mount = ctx.world.mounts[name]
    record.target = name
    try:
        filled = await asyncio.to_thread(mount.fill)
        record.notes.append(f"filler {filled >> 20} MiB")
        await asyncio.sleep(ctx.rng.uniform(*ctx.profile.hold_s))
    finally:
        mount.free_filler()
        ctx.sampler.exclude(name, record.started, time.time() + 5)


async def wipe_member(ctx: FaultContext, record: FaultRecord) -> None:
    single = {m for s in ctx.specs if s.replicas == 1 for m in ctx.cluster.members_of(s.name)}
    choices = [n for n in NAMES if n not in single]
    if not choices:
        record.skipped = "every node holds a one-copy stream (its data would go)"
        return
    node = ctx.cluster.node(ctx.rng.choice(choices))
    record.target = node.name
    ctx.kill(node)
    try:
        await asyncio.to_thread(ctx.world.mounts[node.name].wipe)
        await asyncio.sleep(ctx.rng.uniform(0.5, 2.0))
    finally:
        ctx.sampler.exclude(node.name, record.started, time.time() + 30)
        await ctx.start_node(node)


async def cut_replication(ctx: FaultContext, record: FaultRecord) -> None:
    node = ctx.cluster.node(ctx.rng.choice(NAMES))
    record.target = node.name
    peers = list(ctx.cluster.nodes.values())
    for peer in peers:
        assert peer.replication_proxy is not None
        if peer is node:
            peer.replication_proxy.cut()
        else:
            peer.replication_proxy.cut_from(node.name)
    try:
        await asyncio.sleep(TTL + ctx.rng.uniform(1.0, 4.0))
    finally:
        for peer in peers:
            assert peer.replication_proxy is not None
            peer.replication_proxy.heal()
            peer.replication_proxy.heal_from(node.name)


async def cut_etcd(ctx: FaultContext, record: FaultRecord) -> None:
    node = ctx.cluster.node(ctx.rng.choice(NAMES))
    record.target = node.name
    assert node.etcd_proxy is not None
    node.etcd_proxy.cut()
    try:
        await asyncio.sleep(TTL + ctx.rng.uniform(1.0, 4.0))
    finally:
        node.etcd_proxy.heal()


async def s3_outage(ctx: FaultContext, record: FaultRecord) -> None:
    proxy = ctx.world.proxy
    record.target = "bucket"
    proxy.configure(rate=1.0, kinds={"500": 1.0, "503": 1.0, "reset": 1.0})
    try:
        low, high = ctx.profile.hold_s
        await asyncio.sleep(ctx.rng.uniform(low, high + 2.0))
    finally:
        background = "s3-errors" in ctx.profile.faults
        proxy.configure(rate=ctx.profile.s3_error_rate if background else 0.0, kinds=S3_FAULT_KINDS)


def _retired(ctx: FaultContext, name: str) -> bool:
    for via in ctx.cluster.live():
        if via.name == name:
            continue
        try:
            status, answer = admin_call(via, "GET", f"/api/nodes/{name}")
        except OSError:
            continue
        return status == 200 and bool(answer["retired"])
    return False


def _full(ctx: FaultContext) -> bool:
    directory = ClusterDirectory(ctx.cluster.meta)
    for spec in ctx.rf3():
        record = directory.require_stream(ctx.cluster.incarnation(spec.name))
        if len(record.membership.voters) != 3 or record.membership.learners:
            return False
    return True


async def retire_node(ctx: FaultContext, record: FaultRecord) -> None:
    name = ctx.rng.choice(NAMES)
    via = ctx.cluster.node(ctx.rng.choice([n for n in NAMES if n != name]))
    record.target = name
    status, answer = await asyncio.to_thread(
        admin_call, via, "POST", f"/api/nodes/{name}/retire", {}
    )
    if status != 202:
        raise AssertionError(f"retire {name}: {status} {answer}")
    try:
        await wait_for(lambda: _retired(ctx, name), ctx.profile.retire_wait_s, f"{name} retired")
    finally:
        status, answer = await asyncio.to_thread(
            admin_call, via, "DELETE", f"/api/nodes/{name}/retire"
        )
        node = ctx.cluster.node(name)
        ctx.expected_down.add(name)
        try:
            await asyncio.to_thread(node.process.stop)
        except RuntimeError:
            node.process.kill()
        await ctx.start_node(node)
    if status != 200:
        raise AssertionError(f"withdraw the retirement of {name}: {status} {answer}")
    await wait_for(
        lambda: _full(ctx), ctx.profile.retire_wait_s, "every RF-3 stream has three voters again"
    )


async def churn(ctx: FaultContext, record: FaultRecord) -> None:
    ctx.churned += 1
    stream = f"soak-churn-{ctx.churned}"
    replicas = ctx.rng.choice((1, 3))
    record.target = f"{stream} (RF {replicas})"
    node = ctx.rng.choice(ctx.cluster.live())
    port = node.process.stream_port
    user, password = CHURN
    arguments = {**BASE_ARGS, "x-initial-cluster-size": str(replicas)}
    deadline = time.monotonic() + 3 * TTL
    while True:
        try:
            async with Producer(HOST, port=port, username=user, password=password) as p:
                await p.create_stream(stream, arguments=arguments)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    confirmed: set[int] = set()

    async def on_confirm(status: ConfirmationStatus) -> None:
        if status.is_confirmed:
            confirmed.add(status.message_id)

    count = 200
    async with Producer(HOST, port=port, username=user, password=password) as p:
        for first in range(1, count + 1, 50):
            messages = [RawMessage(body(i), publishing_id=i) for i in range(first, first + 50)]
            await p.send_batch(
                stream, messages, publisher_name="churn", on_publish_confirm=on_confirm
            )
        await wait_for(lambda: len(confirmed) == count, 30, f"{count} confirms on {stream}")
    got: list[int] = []

    def on_message(msg: object, ctx_: MessageContext) -> None:
        got.append(id_of_raw(bytes(msg)))  # type: ignore[call-overload]

    async with Consumer(HOST, port=port, username=user, password=password) as consumer:
        await consumer.subscribe(
            stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
        )
        await wait_for(lambda: len(got) >= count, 30, f"{count} messages read from {stream}")
    if got != list(range(1, count + 1)):
        record.problems.append(f"{stream}: read {len(got)} ids, not 1..{count} once in order")
    await asyncio.sleep(ctx.rng.uniform(0.5, 3.0))  # let some of it tier
    async with Producer(HOST, port=port, username=user, password=password) as p:
        await p.delete_stream(stream)


FAULT_STEPS: dict[str, Callable[[FaultContext, FaultRecord], Awaitable[None]]] = {
    "kill-leader": kill_leader,
    "pause-leader": pause_leader,
    "disk-full": disk_full,
    "wipe-member": wipe_member,
    "cut-replication": cut_replication,
    "cut-etcd": cut_etcd,
    "s3-outage": s3_outage,
    "retire-node": retire_node,
    "churn": churn,
}


def schedule(rng: random.Random, kinds: tuple[str, ...]) -> Callable[[], str]:
    """Rounds of every scheduled kind once, each round shuffled by the seed: a run meets
    every kind about as often."""
    queue: list[str] = []
    scheduled = [k for k in kinds if k in FAULT_STEPS]

    def next_kind() -> str:
        if not queue:
            queue.extend(scheduled)
            rng.shuffle(queue)
        return queue.pop(0)

    return next_kind
