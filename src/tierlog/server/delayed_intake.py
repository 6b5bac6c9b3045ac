"""The publish path of a delayed stream and the scheduler's port onto its streams.

``DelayedIntake`` splits each Publish frame of a delayed stream into what is appended at
once, what is scheduled (appended to the system stream) and what is refused, keeping the
frames' order on both streams; ``HandlePort`` is how a scheduler reads the system stream
and appends to both (docs/delayed.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tierlog.delayed.errors import ForeignRecordError
from tierlog.delayed.properties import DELAY_MARKER, split_entries
from tierlog.delayed.records import check_system_record, encode_schedule
from tierlog.formats.chunk import simple_entry
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishBatch
from tierlog.log.names import RESERVED_PREFIX, is_reserved
from tierlog.log.offset_spec import OffsetSpec
from tierlog.logs import get_logger
from tierlog.remote.errors import StreamNotFoundError
from tierlog.server.broker import Broker, StreamHandle

if TYPE_CHECKING:
    from tierlog.server.delayed_service import DelayedService

log = get_logger("tierlog.server.delayed")

SYSTEM_PREFIX = RESERVED_PREFIX + "_delayed."
"""A delayed stream's system stream is ``SYSTEM_PREFIX + name``: a reserved name."""
DISPATCHER_REFERENCE = RESERVED_PREFIX + "_delayed_dispatcher"
"""The internal named producer that appends due messages to their stream (reserved: no
client may declare it, so no client can move the sequence the dispatch is judged by)."""
READ_BATCH_RECORDS = 20_000

Settle = Callable[[Sequence[int], Sequence[tuple[int, int]]], None]
"""(confirmed publishing ids, (publishing id, error code) pairs) of one Publish frame."""


def system_stream_name(name: str) -> str:
    return SYSTEM_PREFIX + name


def is_system_stream(name: str) -> bool:
    return name.startswith(SYSTEM_PREFIX)


def publisher_sequence(broker: Broker, handle: StreamHandle, reference: str) -> int | None:
    """A producer's last publishing id on ``handle``'s stream, as QueryPublisherSequence
    answers it. On a delayed stream a producer's ids are split between the stream (its
    immediate messages) and the system stream (its scheduled ones, appended under its
    reference): the answer is the larger, or a producer that resumes from it would reuse
    ids the system stream has already seen, and its next scheduled messages would be
    confirmed and dropped as duplicates."""
    sequence = handle.log.producer_sequence(reference)
    if handle.delayed is None:
        return sequence
    system = broker.get(handle.vhost, system_stream_name(handle.name))
    scheduled = None if system is None else system.log.producer_sequence(reference)
    if sequence is None or (scheduled is not None and scheduled > sequence):
        return scheduled
    return sequence


def _sub_batch(batch: PublishBatch, indexes: list[int], entries: list[Any]) -> PublishBatch:
    counts = batch.record_counts
    return PublishBatch(
        publisher_id=batch.publisher_id,
        version=batch.version,
        publishing_ids=[batch.publishing_ids[i] for i in indexes],
        entries=entries,
        num_records=len(indexes) if counts is None else sum(counts[i] for i in indexes),
        record_counts=None if counts is None else [counts[i] for i in indexes],
        filter_values=(
            None if batch.filter_values is None else [batch.filter_values[i] for i in indexes]
        ),
    )


def _chain(source: asyncio.Future[int], target: asyncio.Future[int]) -> None:
    def copy(done: asyncio.Future[int]) -> None:
        if not target.done():
            target.set_result(done.result())

    source.add_done_callback(copy)


