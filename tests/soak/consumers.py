"""The soak's consumers, as the consumer user: each follows one stream pinned to one node
of its role (the stream's leader, a member that does not lead, or a node that is not a
member and serves it from the remote tier plus the leader's tail), stores its offset every
second and, every few seconds and whenever the node ends the subscription, closes and
resumes after the offset it stored, as an application does. ``read_all`` is the final
whole-stream read through one node.

What a consumer checks as it goes: a redelivered offset carries the id it carried before
(every node and session agrees on what each offset holds); new offsets bring increasing
ids; a stored offset, once QueryOffset answered it, is never answered lower again."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rstream import ConsumerOffsetSpecification, OffsetType
from rstream.consumer import MessageContext
from rstream.exceptions import OffsetNotFound, StreamNotAvailable

from tests.cluster.nodes import HOST, Cluster, PinnedConsumer
from tests.soak.streams import StreamSpec
from tests.soak.world import CONSUMER

ROLES = ("leader", "member", "non-member")


def id_of_raw(data: bytes) -> int:
    """The id in a soak body (``msg-%08d-``), also inside an AMQP-encoded message."""
    at = data.find(b"msg-")
    return int(data[at + 4 : at + 12])


@dataclass
class Delivery:
    offset: int
    id: int
    timestamp_ms: int


@dataclass
class SoakConsumer:
    cluster: Cluster
    spec: StreamSpec
    role: str
    rng: random.Random
    restart_s: float
    deliveries: list[Delivery] = field(default_factory=list)  # new offsets, in order
    by_offset: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    sessions: int = 0
    resumes_checked: int = 0
    nodes_used: set[str] = field(default_factory=set)
    next_offset: int | None = None
    acknowledged: int | None = None  # the highest stored offset QueryOffset answered
    stored: int | None = None
    acknowledged_at: float = 0.0
    acknowledged_on: str = ""

    @property
    def reference(self) -> str:
        return f"consumer-{self.spec.name}-{self.role}"

    def _node(self) -> str | None:
        try:
            leader, _ = self.cluster.leader_of(self.spec.name)
            members = self.cluster.members_of(self.spec.name)
        except Exception:
            return None
        live = {n.name for n in self.cluster.live()}
        if self.role == "leader":
            choice = [leader] if leader else []
        elif self.role == "member":
            choice = [m for m in members if m != leader]
        else:
            choice = [n for n in self.cluster.nodes if n not in members]
        choice = [n for n in choice if n in live] or sorted(live)
        return self.rng.choice(choice) if choice else None

    def _on_message(self, msg: Any, ctx: MessageContext) -> None:
        offset, ident = ctx.offset, id_of_raw(bytes(msg))
        if self.next_offset is not None and offset < self.next_offset:
            known = self.by_offset.get(offset)
            if known is not None and known != ident:
                self.problems.append(f"offset {offset} held id {known}, now {ident}")
            return
        if self.deliveries and not self.spec.delayed and ident <= self.deliveries[-1].id:
            self.problems.append(f"id {ident} at offset {offset} after {self.deliveries[-1].id}")
        self.by_offset[offset] = ident
        self.deliveries.append(Delivery(offset, ident, ctx.timestamp))
        self.next_offset = offset + 1

    async def run(self, stop: Callable[[], bool]) -> None:
        while not stop():
            name = self._node()
            if name is None:
                await asyncio.sleep(0.5)
                continue
            self.sessions += 1
            self.nodes_used.add(name)
            with contextlib.suppress(Exception):
                await self._session(name, stop)
            await asyncio.sleep(0.2)

    async def _session(self, name: str, stop: Callable[[], bool]) -> None:
        gone = asyncio.Event()
        consumer = PinnedConsumer(
            HOST,
            port=self.cluster.node(name).process.stream_port,
            username=CONSUMER[0],
            password=CONSUMER[1],
            heartbeat=0,
            on_close_handler=lambda info, gone=gone: gone.set(),  # type: ignore[misc]
        )
        try:
            await asyncio.wait_for(consumer.start(), 10)
            answered = await self._query(consumer)
            if self.acknowledged is not None:
                self.resumes_checked += 1
                if answered is None or answered < self.acknowledged:
                    self.problems.append(
                        f"stored offset went back on {name}: {answered} < {self.acknowledged}"
                        f" (at={time.time():.1f}, acknowledged at={self.acknowledged_at:.1f}"
                        f" on {self.acknowledged_on})"
                    )
            spec = (
                ConsumerOffsetSpecification(OffsetType.FIRST)
                if answered is None
                else ConsumerOffsetSpecification(OffsetType.OFFSET, answered + 1)
            )
            deadline = time.monotonic() + 15
            while True:
                try:
                    await asyncio.wait_for(
                        consumer.subscribe(
                            self.spec.name, self._on_message, offset_specification=spec
                        ),
                        10,
                    )
                    break
                except StreamNotAvailable:
                    if time.monotonic() > deadline or stop():
                        return
                    await asyncio.sleep(0.5)
            until = time.monotonic() + self.restart_s * self.rng.uniform(0.5, 1.5)
            while not stop() and not gone.is_set() and time.monotonic() < until:
                await asyncio.sleep(1.0)
                await self._store(consumer)
            await self._store(consumer, name, confirm=True)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.close(), 3)

    async def _query(self, consumer: PinnedConsumer) -> int | None:
        try:
            return int(
                await asyncio.wait_for(consumer.query_offset(self.spec.name, self.reference), 10)
            )
        except OffsetNotFound:
            return None

    async def _store(self, consumer: PinnedConsumer, node: str = "", confirm: bool = False) -> None:
        if self.next_offset is None:
            return
        offset = self.next_offset - 1
        if offset != self.stored:
            await asyncio.wait_for(consumer.store_offset(self.spec.name, self.reference, offset), 5)
            self.stored = offset
        if confirm:  # the value a later resume must not go below, once the node answers it
            for _ in range(20):
                answered = await self._query(consumer)
                if answered is not None and answered >= offset:
                    self.acknowledged = max(self.acknowledged or -1, offset)
                    self.acknowledged_at = time.time()
                    self.acknowledged_on = node
                    return
                await asyncio.sleep(0.25)


async def read_all(
    cluster: Cluster, node: str, stream: str, at_least: int, timeout: float, through_id: int = 0
) -> list[Delivery]:
    """Every message of ``stream`` read through ``node`` itself from the first offset, as
    the consumer user: until ``at_least`` arrived, an id of at least ``through_id`` was
    read (a retained stream, whose start is gone, still ends with its last confirmed
    message) and the stream was quiet for 2 s."""
    got: list[Delivery] = []
    last = [time.monotonic()]

    def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append(Delivery(ctx.offset, id_of_raw(bytes(msg)), ctx.timestamp))
        last[0] = time.monotonic()

    deadline = time.monotonic() + timeout
    while True:
        consumer = PinnedConsumer(
            HOST,
            port=cluster.node(node).process.stream_port,
            username=CONSUMER[0],
            password=CONSUMER[1],
            heartbeat=0,
        )
        await asyncio.wait_for(consumer.start(), 10)
        try:
            await consumer.subscribe(
                stream,
                on_message,
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                initial_credit=50,
            )
            break
        except StreamNotAvailable:
            await consumer.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    try:
        last[0] = time.monotonic()
        while time.monotonic() < deadline:
            reached = through_id <= 0 or (got and max(d.id for d in got) >= through_id)
            if len(got) >= at_least and reached and time.monotonic() - last[0] > 2.0:
                break
            await asyncio.sleep(0.2)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer.close(), 3)
    return got
