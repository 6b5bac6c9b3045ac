"""A delayed stream's world for in-process tests: real stream logs (the stream and its
system stream), a filesystem object store, a SQLite MetaStore, a stepped clock, and a port
that can be made to crash at chosen points.

A crash is ``Crash`` (a BaseException, so no handler of the scheduler swallows it); the test
then drops the scheduler without closing anything (``abandon``) and builds a new one, as a
restarted server would."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from tierlog.delayed.pointer import CheckpointPointer
from tierlog.delayed.records import encode_schedule
from tierlog.delayed.scheduler import Scheduler, SchedulerConfig
from tierlog.delayed.timers import TimerManifest, TimerStore
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.metrics import Metrics
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

DISPATCHER = "__tierlog_delayed_dispatcher"
INCARNATION = "__orders_1"


class Crash(BaseException):
    """The process dies here."""


@dataclass
class SteppedClock:
    now: int

    def now_ms(self) -> int:
        return self.now

    def reference_ms(self) -> int:
        return self.now


@dataclass
class Armed:
    """Crash points armed for the next scheduler: name -> calls left before the crash."""

    points: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> None:
        left = self.points.get(name)
        if left is None:
            return
        if left <= 0:
            del self.points[name]
            raise Crash(name)
        self.points[name] = left - 1


class LogPort:
    def __init__(self, world: World) -> None:
        self.world = world

    def first_system_offset(self) -> int:
        return self.world.system.segment_refs()[0].first_offset

    def read_system(self, from_offset: int) -> tuple[list[tuple[int, bytes]], int]:
        log = self.world.system
        if from_offset >= log.commit_point().next_offset:
            return [], from_offset
        out = []
        nxt = from_offset
        with log.reader(OffsetSpec.offset(from_offset)) as reader:
            for offset, record in reader.records():
                if offset >= from_offset:
                    out.append((offset, bytes(record)))
                    nxt = offset + 1
        return out, nxt

    def read_system_at(self, offset: int) -> bytes:
        records, _ = self.read_system(offset)
        assert records and records[0][0] == offset
        return records[0][1]

    async def append_system(self, records: list[bytes]) -> bool:
        self.world.armed.hit("before_system_append")
        self.world.system.append(records)
        self.world.system.sync()
        self.world.armed.hit("after_intent")
        return True

    async def append_target(self, first_pid: int, messages: list[bytes]) -> int:
        world = self.world
        ids = list(range(first_pid, first_pid + len(messages)))
        if "fail_target" in world.armed.points:
            world.armed.points.pop("fail_target")
            half = len(messages) // 2  # a partial append, then an error
            if half:
                world.target.append(messages[:half], DISPATCHER, ids[:half])
                world.target.sync()
                world.appended.extend((world.clock.now, m) for m in messages[:half])
            return self.producer_sequence()
        result = world.target.append(messages, DISPATCHER, ids)
        world.target.sync()
        written = set(result.written)
        world.appended.extend(
            (world.clock.now, m) for pid, m in zip(ids, messages, strict=True) if pid in written
        )
        world.armed.hit("after_target_append")
        return self.producer_sequence()

    def producer_sequence(self) -> int:
        return self.world.target.producer_sequence(DISPATCHER) or 0


class CrashingTimers(TimerStore):
    """A timer store whose writes can crash (object written, manifest not committed)."""

    armed: Armed

    def write_object(self, hour: int, entries: list) -> str:  # type: ignore[type-arg]
        uid = super().write_object(hour, entries)
        self.armed.hit("after_timer_object")
        return uid

    def commit(self, manifest: TimerManifest) -> TimerManifest:
        self.armed.hit("before_manifest_commit")
        return super().commit(manifest)


class World:
    def __init__(
        self, root: str, now_ms: int, horizon_ms: int = 3_600_000, checkpoint_records: int = 500
    ) -> None:
        self.root = root
        self.checkpoint_records = checkpoint_records
        self.clock = SteppedClock(now_ms)
        config = LogConfig(fsync="never")
        self.target = StreamLog.create(os.path.join(root, "streams"), "/", "orders", config, 1)
        self.system = StreamLog.create(
            os.path.join(root, "streams"),
            "/",
            "__tierlog_delayed.orders",
            LogConfig(fsync="never", max_segment_bytes=64 * 1024),
            2,
        )
        self.freed_segments = 0
        self.objects = FsObjectStore(os.path.join(root, "objects"))
        self.meta = SqliteMetaStore(os.path.join(root, "meta.db"))
        self.metrics = Metrics()
        self.armed = Armed()
        self.appended: list[tuple[int, bytes]] = []
        self.deleted: list[str] = []
        self.horizon_ms = horizon_ms
        self.working_dir = os.path.join(root, "working")
        self.scheduler: Scheduler | None = None
        self.settings = StreamSettings()

    def timers(self) -> CrashingTimers:
        timers = CrashingTimers(self.objects, self.meta, "", INCARNATION, 1, settings=self.settings)
        timers.armed = self.armed
        return timers

    def new_scheduler(self) -> Scheduler:
        self.scheduler = Scheduler(
            "/",
            "orders",
            INCARNATION,
            LogPort(self),
            self.working_dir,
            self.metrics,
            config=SchedulerConfig(
                horizon_ms=self.horizon_ms,
                batch_limit=200,
                park_interval_seconds=0,
                housekeeping_seconds=0,
                checkpoint_records=self.checkpoint_records,
            ),
            timers=self.timers(),
            clock=self.clock,
            reference=self.clock,
            schedule_deletion=self.deleted.extend,
            pointer=CheckpointPointer(self.meta, INCARNATION),
        )
        return self.scheduler

    def apply_floor(self) -> None:
        """The system stream's retention: sealed segments wholly below the scheduler's
        floor (its last checkpoint) go, as the server's does without a remote tier."""
        floor = self.scheduler.floor if self.scheduler is not None else None
        if floor is None:
            return
        for segment in self.system.list_segments():
            if not segment.sealed or segment.next_offset > floor:
                break
            self.system.delete_segment(segment.first_offset)
            self.freed_segments += 1

    def crash(self) -> None:
        """Drop the scheduler as a killed process would: nothing closed or flushed."""
        if self.scheduler is not None and self.scheduler.store is not None:
            self.scheduler.store.abandon()
        self.scheduler = None

    def publish(self, reference: str, pid: int, delay_ms: int, body: bytes) -> int:
        due = self.clock.now + delay_ms
        self.system.append([encode_schedule(due, reference, pid, body)], reference, [pid])
        self.system.sync()
        return due

    def target_bodies(self) -> list[bytes]:
        with self.target.reader(OffsetSpec.first()) as reader:
            return [bytes(r) for _, r in reader.records()]

    def close(self) -> None:
        self.crash()
        self.target.close()
        self.system.close()
        self.meta.close()


Step = Callable[[World], None]
