"""The scheduler's decisions as a pure state machine: no I/O, no clock (times are passed in).

Where a scheduled message is:

* ``working`` — in the local working set (the message store), due within the horizon;
* ``parking`` — due later, waiting to be written into a timer object of its hour;
* ``parked`` — in a committed timer object of its hour (the timer manifest lists it);
* ``in_flight`` — its dispatch intent was recorded; the append to the stream is running;
* ``finished`` — delivered or cancelled since the last checkpoint (see below).

Hour ``h`` covers due times ``[h, h+1) * HOUR_MS``. The pull frontier is the hour of
``now + horizon``: every hour up to it is pulled into the working set (one horizon ahead),
and a message of an hour at or below the frontier (or an hour already pulled) goes straight
to the working set.

Exactly once: messages are dispatched in due order, in batches; a batch first gets the
internal producer's publishing ids ``next_pid ..`` (recorded before the append), and after
the append the stream's producer sequence says which of them were written: a message whose
id is at or below it is finished, any other goes back to the working set and gets a new id
in a later batch. ``replay`` applies the same rule to the system stream after a crash: the
latest intent of a message decides, and it was delivered iff its id is at or below the
producer's sequence in the stream.

Checkpoints bound what a restart costs: a checkpoint copies every pending message forward
(``CARRY`` records, then one ``CHECKPOINT`` record naming the scan position ``through`` it
summarizes). ``Replay`` forgets, at a checkpoint, everything below ``through`` that the
checkpoint did not carry, so its tables hold what is pending plus what came since the last
checkpoint; retention may then drop every record below ``through``. The live state follows
the same rule: ``finished`` is cleared when its checkpoint is scanned (a restart would not
know those ids either: they lie below the checkpoint, where the scan never returns, and the
system stream's producer deduplication gives a (reference, publishing id) one SCHEDULE
record). ``should_checkpoint`` spaces checkpoints so that each costs at most as many
records as were appended since the previous one: write amplification at most two.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Literal

from tierlog.delayed.errors import SystemRecordError
from tierlog.delayed.records import (
    Cancel,
    Carry,
    Checkpoint,
    Dispatch,
    Schedule,
    SystemRecord,
    msg_id_of,
)

HOUR_MS = 3_600_000

Place = Literal["working", "parking", "parked", "in_flight", "finished"]


def hour_of(due_ms: int) -> int:
    return due_ms // HOUR_MS


@dataclass(frozen=True, slots=True)
class Scheduled:
    msg_id: bytes
    due_ms: int
    offset: int  # the SCHEDULE record's offset in the system stream


@dataclass
class SchedulerState:
    horizon_ms: int
    pulled_through: int = -1  # every hour <= this was pulled into the working set
    next_pid: int = 1
    working: dict[bytes, Scheduled] = field(default_factory=dict)
    parking: dict[bytes, Scheduled] = field(default_factory=dict)
    parked: dict[bytes, Scheduled] = field(default_factory=dict)
    in_flight: dict[bytes, Scheduled] = field(default_factory=dict)
    finished: set[bytes] = field(default_factory=set)
    parked_hours: dict[int, set[bytes]] = field(default_factory=dict)
    retry: list[Scheduled] = field(default_factory=list)
    """Returned by a failed append: the next batch starts with all of them, so no higher
    publishing id is written while their stale intents could be read as delivered."""
    intent_of: dict[bytes, int] = field(default_factory=dict)
    """The latest dispatch intent of each pending message that has one (in flight, or
    returned by a failed append): a checkpoint carries it."""
    checkpoint_through: int = 0
    """The scan position the last checkpoint summarized (where a restart's replay keeps
    everything from); 0 before the first."""
    checkpoint_next: int = 0
    """The offset after the last checkpoint record: the records appended since count
    towards the next one (its own carries do not)."""
    _heap: list[tuple[int, int, bytes]] = field(default_factory=list)

    # ----------------------------------------------------------------- placing

    def frontier(self, now_ms: int) -> int:
        """The last hour whose messages belong in the working set now."""
        return max(self.pulled_through, hour_of(now_ms + self.horizon_ms))

    def where(self, msg_id: bytes) -> Place | None:
        for name, table in (
            ("working", self.working),
            ("parking", self.parking),
            ("parked", self.parked),
            ("in_flight", self.in_flight),
        ):
            if msg_id in table:
                return name  # type: ignore[return-value]
        return "finished" if msg_id in self.finished else None

    def accept(self, entry: Scheduled, now_ms: int) -> Place | None:
        """Place a newly scanned message; None when it is known already (a duplicate of a
        message placed, in flight or finished: idempotent by msg id)."""
        if self.where(entry.msg_id) is not None:
            return None
        if hour_of(entry.due_ms) <= self.frontier(now_ms):
            self._to_working(entry)
            return "working"
        self.parking[entry.msg_id] = entry
        return "parking"

    def _to_working(self, entry: Scheduled) -> None:
        self.working[entry.msg_id] = entry
        heapq.heappush(self._heap, (entry.due_ms, entry.offset, entry.msg_id))

    def restore_parked(self, entry: Scheduled) -> None:
        """At rebuild: a message the timer manifest says is in a committed object."""
        self.parked[entry.msg_id] = entry
        self.parked_hours.setdefault(hour_of(entry.due_ms), set()).add(entry.msg_id)

    # ----------------------------------------------------------------- parking

    def take_parking(self) -> dict[int, list[Scheduled]]:
        """Everything waiting to be parked, by hour (the caller writes one object per hour
        and commits the manifest, then calls ``parked_committed`` or ``parking_failed``)."""
        by_hour: dict[int, list[Scheduled]] = {}
        for entry in self.parking.values():
            by_hour.setdefault(hour_of(entry.due_ms), []).append(entry)
        self.parking = {}
        return by_hour

    def parked_committed(self, entries: Iterable[Scheduled], now_ms: int) -> list[Scheduled]:
        """The objects are committed. Entries whose hour was pulled meanwhile (or that were
        cancelled meanwhile) do not stay parked: the returned ones go to the working set."""
        to_working = []
        for entry in entries:
            if entry.msg_id in self.finished:
                continue
            if hour_of(entry.due_ms) <= self.pulled_through:
                to_working.append(entry)
                continue
            self.restore_parked(entry)
        return to_working

    def parking_failed(self, entries: Iterable[Scheduled]) -> None:
        for entry in entries:
            if entry.msg_id not in self.finished:
                self.parking[entry.msg_id] = entry

    # ----------------------------------------------------------------- pulling

    def hours_to_pull(self, now_ms: int) -> list[int]:
        frontier = hour_of(now_ms + self.horizon_ms)
        return sorted(h for h in self.parked_hours if h <= frontier)

    def parked_of_hour(self, hour: int) -> dict[bytes, Scheduled]:
        return {m: self.parked[m] for m in self.parked_hours.get(hour, ()) if m in self.parked}

    def pulled(self, hour: int) -> None:
        """Every parked message of ``hour`` was written to the working set."""
        for msg_id in self.parked_hours.pop(hour, set()):
            entry = self.parked.pop(msg_id, None)
            if entry is not None:
                self._to_working(entry)
        self.pulled_through = max(self.pulled_through, hour)

    def move_parking_to_working(self, now_ms: int) -> list[Scheduled]:
        """Messages waiting to be parked whose hour reached the frontier go to the working
        set instead (the caller writes them there)."""
        frontier = self.frontier(now_ms)
        moved = [e for e in self.parking.values() if hour_of(e.due_ms) <= frontier]
        for entry in moved:
            del self.parking[entry.msg_id]
            self._to_working(entry)
        return moved

    # ----------------------------------------------------------------- dispatching

    def due(self, now_ms: int, limit: int) -> list[Scheduled]:
        """Working messages due at ``now_ms``, earliest first (never one due later); every
        message returned by a failed append comes first, whatever ``limit`` says."""
        out = [e for e in self.retry if self.working.get(e.msg_id) is e]
        if any(e.due_ms > now_ms for e in out):
            return []  # the clock went back: wait rather than send one of them early
        chosen = {e.msg_id for e in out}
        heap = self._heap
        popped: list[Scheduled] = []
        while heap and len(out) < limit:
            due, _offset, msg_id = heap[0]
            entry = self.working.get(msg_id)
            if entry is None or entry.due_ms != due:
                heapq.heappop(heap)  # removed or moved since it was pushed
                continue
            if msg_id in chosen:
                heapq.heappop(heap)
                popped.append(entry)
                continue
            if due > now_ms:
                break
            heapq.heappop(heap)
            out.append(entry)
            popped.append(entry)
        for entry in popped:  # still in the working set until begin_dispatch
            heapq.heappush(heap, (entry.due_ms, entry.offset, entry.msg_id))
        return out

    def begin_dispatch(self, entries: list[Scheduled]) -> int:
        """Move a batch in flight; returns the publishing id of its first message."""
        first = self.next_pid
        self.retry = []
        for k, entry in enumerate(entries):
            del self.working[entry.msg_id]
            self.in_flight[entry.msg_id] = entry
            self.intent_of[entry.msg_id] = first + k
        self.next_pid += len(entries)
        return first

    def dispatch_settled(
        self, entries: list[Scheduled], first_pid: int, producer_sequence: int
    ) -> tuple[list[Scheduled], list[Scheduled]]:
        """(delivered, returned): a message whose publishing id is at or below the stream's
        producer sequence was appended; any other goes back to the working set."""
        delivered, returned = [], []
        for k, entry in enumerate(entries):
            self.in_flight.pop(entry.msg_id, None)
            if first_pid + k <= producer_sequence:
                self.finished.add(entry.msg_id)
                self.intent_of.pop(entry.msg_id, None)
                delivered.append(entry)
            else:
                self._to_working(entry)
                returned.append(entry)
        self.retry = returned + [e for e in self.retry if e.msg_id in self.working]
        self.next_pid = max(self.next_pid, producer_sequence + 1)
        return delivered, returned

    def retire_hours(self, retired: Iterable[int]) -> list[int]:
        """Retired hours (pulled; their objects still exist) none of whose messages is
        waiting any more: their objects can go."""
        waiting = {hour_of(e.due_ms) for e in self.working.values()}
        waiting |= {hour_of(e.due_ms) for e in self.in_flight.values()}
        return [h for h in retired if h <= self.pulled_through and h not in waiting]

    # ----------------------------------------------------------------- cancelling

    def cancel(self, msg_id: bytes) -> Place | None:
        """Forget a scheduled message; where it was (None: unknown; ``in_flight`` and
        ``finished`` are not cancelled: it is being or was delivered)."""
        place = self.where(msg_id)
        if place in ("working", "parking", "parked"):
            self.working.pop(msg_id, None)
            self.parking.pop(msg_id, None)
            entry = self.parked.pop(msg_id, None)
            if entry is not None:
                self.parked_hours.get(hour_of(entry.due_ms), set()).discard(msg_id)
            self.intent_of.pop(msg_id, None)
            self.finished.add(msg_id)
        return place

    # ----------------------------------------------------------------- checkpoints

    def should_checkpoint(self, scan_next: int, min_records: int) -> bool:
        """Time for a checkpoint: at least ``min_records`` records and at least as many
        records as are pending were appended since the last one's record (so carrying the
        pending messages forward costs at most one record per record appended, and a
        checkpoint's own carries never call for the next one)."""
        return scan_next - self.checkpoint_next >= max(min_records, self.count(), 1)

    def checkpoint_entries(self) -> list[tuple[Scheduled, bool, int]]:
        """Every pending message as a checkpoint carries it: (entry, parked, latest intent
        or 0), earliest due first. Nothing may be in flight (the caller holds the round)."""
        if self.in_flight:
            raise SystemRecordError("a checkpoint cannot be taken while a batch is in flight")
        out = [(e, False, self.intent_of.get(m, 0)) for m, e in self.working.items()]
        out += [(e, False, self.intent_of.get(m, 0)) for m, e in self.parking.items()]
        out += [(e, True, self.intent_of.get(m, 0)) for m, e in self.parked.items()]
        out.sort(key=lambda item: (item[0].due_ms, item[0].offset))
        return out

    def relocate(self, msg_id: bytes, offset: int) -> None:
        """A checkpoint's copy of a pending message was scanned at ``offset``: its bytes
        are read from there from now on (retention may drop the older record)."""
        for table in (self.working, self.parking, self.parked):
            entry = table.get(msg_id)
            if entry is None:
                continue
            moved = Scheduled(msg_id, entry.due_ms, offset)
            table[msg_id] = moved
            self.retry = [moved if e is entry else e for e in self.retry]
            return

    def checkpointed(self, through: int, at: int) -> None:
        """The checkpoint record at offset ``at`` was scanned: ids finished before it are
        implied by it."""
        self.finished.clear()
        self.checkpoint_through = max(self.checkpoint_through, through)
        self.checkpoint_next = max(self.checkpoint_next, at + 1)

    # ----------------------------------------------------------------- status

    def count(self) -> int:
        return len(self.working) + len(self.parking) + len(self.parked) + len(self.in_flight)

    def next_due_ms(self) -> int | None:
        dues = [
            min((e.due_ms for e in table.values()), default=None)
            for table in (self.working, self.parking, self.parked, self.in_flight)
        ]
        present = [d for d in dues if d is not None]
        return min(present) if present else None


