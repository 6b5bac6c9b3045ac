"""One consumer subscription: a cursor, credit, and the task that delivers chunks.

Credit is counted in chunks, as in RabbitMQ: each Deliver uses one credit; Credit
frames add more. The task reads the next chunk from its ``ChunkCursor`` while it has
credit, waits on the stream's commit notifier when caught up, and waits for the
socket to drain when the client reads slowly (no unbounded buffering).

Overtaken by retention: by default the client gets a MetadataUpdate for the stream
and the subscription ends (the protocol has no better frame); with the subscription
property ``x-tierlog-overtaken=skip`` it silently continues from the first available
offset, as RabbitMQ does. Both are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from tierlog.cluster.consumer_groups import GroupKey
from tierlog.formats.bloom import ChunkFilter
from tierlog.log.errors import CorruptChunkError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.server.chunk_source import ChunkCursor, ChunkSource, DeliverableChunk
from tierlog.server.errors import SourceClosedError, UnreadableDataError

log = get_logger("tierlog.server.subscriptions")

OVERTAKEN_PROPERTY = "x-tierlog-overtaken"
OVERTAKEN_ACTIONS = ("notify", "skip")
MAX_CREDIT = 0xFFFF * 16


DELIVER_BYTES_PER_TURN = 1 << 20
"""Chunk bytes all subscriptions of a node hand to sockets in one event-loop turn."""


class DeliveryTurns:
    """Paces deliveries: at most ``per_turn`` bytes are written per event-loop turn, node
    wide; later deliveries wait (in arrival order) for the following turns.

    A subscription with credit and chunks ready delivers without suspending, so a hundred
    cold readers could write hundreds of MiB in one turn while a publisher's frames and
    the writer's confirms wait for the loop to poll again. Between paced turns the loop
    polls its sockets, so a hot publisher waits for at most one turn's worth of writes.
    """

    def __init__(self, per_turn: int = DELIVER_BYTES_PER_TURN) -> None:
        self.per_turn = per_turn
        self.used = 0
        self._waiting: deque[tuple[asyncio.Future[None], int]] = deque()
        self._reset_armed = False
        self.deferred = 0  # deliveries that waited for a later turn

    async def take(self, n: int) -> None:
        """Return once ``n`` bytes may be written in this turn."""
        if self.used < self.per_turn and not self._waiting:
            self.used += n
            self._arm()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((future, n))
        self.deferred += 1
        self._arm()
        await future

    def _arm(self) -> None:
        if not self._reset_armed:
            self._reset_armed = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._reset_armed = False
        self.used = 0
        waiting = self._waiting
        while waiting and self.used < self.per_turn:
            future, n = waiting.popleft()
            if future.done():  # the waiting delivery was cancelled
                continue
            self.used += n
            future.set_result(None)
        if self.used or waiting:
            self._arm()


@dataclass(frozen=True, slots=True)
class SacMembership:
    """A single-active-consumer subscription's group, and its Subscribe's offset spec
    (a ConsumerUpdate answer of type 0 keeps it)."""

    group: GroupKey
    subscribe_spec: OffsetSpec


class _IdleCursor:
    """The cursor of a single active consumer that is not active: nothing to read."""

    next_offset = 0

    async def read(self) -> DeliverableChunk | None:
        return None

    async def wait(self, timeout: float | None = None) -> None:
        await asyncio.sleep(timeout if timeout is not None else 3600)

    def close(self) -> None:
        return None


_IDLE = _IdleCursor()


class DeliverySink(Protocol):
    """The connection side of a subscription."""

    async def deliver(self, subscription_id: int, chunk: DeliverableChunk) -> None: ...

    def subscription_overtaken(self, subscription: Subscription) -> None: ...

    def subscription_failed(self, subscription: Subscription, reason: str) -> None: ...


class Subscription:
    """A running subscription; ``start()`` launches its delivery task."""

    def __init__(
        self,
        subscription_id: int,
        stream_name: str,
        source: ChunkSource,
        spec: OffsetSpec,
        credit: int,
        sink: DeliverySink,
        metrics: Metrics,
        *,
        overtaken: str = "notify",
        want_file: bool = False,
        chunk_filter: ChunkFilter | None = None,
        sac: SacMembership | None = None,
    ) -> None:
        self.id = subscription_id
        self.stream_name = stream_name
        self.source = source
        self.spec = spec
        self.credit = credit
        self.overtaken_action = overtaken
        self._sink = sink
        self._metrics = metrics
        self._want_file = want_file
        self.chunk_filter = chunk_filter
        """``filter.N`` / ``match-unfiltered``: chunks ruled out are never read or sent (the
        client filters the records of the chunks it gets, as with RabbitMQ)."""
        self._credit_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._counted = False
        self.sac = sac
        self.cursor: ChunkCursor = (
            _IDLE
            if sac is not None
            else source.attach(spec, want_file=want_file, chunk_filter=chunk_filter)
        )
        self.delivering = sac is None
        self.delivered_chunks = 0

    def start(self) -> None:
        """Count the subscription; deliver unless it is a single active consumer, which
        delivers only once activated (``activate``)."""
        self._metrics.subscriptions.inc()
        self._counted = True
        if self.delivering:
            self._task = asyncio.create_task(self._run(), name=f"subscription-{self.id}")

    def activate(self, spec: OffsetSpec) -> None:
        """(Single active consumer) start delivering at ``spec``, the offset the client's
        ConsumerUpdate answer gave; raises what ``ChunkSource.attach`` raises."""
        if self.delivering or not self._counted:
            return
        self.cursor = self.source.attach(
            spec, want_file=self._want_file, chunk_filter=self.chunk_filter
        )
        self.spec = spec
        self.delivering = True
        self._task = asyncio.create_task(self._run(), name=f"subscription-{self.id}")

    def deactivate(self) -> None:
        """(Single active consumer) stop delivering at once, keep the subscription."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self.cursor.close()
        self.cursor = _IDLE
        self.delivering = False

    def add_credit(self, credit: int) -> None:
        self.credit = min(self.credit + credit, MAX_CREDIT)
        self._credit_event.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._uncount()
        self.cursor.close()

    def stop_nowait(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._uncount()
        self.cursor.close()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._metrics.subscriptions.dec()

    async def _run(self) -> None:
        metrics = self._metrics
        try:
            while True:
                while self.credit <= 0:
                    self._credit_event.clear()
                    await self._credit_event.wait()
                try:
                    chunk = await self.cursor.read()
                except OffsetOvertakenError as exc:
                    if not self._handle_overtaken(exc):
                        return
                    continue
                if chunk is None:
                    await self.cursor.wait()
                    continue
                self.credit -= 1
                await self._sink.deliver(self.id, chunk)
                self.delivered_chunks += 1
                metrics.delivered_chunks.inc()
                metrics.delivered_messages.inc(chunk.num_records)
                metrics.delivered_bytes.inc(chunk.wire_size)
        except UnreadableDataError as exc:
            metrics.unreadable_data.labels(kind=exc.kind).inc()
            log.error(
                "subscription_data_unreadable",
                stream=self.stream_name,
                subscription=self.id,
                position=self.cursor.next_offset,
                kind=exc.kind,
                error=str(exc),
            )
            self._sink.subscription_failed(self, str(exc))
        except CorruptChunkError as exc:
            metrics.unreadable_data.labels(kind="local").inc()
            log.error(
                "subscription_data_unreadable",
                stream=self.stream_name,
                subscription=self.id,
                position=self.cursor.next_offset,
                kind="local",
                error=str(exc),
            )
            self._sink.subscription_failed(self, str(exc))
        except SourceClosedError:
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("subscription_failed", stream=self.stream_name, subscription=self.id)
            self._sink.subscription_failed(self, repr(exc))

    def _handle_overtaken(self, exc: OffsetOvertakenError) -> bool:
        """True to continue (skip), False when the subscription ends."""
        self._metrics.overtaken.labels(action=self.overtaken_action).inc()
        log.warning(
            "consumer_overtaken",
            stream=self.stream_name,
            subscription=self.id,
            position=exc.position,
            first_offset=exc.first_available,
            action=self.overtaken_action,
        )
        if self.overtaken_action == "skip":
            self.cursor.close()
            self.cursor = self.source.attach(
                OffsetSpec.first(), want_file=self._want_file, chunk_filter=self.chunk_filter
            )
            return True
        self._sink.subscription_overtaken(self)
        return False