def _submit_now(
    handle: StreamHandle, batch: PublishBatch, reference: str | None, *, internal: bool = False
) -> asyncio.Future[int]:
    """Queue ``batch`` on the stream now (its order among the stream's publishes is fixed
    here); the future gets the response code once it is durable. ``internal``: the
    server's own append (``StreamHandle.submit_internal``), else the client's publish."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def done(code: int) -> None:
        if not future.done():
            future.set_result(code)

    if internal:
        handle.submit_internal(batch, reference, done)
    else:
        handle.submit_publish(batch, reference, done)
    return future


async def _submit(handle: StreamHandle, batch: PublishBatch, reference: str | None) -> int:
    return await _submit_now(handle, batch, reference, internal=True)


def system_entries(records: Sequence[bytes]) -> list[Any]:
    """The entries of a system-stream append: every record must be one a system stream
    holds (``ForeignRecordError`` otherwise, and nothing is appended). The only way into a
    system stream; clients have none (docs/security.md, "Reserved names")."""
    for record in records:
        check_system_record(record)
    return [simple_entry(r) for r in records]


class HandlePort:
    """A delayed stream and its system stream as the scheduler sees them (handles are
    looked up at each call: a stream reopened after an I/O error has a new handle)."""

    def __init__(self, broker: Broker, vhost: str, name: str) -> None:
        self.broker, self.vhost, self.name = broker, vhost, name

    def _target(self) -> StreamHandle:
        handle = self.broker.get(self.vhost, self.name)
        if handle is None:
            raise StreamNotFoundError(f"stream {self.name!r} is not open")
        return handle

    def _system(self) -> StreamHandle:
        handle = self.broker.get(self.vhost, system_stream_name(self.name))
        if handle is None:
            raise StreamNotFoundError(f"system stream of {self.name!r} is not open")
        return handle

    def first_system_offset(self) -> int:
        return self._system().log.first_offset

    def read_system(self, from_offset: int) -> tuple[list[tuple[int, bytes]], int]:
        stream_log = self._system().log
        if from_offset >= stream_log.commit_point().next_offset:
            return [], from_offset
        out: list[tuple[int, bytes]] = []
        next_offset = from_offset
        with stream_log.reader(OffsetSpec.offset(from_offset)) as reader:
            for offset, record in reader.records():
                if offset < from_offset:
                    continue
                out.append((offset, bytes(record)))
                next_offset = offset + 1
                if len(out) >= READ_BATCH_RECORDS:
                    break
        return out, next_offset

    def read_system_at(self, offset: int) -> bytes:
        records, _ = self.read_system(offset)
        if not records or records[0][0] != offset:
            raise StreamNotFoundError(f"no record at offset {offset} of the system stream")
        return records[0][1]

    async def append_system(self, records: list[bytes]) -> bool:
        try:
            handle = self._system()
        except StreamNotFoundError:
            return False
        entries = system_entries(records)
        batch = PublishBatch(0, 1, [0] * len(entries), entries, len(entries))
        return await _submit(handle, batch, None) == ResponseCode.OK

    async def append_target(self, first_pid: int, messages: list[bytes]) -> int:
        try:
            handle = self._target()
        except StreamNotFoundError:
            return 0
        entries = [simple_entry(m) for m in messages]
        ids = list(range(first_pid, first_pid + len(entries)))
        batch = PublishBatch(0, 1, ids, entries, len(entries))
        await _submit(handle, batch, DISPATCHER_REFERENCE)
        return self.producer_sequence()

    def producer_sequence(self) -> int:
        return self._target().log.producer_sequence(DISPATCHER_REFERENCE) or 0


class DelayedIntake:
    """The publish path of one delayed stream (``StreamHandle.delayed``).

    Order matters: the stream and the system stream deduplicate by publishing id, so the
    parts of a producer's frames must reach each in the order the frames came. Both parts
    of a frame are therefore submitted before ``submit`` returns; only while the system
    stream is being created do scheduled parts wait, in a queue drained in order."""

    def __init__(self, service: DelayedService, handle: StreamHandle) -> None:
        self.service = service
        self.handle = handle
        self.incarnation = handle.record.incarnation
        self._waiting: list[tuple[PublishBatch, str | None, asyncio.Future[int]]] = []
        self._drain: asyncio.Task[None] | None = None

    def submit(self, batch: PublishBatch, reference: str | None, settle: Settle) -> None:
        if is_reserved(reference):  # the client path's last gate, as submit_publish's
            settle((), [(pid, int(ResponseCode.ACCESS_REFUSED)) for pid in batch.publishing_ids])
            return
        if batch.record_counts is None and batch.entry_data().find(DELAY_MARKER) < 0:
            split = None  # one find over the frame: no message in it has a delay property
        else:
            split = split_entries(batch.entries, self.service.accept_clock.now_ms())
        if split is None or (not split.scheduled and not split.refused):
            ids = batch.publishing_ids

            def done(code: int) -> None:
                if code == ResponseCode.OK:
                    settle(ids, ())
                else:
                    settle((), [(pid, code) for pid in ids])

            self.handle.submit_publish(batch, reference, done)
            return
        metrics = self.service.metrics
        ids = batch.publishing_ids
        errors: list[tuple[int, int]] = [
            (ids[i], int(ResponseCode.PRECONDITION_FAILED)) for i, _ in split.refused
        ]
        for _i, reason in split.refused:
            metrics.delayed_refused.labels(
                reason="sub_batch" if "sub-batch" in reason else "bad_property"
            ).inc()
        scheduled = [i for i, _due, _msg in split.scheduled]
        try:
            entries = system_entries(
                [
                    encode_schedule(due, reference or "", ids[i], message)
                    for i, due, message in split.scheduled
                ]
            )
        except ForeignRecordError as exc:  # a bug, never a client's doing: refuse, keep going
            log.error("delayed_schedule_record_refused", stream=self.handle.name, error=str(exc))
            errors.extend((ids[i], int(ResponseCode.INTERNAL_ERROR)) for i in scheduled)
            scheduled = []
        parts: list[tuple[PublishBatch, asyncio.Future[int], bool]] = []
        if split.immediate:
            sub = _sub_batch(batch, split.immediate, [batch.entries[i] for i in split.immediate])
            parts.append((sub, _submit_now(self.handle, sub, reference), False))
        if scheduled:
            sub = _sub_batch(batch, scheduled, entries)
            parts.append((sub, self._submit_scheduled(sub, reference), True))
        if not parts:
            settle((), errors)
            return
        asyncio.get_running_loop().create_task(self._settle(parts, errors, settle))

    async def _settle(
        self,
        parts: list[tuple[PublishBatch, asyncio.Future[int], bool]],
        errors: list[tuple[int, int]],
        settle: Settle,
    ) -> None:
        confirmed: list[int] = []
        for sub, future, scheduled in parts:
            code = await future
            if code == ResponseCode.OK:
                confirmed.extend(sub.publishing_ids)
                if scheduled:
                    self.service.metrics.delayed_accepted.inc(len(sub.publishing_ids))
            else:
                errors.extend((pid, code) for pid in sub.publishing_ids)
        settle(confirmed, errors)

    def _submit_scheduled(self, batch: PublishBatch, reference: str | None) -> asyncio.Future[int]:
        system = self.service.open_system_stream(self.handle)
        if system is not None and not self._waiting:
            return _submit_now(system, batch, reference, internal=True)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((batch, reference, future))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_task(self._drain_waiting())
        return future

    async def _drain_waiting(self) -> None:
        """Scheduled parts that came while the system stream was not open, in order."""
        while self._waiting:
            system = await self.service.ensure_system_stream(self.handle)
            waiting, self._waiting = self._waiting, []
            for batch, reference, future in waiting:
                if system is None:
                    future.set_result(ResponseCode.STREAM_NOT_AVAILABLE)
                    continue
                inner = _submit_now(system, batch, reference, internal=True)
                _chain(inner, future)