@dataclass
class Replay:
    """The system stream read from its first offset: which scheduled messages are still
    waiting.

    ``feed`` takes records in offset order; ``live(producer_sequence)`` applies the exactly-
    once rule (a message is delivered iff its latest intent's publishing id is at or below
    the stream's producer sequence). No message bytes are held: an entry's ``offset`` is
    where its bytes are (its SCHEDULE record, or its latest CARRY). At a checkpoint the
    tables keep only the messages it carried and those scheduled at or after its
    ``through``: memory follows what is pending plus the records since the last
    checkpoint, never the stream's history."""

    incarnation: str
    start: int = 0
    """The first offset read (retention may have dropped what was below): a checkpoint
    whose ``through`` is below it may have lost carries and is not checked; the last
    checkpoint always has ``through >= start`` (retention never passes it)."""
    schedules: dict[bytes, Scheduled] = field(default_factory=dict)
    cancelled: set[bytes] = field(default_factory=set)
    latest_intent: dict[bytes, int] = field(default_factory=dict)
    max_pid: int = 0
    carried_by: dict[bytes, int] = field(default_factory=dict)
    """Messages whose latest copy is a CARRY: the checkpoint (``through``) that wrote it."""
    carried_parked: set[bytes] = field(default_factory=set)
    checkpoint_through: int = 0
    checkpoint_next: int = 0
    checkpoints: int = 0

    def feed(self, offset: int, record: SystemRecord) -> None:
        if isinstance(record, Schedule):
            sequence = record.publishing_id if record.reference else offset
            msg_id = msg_id_of(self.incarnation, record.reference, sequence)
            if msg_id not in self.schedules:
                self.schedules[msg_id] = Scheduled(msg_id, record.due_ms, offset)
        elif isinstance(record, Dispatch):
            for k, msg_id in enumerate(record.msg_ids):
                self.latest_intent[msg_id] = record.first_pid + k
            self.max_pid = max(self.max_pid, record.first_pid + len(record.msg_ids) - 1)
        elif isinstance(record, Cancel):
            self.cancelled.add(record.msg_id)
        elif isinstance(record, Carry):
            self._carry(offset, record)
        elif isinstance(record, Checkpoint):
            self._checkpoint(offset, record)

    def _carry(self, offset: int, record: Carry) -> None:
        msg_id = record.msg_id
        self.schedules[msg_id] = Scheduled(msg_id, record.due_ms, offset)
        self.carried_by[msg_id] = record.through
        if record.parked:
            self.carried_parked.add(msg_id)
        else:
            self.carried_parked.discard(msg_id)
        if record.intent:
            self.latest_intent[msg_id] = record.intent
            self.max_pid = max(self.max_pid, record.intent)
        else:
            self.latest_intent.pop(msg_id, None)

    def _checkpoint(self, offset: int, record: Checkpoint) -> None:
        through = record.through
        carried = {m for m, t in self.carried_by.items() if t == through}
        if through >= self.start and len(carried) != record.carried:
            raise SystemRecordError(
                f"checkpoint through {through} names {record.carried} carried messages, "
                f"{len(carried)} were found before it"
            )
        keep = {
            m: e
            for m, e in self.schedules.items()
            if m in carried or (m not in self.carried_by and e.offset >= through)
        }
        self.schedules = keep
        self.cancelled = {m for m in self.cancelled if m in keep}
        self.latest_intent = {m: p for m, p in self.latest_intent.items() if m in keep}
        self.carried_by = {m: t for m, t in self.carried_by.items() if m in keep}
        self.carried_parked = {m for m in self.carried_parked if m in keep}
        self.max_pid = max(self.max_pid, record.next_pid - 1)
        self.checkpoint_through = max(self.checkpoint_through, through)
        self.checkpoint_next = max(self.checkpoint_next, offset + 1)
        self.checkpoints += 1

    def live(self, producer_sequence: int) -> dict[bytes, Scheduled]:
        out = {}
        for msg_id, entry in self.schedules.items():
            if msg_id in self.cancelled:
                continue
            intent = self.latest_intent.get(msg_id)
            if intent is not None and intent <= producer_sequence:
                continue
            out[msg_id] = entry
        return out

    def finished(self, producer_sequence: int) -> set[bytes]:
        return set(self.schedules) - set(self.live(producer_sequence))

    def next_pid(self, producer_sequence: int) -> int:
        return max(self.max_pid, producer_sequence) + 1


