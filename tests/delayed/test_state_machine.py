"""The scheduler's pure decisions under hypothesis: publishing, time passing (forwards and
backwards), parking and pulling (committed or failed), dispatching (whole, partial, failed
before or after the intent), cancelling, checkpoints (complete, or abandoned half way),
retention dropping every record below the last checkpoint, and crashes (state rebuilt from
what is left of the system stream, the stream's producer sequence and the last committed
manifest).

Invariants: a message is in one place at a time; nothing is appended before its due time;
no message is appended twice; the delivered-id set holds only ids named since the last
checkpoint; once time has passed every due time, every accepted message not cancelled has
been appended exactly once."""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
)

from tierlog.delayed.records import (
    Cancel,
    Carry,
    Checkpoint,
    Dispatch,
    Schedule,
    SystemRecord,
    msg_id_of,
)
from tierlog.delayed.state import (
    HOUR_MS,
    Replay,
    Scheduled,
    SchedulerState,
    hour_of,
    rebuild_state,
)

INC = "inc"
HORIZON = HOUR_MS
T0 = 1_800_000_000_000


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.system: list[SystemRecord | None] = []  # the durable system stream
        self.first = 0  # retention dropped every record below (None in ``system``)
        self.target: dict[int, bytes] = {}  # the stream: dispatcher publishing id -> msg id
        self.appended_at: dict[bytes, int] = {}
        self.due: dict[bytes, int] = {}
        self.cancelled: set[bytes] = set()
        self.pid = 0
        self.state = SchedulerState(HORIZON)
        # the committed timer manifest
        self.pulled_through = -1
        self.parked_hours: set[int] = set()
        self.parked_through = 0

    @property
    def sequence(self) -> int:
        return max(self.target, default=0)

    def _append_target(self, first: int, batch: list[Scheduled], count: int) -> None:
        for k, entry in enumerate(batch[:count]):
            pid = first + k
            if pid <= self.sequence:
                continue  # the stream's deduplication
            assert entry.due_ms <= self.now, "appended before its due time"
            assert entry.msg_id not in self.appended_at, "appended twice"
            self.target[pid] = entry.msg_id
            self.appended_at[entry.msg_id] = self.now

    # ----------------------------------------------------------------- rules

    @rule(delay=st.one_of(st.integers(0, 2000), st.integers(0, 2000), st.integers(0, 4 * HOUR_MS)))
    def publish(self, delay: int) -> None:
        self.pid += 1
        due = self.now + delay
        offset = len(self.system)
        self.system.append(Schedule(due, "app", self.pid, b"m"))
        msg_id = msg_id_of(INC, "app", self.pid)
        self.due[msg_id] = due
        self.state.accept(Scheduled(msg_id, due, offset), self.now)  # the scan

    @rule(ms=st.sampled_from([10, 1000, 60_000, 600_000, 1_800_000, -30_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(commit=st.booleans())
    def park(self, commit: bool) -> None:
        by_hour = self.state.take_parking()
        taken = [e for entries in by_hour.values() for e in entries]
        if not commit:
            self.state.parking_failed(taken)
            return
        self.parked_hours |= set(by_hour)
        self.parked_through = len(self.system)
        self.state.parked_committed(taken, self.now)

    @rule()
    def pull(self) -> None:
        for hour in self.state.hours_to_pull(self.now):
            self.state.pulled(hour)
            self.parked_hours.discard(hour)
            self.pulled_through = max(self.pulled_through, hour)
        self.state.move_parking_to_working(self.now)

    @rule(
        limit=st.integers(1, 8),
        outcome=st.sampled_from(["ok", "ok", "partial", "no_intent", "intent_only"]),
        written=st.integers(0, 8),
    )
    def dispatch(self, limit: int, outcome: str, written: int) -> None:
        batch = self.state.due(self.now, limit)
        if not batch:
            return
        for entry in batch:
            assert entry.due_ms <= self.now
        first = self.state.begin_dispatch(batch)
        if outcome != "no_intent":
            self.system.append(Dispatch(first, tuple(e.msg_id for e in batch)))
        if outcome == "ok":
            self._append_target(first, batch, len(batch))
        elif outcome == "partial":
            self._append_target(first, batch, min(written, len(batch)))
        self.state.dispatch_settled(batch, first, self.sequence)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if not self.due:
            return
        msg_id = data.draw(st.sampled_from(sorted(self.due)))
        if self.state.where(msg_id) in ("working", "parking", "parked"):
            self.system.append(Cancel(msg_id))
            self.state.cancel(msg_id)
            self.cancelled.add(msg_id)

    def _scan(self, start: int) -> None:
        """The live scheduler's scan of its own checkpoint records (carries relocate,
        the checkpoint clears ``finished``)."""
        for offset in range(start, len(self.system)):
            record = self.system[offset]
            if isinstance(record, Carry):
                self.state.relocate(record.msg_id, offset)
            elif isinstance(record, Checkpoint):
                self.state.checkpointed(record.through, offset)

    @rule(complete=st.booleans(), part=st.integers(0, 8))
    def checkpoint(self, complete: bool, part: int) -> None:
        through = len(self.system)
        entries = self.state.checkpoint_entries()
        if not complete:
            entries = entries[:part]  # the process died after some carries
        for entry, parked, intent in entries:
            self.system.append(Carry(through, entry.msg_id, entry.due_ms, intent, parked, b"m"))
        if complete:
            self.system.append(Checkpoint(through, self.state.next_pid, len(entries)))
        self._scan(through)

    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        """Drop the records below a cut at or below the last checkpoint's ``through``
        (the floor; real retention cuts at fragment or segment boundaries below it, maybe
        inside an older checkpoint's carries)."""
        floor = self.state.checkpoint_through
        if floor <= self.first:
            return
        inside = [  # cuts inside an older checkpoint's carries: the hard case
            o + 1 for o in range(self.first, floor) if isinstance(self.system[o], Carry)
        ]
        cut = data.draw(st.sampled_from([floor, *inside]) if inside else st.just(floor))
        for offset in range(self.first, cut):
            self.system[offset] = None
        self.first = cut

    @rule()
    def crash(self) -> None:
        replay = Replay(INC, start=self.first)
        for offset in range(self.first, len(self.system)):
            record = self.system[offset]
            assert record is not None
            replay.feed(offset, record)
        self.state = rebuild_state(
            replay,
            self.sequence,
            HORIZON,
            pulled_through=self.pulled_through,
            parked_hours=self.parked_hours,
            parked_through=self.parked_through,
            now_ms=self.now,
        )

    # ----------------------------------------------------------------- invariants

    @invariant()
    def one_place(self) -> None:
        s = self.state
        tables = [set(s.working), set(s.parking), set(s.parked), set(s.in_flight)]
        seen: set[bytes] = set()
        for t in tables:
            assert not (seen & t)
            seen |= t
        assert not (seen & set(self.appended_at))
        assert not (seen & self.cancelled)

    @invariant()
    def finished_bounded(self) -> None:
        """Delivered / cancelled ids are kept only while a record since the last checkpoint
        names them: the set never grows with the stream's history."""
        named: set[bytes] = set()
        for record in self.system[self.state.checkpoint_through :]:
            if isinstance(record, Dispatch):
                named.update(record.msg_ids)
            elif isinstance(record, Cancel):
                named.add(record.msg_id)
        assert self.state.finished <= named

    @invariant()
    def pending_readable(self) -> None:
        """Every pending message's bytes are at an offset retention has not dropped."""
        s = self.state
        for table in (s.working, s.parking, s.parked, s.in_flight):
            for entry in table.values():
                assert entry.offset >= self.first
                assert isinstance(self.system[entry.offset], Schedule | Carry)

    def teardown(self) -> None:
        self.drain()

    def drain(self) -> None:
        """Time passes beyond every due time: everything not cancelled arrives once."""
        self.now = max(self.due.values(), default=self.now) + 2 * HOUR_MS
        for _ in range(10_000):
            self.park(True)
            self.pull()
            batch = self.state.due(self.now, 64)
            if not batch:
                break
            first = self.state.begin_dispatch(batch)
            self.system.append(Dispatch(first, tuple(e.msg_id for e in batch)))
            self._append_target(first, batch, len(batch))
            self.state.dispatch_settled(batch, first, self.sequence)
        expected = set(self.due) - self.cancelled
        assert set(self.appended_at) == expected
        assert sorted(self.target.values()) == sorted(set(self.target.values()))
        assert self.state.count() == 0
        for msg_id, at in self.appended_at.items():
            assert at >= self.due[msg_id]
        assert all(hour_of(d) >= 0 for d in self.due.values())


SchedulerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("DELAYED_STATE_EXAMPLES", "150")),
    stateful_step_count=60,
    deadline=None,
)
test_scheduler_decisions = SchedulerMachine.TestCase
