"""The scheduler of one delayed stream: the I/O shell around ``state.SchedulerState``.

It reads the stream's system stream, keeps the working set (a v2 message store) and the timer
objects in step with it, and appends due messages to the stream. Everything it holds can be
rebuilt from the system stream: ``rebuild()`` does so, and is what runs when the scheduler
starts (server start, stream creation) and what a node calls when it becomes the stream's
leader. One asyncio task per scheduler runs ``tick()``; blocking I/O runs in the default
executor, one call at a time (the message store has one owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from tierlog.delayed.clock import MAX_SKEW_MS, Clock, ReferenceClock, WallClock
from tierlog.delayed.errors import (
    ForeignRecordError,
    NotScheduledError,
    SchedulerStoppedError,
    SystemRecordError,
    TimerManifestError,
)
from tierlog.delayed.port import SchedulerConfig, StreamPort
from tierlog.delayed.records import (
    Schedule,
    SystemRecord,
    TimerEntry,
    decode_system_record,
    decode_working,
    encode_cancel,
    encode_dispatch,
    encode_working,
    msg_id_of,
)
from tierlog.delayed.state import Replay, Scheduled, SchedulerState, rebuild_state
from tierlog.delayed.timers import TimerManifest, TimerStore
from tierlog.errors import TierlogError
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.msgstore import MessageStore, MsgStoreConfig, MsgStoreError
from tierlog.storage.errors import EpochFencedError, StorageError

log = get_logger("tierlog.delayed.scheduler")

NO_OBJECT_STORE_HORIZON_MS = 100 * 366 * 86400 * 1000
"""Without a remote tier nothing is parked: every message stays in the working set."""


class Scheduler:
    def __init__(
        self,
        vhost: str,
        name: str,
        incarnation: str,
        port: StreamPort,
        working_dir: str,
        metrics: Metrics,
        *,
        config: SchedulerConfig | None = None,
        timers: TimerStore | None = None,
        clock: Clock | None = None,
        reference: ReferenceClock | None = None,
        schedule_deletion: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.vhost, self.name, self.incarnation = vhost, name, incarnation
        self.port = port
        self.working_dir = working_dir
        self.metrics = metrics
        self.config = config or SchedulerConfig()
        self.timers = timers
        self.clock: Clock = clock or WallClock()
        self.reference = reference
        self.schedule_deletion = schedule_deletion
        horizon = self.config.horizon_ms if timers is not None else NO_OBJECT_STORE_HORIZON_MS
        self.state = SchedulerState(horizon)
        self.store: MessageStore | None = None
        self.manifest = TimerManifest()
        self.scan_next = 0
        self.parking_bodies: dict[bytes, bytes] = {}
        self.halted = False
        self.failed: str | None = None
        self.deposed: str | None = None
        """Set when a timer-manifest commit or load was fenced by a newer epoch: a leader of
        a newer epoch owns the stream's delayed state, so this scheduler's rounds end."""
        self._task: asyncio.Task[None] | None = None
        self._last_park = 0.0
        self._last_housekeeping = 0.0
        self._lock = asyncio.Lock()

    # ----------------------------------------------------------------- lifecycle

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def rebuild(self) -> None:
        """Rebuild everything from the system stream, the timer manifest and the working
        set: the entry point on start and when this node becomes the stream's leader."""
        async with self._lock:
            await self._io(self._rebuild_blocking)

    def start(self) -> None:
        """Run ``tick`` until ``stop`` (after ``rebuild``)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def halt(self) -> None:
        """Cancel the rounds now, synchronously (leadership lost): no new dispatch starts
        from here; ``stop`` then closes the working set."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:
            if self.store is not None:
                store, self.store = self.store, None
                await self._io(store.close)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
                self.failed = None
            except asyncio.CancelledError:
                raise
            except EpochFencedError as exc:
                self._deposed(exc)
                return
            except (TierlogError, OSError) as exc:
                self.failed = repr(exc)
                log.error(
                    "delayed_tick_failed", vhost=self.vhost, stream=self.name, error=repr(exc)
                )
                await asyncio.sleep(1.0)
                try:
                    await self.rebuild()
                except EpochFencedError as fenced:
                    self._deposed(fenced)
                    return
                except (TierlogError, OSError):
                    pass  # the next tick fails again and retries
            await asyncio.sleep(self.config.tick_seconds)

    def _deposed(self, exc: EpochFencedError) -> None:
        self.deposed = self.failed = repr(exc)
        log.error(
            "delayed_scheduler_deposed",
            vhost=self.vhost,
            stream=self.name,
            epoch=self.timers.epoch if self.timers is not None else None,
            error=repr(exc),
        )

    # ----------------------------------------------------------------- rebuild

    def _open_store(self) -> MessageStore:
        config = MsgStoreConfig(sync_writes=False)
        try:
            return MessageStore.open(self.working_dir, config)
        except (MsgStoreError, OSError) as exc:
            log.warning(
                "delayed_working_set_rebuilt",
                vhost=self.vhost,
                stream=self.name,
                reason=repr(exc),
            )
            self.metrics.delayed_repairs.labels(kind="working_set").inc()
            shutil.rmtree(self.working_dir, ignore_errors=True)
            return MessageStore.open(self.working_dir, config)

    def _load_manifest(self) -> TimerManifest:
        if self.timers is None:
            return TimerManifest()
        try:
            return self.timers.load_manifest()
        except TimerManifestError as exc:
            log.warning(
                "delayed_timer_manifest_rebuilt",
                vhost=self.vhost,
                stream=self.name,
                reason=repr(exc),
            )
            self.metrics.delayed_repairs.labels(kind="timer_manifest").inc()
            # start over: every long-delay message is parked again from the system stream
            return TimerManifest(version=self.timers.stored_version())

    def _rebuild_blocking(self) -> None:
        if self.store is not None:
            self.store.abandon()
            self.store = None
        manifest = self._load_manifest()
        store = self._open_store()
        replay = Replay(self.incarnation)
        offset = self.port.first_system_offset()
        while True:
            records, next_offset = self.port.read_system(offset)
            for at, data in records:
                record = self._decode(at, data)
                if record is not None:
                    replay.feed(at, record)
            if next_offset == offset:
                break
            offset = next_offset
        sequence = self.port.producer_sequence()
        state, bodies = rebuild_state(
            replay,
            sequence,
            self.state.horizon_ms,
            pulled_through=manifest.pulled_through,
            parked_hours=manifest.hours,
            parked_through=manifest.parked_through,
            now_ms=self.clock.now_ms(),
        )
        repaired = 0
        for msg_id, entry in state.working.items():
            if msg_id not in store:
                message = bodies.pop(msg_id)
                store.write(msg_id, encode_working(entry.due_ms, entry.offset, message))
                repaired += 1
        bodies = {m: b for m, b in bodies.items() if m in state.parking}
        for msg_id in list(store.msg_ids()):
            if msg_id not in state.working:
                store.remove(msg_id)
        store.sync()
        self.store, self.manifest, self.state = store, manifest, state
        self.parking_bodies = bodies
        self.scan_next = offset
        if self.timers is not None:
            self._delete_orphans()
        log.info(
            "delayed_scheduler_rebuilt",
            vhost=self.vhost,
            stream=self.name,
            scheduled=state.count(),
            working=len(state.working),
            parked=len(state.parked),
            working_set_written=repaired,
            next_publishing_id=state.next_pid,
            system_next_offset=offset,
        )

    def _decode(self, offset: int, data: bytes) -> SystemRecord | None:
        """A system-stream record, or None for one that is not (clients cannot write system
        streams, so only a restored or damaged file holds one): skipped, logged and
        counted, never a stall of the stream's deliveries."""
        try:
            return decode_system_record(data)
        except ForeignRecordError as exc:
            self.metrics.delayed_foreign_records.inc()
            log.error(
                "delayed_foreign_record_skipped",
                vhost=self.vhost,
                stream=self.name,
                offset=offset,
                error=str(exc),
            )
            return None

    def _delete_orphans(self) -> None:
        """Objects no manifest names (a crash between their PUT and the commit)."""
        assert self.timers is not None
        listed = {
            self.timers.key(h, u)
            for table in (self.manifest.hours, self.manifest.retired)
            for h, uids in table.items()
            for u in uids
        }
        orphans = [k for k in self.timers.all_keys() if k not in listed]
        if orphans and self.schedule_deletion is not None:
            self.schedule_deletion(orphans)

    # ----------------------------------------------------------------- one round

    async def tick(self) -> None:
        async with self._lock:
            if self.store is None:
                raise SchedulerStoppedError(f"scheduler of {self.name!r} is not running")
            await self._io(self._scan_blocking)
            if self.timers is not None:
                await self._io(self._pull_blocking)
                if time.monotonic() - self._last_park >= self.config.park_interval_seconds:
                    self._last_park = time.monotonic()
                    await self._io(self._park_blocking)
            while await self._dispatch_once():
                pass
            if time.monotonic() - self._last_housekeeping >= self.config.housekeeping_seconds:
                self._last_housekeeping = time.monotonic()
                await self._io(self._housekeeping_blocking)

    def _scan_blocking(self) -> None:
        """New system-stream records: schedules are placed (their own dispatch intents and
        cancels were applied to the state when written)."""
        assert self.store is not None
        records, next_offset = self.port.read_system(self.scan_next)
        now = self.clock.now_ms()
        wrote = False
        for offset, data in records:
            record = self._decode(offset, data)
            if not isinstance(record, Schedule):
                continue
            sequence = record.publishing_id if record.reference else offset
            entry = Scheduled(
                msg_id_of(self.incarnation, record.reference, sequence), record.due_ms, offset
            )
            place = self.state.accept(entry, now)
            if place == "working":
                if entry.msg_id not in self.store:
                    self.store.write(
                        entry.msg_id, encode_working(entry.due_ms, offset, record.message)
                    )
                    wrote = True
            elif place == "parking":
                self.parking_bodies[entry.msg_id] = record.message
        for entry in self.state.move_parking_to_working(now):
            body = self.parking_bodies.pop(entry.msg_id)
            self.store.write(entry.msg_id, encode_working(entry.due_ms, entry.offset, body))
            wrote = True
        if wrote:
            self.store.sync()
        self.scan_next = next_offset

    def _message_from_system(self, entry: Scheduled) -> bytes:
        record = decode_system_record(self.port.read_system_at(entry.offset))
        if not isinstance(record, Schedule):
            raise SystemRecordError(f"system record at {entry.offset} is not a schedule")
        return record.message

    def _pull_blocking(self) -> None:
        """Pull every parked hour that reached the frontier into the working set."""
        assert self.store is not None and self.timers is not None
        for hour in self.state.hours_to_pull(self.clock.now_ms()):
            wanted = self.state.parked_of_hour(hour)
            uids = self.manifest.hours.get(hour, [])
            for uid in uids:
                try:
                    entries = self.timers.read_object(hour, uid)
                except TierlogError as exc:  # damaged, gone, does not open, unreachable
                    log.warning(
                        "delayed_timer_object_unreadable",
                        vhost=self.vhost,
                        stream=self.name,
                        key=self.timers.key(hour, uid),
                        error=repr(exc),
                    )
                    self.metrics.delayed_repairs.labels(kind="timer_object").inc()
                    continue
                for e in entries:
                    if e.msg_id in wanted and e.msg_id not in self.store:
                        self.store.write(e.msg_id, encode_working(e.due_ms, e.offset, e.message))
            for msg_id, entry in wanted.items():  # lost with a damaged or missing object
                if msg_id not in self.store:
                    message = self._message_from_system(entry)
                    self.store.write(msg_id, encode_working(entry.due_ms, entry.offset, message))
            self.store.sync()
            self.manifest.hours.pop(hour, None)
            if uids:
                self.manifest.retired.setdefault(hour, []).extend(uids)
            self.manifest.pulled_through = max(self.manifest.pulled_through, hour)
            self.manifest = self.timers.commit(self.manifest)
            self.state.pulled(hour)

    def _park_blocking(self) -> None:
        """Write what waits to be parked as one object per hour and commit the manifest."""
        assert self.store is not None and self.timers is not None
        by_hour = self.state.take_parking()
        if not by_hour:
            return
        taken = [e for entries in by_hour.values() for e in entries]
        try:
            for hour, entries in sorted(by_hour.items()):
                objects = [
                    TimerEntry(e.msg_id, e.due_ms, e.offset, self.parking_bodies[e.msg_id])
                    for e in sorted(entries, key=lambda e: (e.due_ms, e.offset))
                ]
                uid = self.timers.write_object(hour, objects)
                self.metrics.delayed_timer_objects.inc()
                self.manifest.hours.setdefault(hour, []).append(uid)
            self.manifest.parked_through = self.scan_next
            self.manifest = self.timers.commit(self.manifest)
        except (StorageError, OSError):
            self.state.parking_failed(taken)
            self.manifest = self._load_manifest()
            raise
        for entry in self.state.parked_committed(taken, self.clock.now_ms()):
            body = self.parking_bodies[entry.msg_id]
            self.store.write(entry.msg_id, encode_working(entry.due_ms, entry.offset, body))
        for entry in taken:
            self.parking_bodies.pop(entry.msg_id, None)
        self.store.sync()

    def _read_messages(self, batch: list[Scheduled]) -> list[bytes]:
        assert self.store is not None
        out = []
        for entry in batch:
            try:
                _due, _offset, message = decode_working(self.store.read(entry.msg_id))
            except (MsgStoreError, SystemRecordError, OSError) as exc:
                log.warning(
                    "delayed_working_set_record_unreadable",
                    vhost=self.vhost,
                    stream=self.name,
                    msg_id=entry.msg_id.hex(),
                    error=repr(exc),
                )
                self.metrics.delayed_repairs.labels(kind="working_set").inc()
                message = self._message_from_system(entry)
            out.append(message)
        return out

    def _skewed(self, now: int) -> bool:
        if self.reference is None:
            return False
        skew = now - self.reference.reference_ms()
        halted = abs(skew) > MAX_SKEW_MS
        if halted:
            self.metrics.delayed_clock_skew_halts.inc()
        if halted != self.halted:
            self.halted = halted
            if halted:
                log.warning(
                    "delayed_dispatch_halted_clock_skew",
                    vhost=self.vhost,
                    stream=self.name,
                    skew_ms=skew,
                    max_skew_ms=MAX_SKEW_MS,
                )
            else:
                log.info(
                    "delayed_dispatch_resumed", vhost=self.vhost, stream=self.name, skew_ms=skew
                )
        return halted

    async def _dispatch_once(self) -> bool:
        """One batch of due messages; True when a full batch went (more may be due)."""
        now = self.clock.now_ms()
        batch = self.state.due(now, self.config.batch_limit)
        if not batch or self._skewed(now):
            return False
        messages = await self._io(self._read_messages, batch)
        first = self.state.begin_dispatch(batch)
        ids = [e.msg_id for e in batch]
        if await self.port.append_system([encode_dispatch(first, ids)]):
            sequence = await self.port.append_target(first, messages)
        else:
            sequence = self.port.producer_sequence()
        delivered, returned = self.state.dispatch_settled(batch, first, sequence)
        done_ms = self.clock.now_ms()
        for entry in delivered:
            self.metrics.delayed_lateness_seconds.observe(max(0, done_ms - entry.due_ms) / 1000)
        self.metrics.delayed_dispatched.inc(len(delivered))
        if delivered:
            await self._io(self._remove, delivered)
        if returned:
            log.warning(
                "delayed_dispatch_incomplete",
                vhost=self.vhost,
                stream=self.name,
                returned=len(returned),
                producer_sequence=sequence,
            )
            return False
        return len(batch) >= self.config.batch_limit

    def _remove(self, entries: list[Scheduled]) -> None:
        assert self.store is not None
        for entry in entries:
            if entry.msg_id in self.store:
                self.store.remove(entry.msg_id)

    def _housekeeping_blocking(self) -> None:
        """Compact the working set; delete the objects of hours fully delivered."""
        assert self.store is not None
        for file in self.store.compaction_candidates():
            self.store.compact(file)
            self.store.delete_file_if_empty(file)
        if self.timers is None:
            return
        done = self.state.retire_hours(list(self.manifest.retired))
        if not done:
            return
        keys = [self.timers.key(h, u) for h in done for u in self.manifest.retired[h]]
        for hour in done:
            del self.manifest.retired[hour]
        self.manifest = self.timers.commit(self.manifest)
        if self.schedule_deletion is not None:
            self.schedule_deletion(keys)

    # ----------------------------------------------------------------- admin

    async def cancel(self, reference: str, publishing_id: int) -> str:
        """Cancel a scheduled message by its producer reference and publishing id: a CANCEL
        record is committed to the system stream first. Where the message was."""
        msg_id = msg_id_of(self.incarnation, reference, publishing_id)
        async with self._lock:
            place = self.state.where(msg_id)
            if place not in ("working", "parking", "parked"):
                raise NotScheduledError(
                    f"no scheduled message ({reference!r}, {publishing_id}) in {self.name!r}"
                    + (f": it is {place.replace('_', ' ')}" if place else "")
                )
            if not await self.port.append_system([encode_cancel(msg_id)]):
                raise SchedulerStoppedError("the cancel record could not be written")
            self.state.cancel(msg_id)
            self.parking_bodies.pop(msg_id, None)
            if self.store is not None and msg_id in self.store:
                await self._io(self.store.remove, msg_id)
            self.metrics.delayed_cancelled.inc()
            return str(place)

    def status(self) -> dict[str, Any]:
        s = self.state
        return {
            "scheduled": s.count(),
            "working_set": len(s.working),
            "parking": len(s.parking),
            "parked": len(s.parked),
            "in_flight": len(s.in_flight),
            "next_due_ms": s.next_due_ms(),
            "pulled_through_hour": s.pulled_through,
            "parked_hours": sorted(s.parked_hours),
            "next_publishing_id": s.next_pid,
            "dispatch_halted": self.halted,
            "horizon_ms": s.horizon_ms,
            "failed": self.failed,
            "deposed": self.deposed,
            "working_dir": os.path.abspath(self.working_dir),
        }
