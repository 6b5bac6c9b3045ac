"""The scheduler's checkpoints (docs/delayed.md, Checkpoints): where a rebuild starts
(the pointer, checked against the log), reading message bytes back from the system stream
in one pass, and writing a checkpoint (its carries, then its record). A mixin of
``Scheduler``, kept apart so the scheduler reads as its rounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

from tierlog.delayed.errors import SystemRecordError
from tierlog.delayed.pointer import CheckpointPointer
from tierlog.delayed.port import SchedulerConfig, StreamPort
from tierlog.delayed.records import (
    Carry,
    Checkpoint,
    Schedule,
    decode_system_record,
    encode_carry,
    encode_checkpoint,
)
from tierlog.delayed.state import Scheduled, SchedulerState
from tierlog.errors import TierlogError
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.msgstore import MessageStore

log = get_logger("tierlog.delayed.scheduler")

CARRY_PART_BYTES = 4 << 20
"""A checkpoint's carries go to the system stream in appends of about this size."""


class CheckpointMixin:
    """Checkpoint I/O of ``Scheduler`` (which sets these fields)."""

    vhost: str
    name: str
    port: StreamPort
    pointer: CheckpointPointer | None
    state: SchedulerState
    store: MessageStore | None
    parking_bodies: dict[bytes, bytes]
    scan_next: int
    config: SchedulerConfig
    metrics: Metrics
    checkpoints_written: int
    _next_checkpoint_try: float

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _scan_blocking(self) -> None:
        raise NotImplementedError

    def _read_messages(self, batch: list[Scheduled]) -> list[bytes]:
        raise NotImplementedError

    def _replay_start(self) -> int:
        """The first offset of the system stream, or the ``through`` of the last
        checkpoint when the pointer names one that is there (retention leaves up to a
        segment of older records before it, which a rebuild then does not read)."""
        first = self.port.first_system_offset()
        if self.pointer is None:
            return first
        try:
            known = self.pointer.load()
            if known is None or known[0] < first:
                return first
            through, at = known
            record = decode_system_record(self.port.read_system_at(at))
        except (TierlogError, OSError) as exc:
            log.warning(
                "delayed_checkpoint_pointer_ignored",
                vhost=self.vhost,
                stream=self.name,
                error=repr(exc),
            )
            return first
        if not isinstance(record, Checkpoint) or record.through != through:
            log.warning(
                "delayed_checkpoint_pointer_ignored",
                vhost=self.vhost,
                stream=self.name,
                error=f"offset {at} holds no checkpoint through {through}",
            )
            return first
        return through

    def _store_pointer(self, through: int, at: int) -> None:
        if self.pointer is None:
            return
        try:
            self.pointer.store(through, at)
        except (TierlogError, OSError) as exc:  # a hint only: the rebuild reads more
            log.warning(
                "delayed_checkpoint_pointer_failed",
                vhost=self.vhost,
                stream=self.name,
                error=repr(exc),
            )

    def _bodies_from_system(self, need: dict[int, bytes]) -> Iterator[tuple[bytes, bytes]]:
        """(msg id, message) for each ``offset -> msg id`` of ``need``, read in one pass
        over the system stream (a SCHEDULE or CARRY record at each offset)."""
        if not need:
            return
        offset, last = min(need), max(need)
        found = 0
        while offset <= last and found < len(need):
            records, next_offset = self.port.read_system(offset)
            for at, data in records:
                msg_id = need.get(at)
                if msg_id is None:
                    continue
                record = decode_system_record(data)
                if not isinstance(record, Schedule | Carry):
                    raise SystemRecordError(f"system record at {at} holds no message")
                found += 1
                yield msg_id, record.message
            if next_offset == offset:
                break
            offset = next_offset
        if found < len(need):
            raise SystemRecordError(
                f"{len(need) - found} scheduled messages of {self.name!r} are not in the "
                "system stream any more"
            )

    # ----------------------------------------------------------------- checkpoints

    async def _checkpoint(self) -> None:
        """Copy every pending message forward (CARRY records, committed), then write the
        CHECKPOINT record; the scan applies both (relocation, ``finished`` cleared, the
        retention floor raised) exactly as a restart's replay would."""
        through = self.scan_next
        entries = self.state.checkpoint_entries()
        parts: list[list[bytes]] = await self._io(self._carry_records, through, entries)
        appended = await asyncio.gather(*(self.port.append_system(p) for p in parts))
        if all(appended):
            mark = encode_checkpoint(through, self.state.next_pid, len(entries))
            appended = [await self.port.append_system([mark])]
        if not all(appended):
            self._next_checkpoint_try = time.monotonic() + self.config.checkpoint_retry_seconds
            log.warning(
                "delayed_checkpoint_failed", vhost=self.vhost, stream=self.name, through=through
            )
            return
        self.checkpoints_written += 1
        self.metrics.delayed_checkpoints.inc()
        log.info(
            "delayed_checkpoint_written",
            vhost=self.vhost,
            stream=self.name,
            through=through,
            carried=len(entries),
        )
        await self._io(self._scan_blocking)

    def _carry_records(
        self, through: int, entries: list[tuple[Scheduled, bool, int]]
    ) -> list[list[bytes]]:
        """The CARRY records of a checkpoint, in appends of about ``CARRY_PART_BYTES``."""
        assert self.store is not None
        from_system = {
            e.offset: e.msg_id
            for e, _parked, _intent in entries
            if e.msg_id not in self.parking_bodies and e.msg_id not in self.store
        }
        bodies = dict(self._bodies_from_system(from_system))
        parts: list[list[bytes]] = [[]]
        size = 0
        for entry, parked, intent in entries:
            message = self.parking_bodies.get(entry.msg_id)
            if message is None:
                message = bodies.get(entry.msg_id)
            if message is None:
                message = self._read_messages([entry])[0]
            record = encode_carry(through, entry.msg_id, entry.due_ms, intent, parked, message)
            if size + len(record) > CARRY_PART_BYTES and parts[-1]:
                parts.append([])
                size = 0
            parts[-1].append(record)
            size += len(record)
        return [p for p in parts if p]
