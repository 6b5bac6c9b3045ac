"""A named producer of the soak: publishes ids 1..n to one stream at its own rate as the
producer user, through whichever node is up (rstream follows Metadata to the leader), and
on any error or stall opens a new session and resends every id not confirmed yet (the
server deduplicates what it stored). On a delayed stream each message carries
``x-deliver-at`` a few seconds ahead, so messages fall due throughout the run."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rstream import AMQPMessage, Producer
from rstream.producer import ConfirmationStatus
from rstream.utils import RawMessage

from tests.cluster.nodes import HOST, Cluster, Node
from tests.soak.streams import StreamSpec
from tests.soak.world import PRODUCER

STALL_SECONDS = 15.0  # no confirm for this long: new session (load-tolerant, not hiding loss)
DELAY_MS = (1_000, 20_000)


@dataclass
class SoakProducer:
    cluster: Cluster
    spec: StreamSpec
    rng: random.Random
    confirmed: set[int] = field(default_factory=set)
    due_ms: dict[int, int] = field(default_factory=dict)  # delayed streams: id -> due
    refused: int = 0
    sessions: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    next_id: int = 1

    @property
    def reference(self) -> str:
        return f"producer-{self.spec.name}"

    async def run(self, stop: Callable[[], bool]) -> None:
        while not stop():
            live = self.cluster.live()
            if not live:
                await asyncio.sleep(0.3)
                continue
            self.sessions += 1
            node = live[self.sessions % len(live)]
            try:
                await self._session(node, stop)
            except Exception as exc:
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                await asyncio.sleep(0.5)

    def _message(self, i: int) -> Any:
        if not self.spec.delayed:
            return RawMessage(self.spec.body(i), publishing_id=i)
        due = self.due_ms.setdefault(i, int(time.time() * 1000) + self.rng.randint(*DELAY_MS))
        message = AMQPMessage(body=self.spec.body(i), application_properties={"x-deliver-at": due})
        message.publishing_id = i
        return message

    def _confirm_handler(
        self, waiting: set[int], progress: asyncio.Event
    ) -> Callable[[ConfirmationStatus], Awaitable[None]]:
        async def on_confirm(status: ConfirmationStatus) -> None:
            if status.is_confirmed:
                self.confirmed.add(status.message_id)
            else:
                self.refused += 1
            waiting.discard(status.message_id)
            if not waiting:
                progress.set()

        return on_confirm

    async def _session(self, node: Node, stop: Callable[[], bool]) -> None:
        producer = Producer(
            HOST,
            port=node.process.stream_port,
            username=PRODUCER[0],
            password=PRODUCER[1],
            heartbeat=0,
        )
        try:
            await asyncio.wait_for(producer.start(), 10)
            pending = [i for i in range(1, self.next_id) if i not in self.confirmed]
            while not stop():
                if not pending:
                    await asyncio.sleep(1.0 / self.spec.rate)
                    pending = list(range(self.next_id, self.next_id + self.spec.batch))
                    self.next_id += self.spec.batch
                waiting = set(pending)
                progress = asyncio.Event()
                on_confirm = self._confirm_handler(waiting, progress)
                await asyncio.wait_for(
                    producer.send_batch(
                        self.spec.name,
                        [self._message(i) for i in pending],
                        publisher_name=self.reference,
                        on_publish_confirm=on_confirm,
                    ),
                    STALL_SECONDS,
                )
                await asyncio.wait_for(progress.wait(), STALL_SECONDS)
                pending = [i for i in pending if i not in self.confirmed]
                if pending:
                    return  # refused: a new session (Metadata, the leader, resend)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.close(), 3)