def rebuild_state(
    replay: Replay,
    producer_sequence: int,
    horizon_ms: int,
    *,
    pulled_through: int,
    parked_hours: Container[int],
    parked_through: int,
    now_ms: int,
) -> SchedulerState:
    """The state after a restart or takeover, from the replayed system stream, the stream's
    producer sequence and the committed timer manifest (the caller reads, from each entry's
    ``offset``, the bytes of the working messages the message store lacks and of those
    waiting to be parked).

    A message due after the pulled hours counts as parked only when the manifest lists its
    hour and it lies below ``parked_through`` or its checkpoint carried it as parked; any
    other is parked again. A message whose intent was recorded but not appended goes first
    into the next batch (``retry``)."""
    state = SchedulerState(horizon_ms, pulled_through=pulled_through)
    state.next_pid = replay.next_pid(producer_sequence)
    live = replay.live(producer_sequence)
    state.finished = set(replay.schedules) - set(live)
    state.checkpoint_through = replay.checkpoint_through
    state.checkpoint_next = replay.checkpoint_next
    frontier = state.frontier(now_ms)
    carried_parked = replay.carried_parked
    working, parking = state.working, state.parking
    for msg_id, entry in live.items():  # one pass, no per-entry lookups: a fresh state
        hour = hour_of(entry.due_ms)
        if hour <= frontier:
            working[msg_id] = entry
        elif hour in parked_hours and (entry.offset < parked_through or msg_id in carried_parked):
            state.restore_parked(entry)
        else:
            parking[msg_id] = entry
    state._heap = [(e.due_ms, e.offset, m) for m, e in working.items()]
    heapq.heapify(state._heap)
    state.intent_of = {m: p for m, p in replay.latest_intent.items() if m in live}
    state.retry = sorted(
        (e for m, e in working.items() if m in replay.latest_intent),
        key=lambda e: (e.due_ms, e.offset),
    )
    return state
