"""The tiering state machine as it was before its pending chunks were kept incrementally:
every event rescanned all pending chunks to find the next cut. Kept verbatim (only
renamed; its commit rule follows the current one, restated) as the oracle the
incremental ``TieringState`` must match decision for decision
(tests/tiering/test_state.py), and as the "old" side of benches/tiering_state.py.
It shares the event, effect and value types of ``tierlog.tiering.state``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tierlog.tiering.state import (
    ChunkRef,
    ChunksCommitted,
    CommitFailed,
    CommitSucceeded,
    Effect,
    Event,
    Flush,
    FragmentEntry,
    FragmentPlan,
    Halt,
    PlanStatus,
    StartCommit,
    StartUpload,
    TieringConfig,
    UploadFailed,
    UploadSucceeded,
)


@dataclass(slots=True)
class _ReferencePlanState:
    plan: FragmentPlan
    status: PlanStatus = PlanStatus.QUEUED
    attempts: int = 0
    retry_at: float = 0.0
    uploaded_at: float = 0.0
    entry: FragmentEntry | None = None


@dataclass(slots=True)
class ReferenceTieringState:
    """Per-stream tiering state. Construct after resolution with the committed
    manifest's next offset and, if its last fragment is in a segment the log still
    appends to, that fragment's (segment, seq)."""

    config: TieringConfig
    committed_next: int
    last_fragment: tuple[int, int] | None = None  # (segment, seq) of the last fragment
    halted: str | None = None
    commits: int = 0
    upload_attempts: int = 0
    _pending: deque[tuple[ChunkRef, float]] = field(default_factory=deque)
    _plans: list[_ReferencePlanState] = field(default_factory=list)
    _cut_next: int = -1
    _next_plan_id: int = 1
    _commit: tuple[int, int] | None = None  # (commit id, number of plans in it)
    _commit_retry_at: float = 0.0
    _commit_failures: int = 0
    _flush: bool = False
    _lag_bytes: int = 0

    def __post_init__(self) -> None:
        if self._cut_next < 0:
            self._cut_next = self.committed_next

    # -- queries ---------------------------------------------------------------------
    @property
    def lag_bytes(self) -> int:
        """Committed local bytes not yet durable in the remote tier."""
        return self._lag_bytes

    @property
    def cut_next(self) -> int:
        """Offset after the last cut fragment (== committed_next when nothing is cut)."""
        return self._cut_next

    @property
    def pending_offset(self) -> int:
        """Offset after the last chunk handed to the machine."""
        if self._pending:
            return self._pending[-1][0].next_offset
        return self._cut_next

    def plans(self) -> list[tuple[FragmentPlan, PlanStatus]]:
        return [(p.plan, p.status) for p in self._plans]

    def in_flight(self) -> int:
        return sum(1 for p in self._plans if p.status is PlanStatus.UPLOADING)

    def idle(self) -> bool:
        """Nothing pending, cut or committing: everything handed over is durable."""
        return not self._pending and not self._plans and self._commit is None

    def next_deadline(self) -> float | None:
        """The earliest time at which a Tick may produce effects."""
        if self.halted:
            return None
        times: list[float] = []
        if self._pending:
            times.append(self._pending[0][1] + self.config.max_fragment_age)
        for p in self._plans:
            if p.status is PlanStatus.WAITING_RETRY:
                times.append(p.retry_at)
        run = self._run()
        if run and self._commit is None:
            times.append(max(self._commit_retry_at, self._commit_plan(run)[0]))
        return min(times) if times else None

    # -- transitions -----------------------------------------------------------------
    def handle(self, event: Event, now: float) -> list[Effect]:
        if self.halted:
            return []
        effects: list[Effect] = []
        if isinstance(event, ChunksCommitted):
            self._accept_chunks(event.chunks, now, effects)
        elif isinstance(event, Flush):
            self._flush = True
        elif isinstance(event, UploadSucceeded):
            self._upload_succeeded(event, now)
        elif isinstance(event, UploadFailed):
            self._upload_failed(event, now, effects)
        elif isinstance(event, CommitSucceeded):
            self._commit_succeeded(event)
        elif isinstance(event, CommitFailed):
            self._commit_failed(event, now, effects)
        if self.halted:
            return effects
        self._cut(now)
        self._schedule_uploads(now, effects)
        self._maybe_commit(now, effects)
        if self._flush and self.idle():
            self._flush = False
        return effects

    def _halt(self, reason: str, effects: list[Effect]) -> None:
        self.halted = reason
        effects.append(Halt(reason))

    def _accept_chunks(
        self, chunks: tuple[ChunkRef, ...], now: float, effects: list[Effect]
    ) -> None:
        for chunk in chunks:
            expected = self.pending_offset
            if chunk.next_offset <= expected:
                continue  # already handed over (replay after restart): idempotent
            if chunk.chunk_id != expected:
                self._halt(
                    f"local log gap: expected chunk at offset {expected}, got {chunk.chunk_id}",
                    effects,
                )
                return
            self._pending.append((chunk, now))
            self._lag_bytes += chunk.size

    def _cut(self, now: float) -> None:
        cfg = self.config
        while self._pending:
            first, first_seen = self._pending[0]
            limit = self._size_limit(first)
            take = 0
            size = 0
            full = False
            for chunk, _ in self._pending:
                if chunk.segment != first.segment:
                    full = True  # a segment roll ends the fragment
                    break
                if take and size + chunk.size > limit:
                    full = True
                    break
                take += 1
                size += chunk.size
            if size >= limit:
                full = True
            aged = now - first_seen >= cfg.max_fragment_age
            if not (full or aged or self._flush):
                return
            chunks = tuple(self._pending.popleft()[0] for _ in range(take))
            self._plans.append(_ReferencePlanState(plan=self._new_plan(chunks)))
            self._cut_next = chunks[-1].next_offset

    def _size_limit(self, first: ChunkRef) -> int:
        """Target size of a fragment starting at ``first``: the configured size, or up to
        1.5x for a segment's last fragment when the segment's remainder after a
        full-size fragment would be under half a fragment (no runt fragments)."""
        target = self.config.fragment_bytes
        segment_bytes = self.config.segment_bytes
        if segment_bytes is not None and first.position + target + target // 2 >= segment_bytes:
            return target + target // 2
        return target

    def _new_plan(self, chunks: tuple[ChunkRef, ...]) -> FragmentPlan:
        segment = chunks[0].segment
        if self.last_fragment is not None and self.last_fragment[0] == segment:
            seq = self.last_fragment[1] + 1
        else:
            seq = 0
        self.last_fragment = (segment, seq)
        plan = FragmentPlan(plan_id=self._next_plan_id, segment=segment, seq=seq, chunks=chunks)
        self._next_plan_id += 1
        return plan

    def _schedule_uploads(self, now: float, effects: list[Effect]) -> None:
        slots = self.config.max_uploads - self.in_flight()
        for p in self._plans:
            if slots <= 0:
                return
            ready = p.status is PlanStatus.QUEUED or (
                p.status is PlanStatus.WAITING_RETRY and p.retry_at <= now
            )
            if ready:
                p.status = PlanStatus.UPLOADING
                p.attempts += 1
                self.upload_attempts += 1
                effects.append(StartUpload(plan=p.plan, attempt=p.attempts))
                slots -= 1

    def _find(self, plan_id: int) -> int | None:
        for i, p in enumerate(self._plans):
            if p.plan.plan_id == plan_id:
                return i
        return None  # a cancelled plan: its object is left for GC

    def _upload_succeeded(self, event: UploadSucceeded, now: float) -> None:
        i = self._find(event.plan_id)
        if i is None:
            return
        p = self._plans[i]
        if p.status is not PlanStatus.UPLOADING:
            return
        entry = event.entry
        if entry.first_offset != p.plan.first_offset:
            raise ValueError("adopted fragment must start at the plan's first offset")
        p.status = PlanStatus.UPLOADED
        p.uploaded_at = now
        p.entry = entry
        if entry.next_offset == p.plan.next_offset:
            return
        # Adopted an existing object with another range: cancel every later plan and
        # re-cut their chunks (and ours beyond the adopted range) from entry.next_offset.
        # Cancelled uploads are forgotten; their objects are left for garbage collection.
        returned = [(c, now) for c in p.plan.chunks]
        for later in self._plans[i + 1 :]:
            returned.extend((c, now) for c in later.plan.chunks)
        del self._plans[i + 1 :]
        returned.extend(self._pending)
        self._pending = deque((c, seen) for c, seen in returned if c.chunk_id >= entry.next_offset)
        self._cut_next = entry.next_offset
        self._lag_bytes = self._recount_lag()
        self.last_fragment = (p.plan.segment, p.plan.seq)

    def _recount_lag(self) -> int:
        total = sum(c.size for c, _ in self._pending)
        for p in self._plans:
            if p.entry is not None:
                total += p.entry.data_size
            else:
                total += p.plan.data_size
        return total

    def _upload_failed(self, event: UploadFailed, now: float, effects: list[Effect]) -> None:
        i = self._find(event.plan_id)
        if i is None:
            return
        p = self._plans[i]
        if p.status is not PlanStatus.UPLOADING:
            return
        if not event.retryable:
            reason = f"fragment conflict at offset {p.plan.first_offset}: {event.reason}"
            self._halt(reason, effects)
            return
        p.status = PlanStatus.WAITING_RETRY
        p.retry_at = now + self._backoff(p.attempts)

    def _backoff(self, attempts: int) -> float:
        return min(self.config.retry_max, self.config.retry_base * (2 ** max(0, attempts - 1)))

    def _run(self) -> list[_ReferencePlanState]:
        """The leading run of uploaded plans, contiguous from committed_next."""
        run: list[_ReferencePlanState] = []
        expected = self.committed_next
        for p in self._plans:
            if p.status is not PlanStatus.UPLOADED or p.entry is None:
                break
            if p.entry.first_offset != expected:
                break
            run.append(p)
            expected = p.entry.next_offset
        return run

    def _batched_length(self, run: list[_ReferencePlanState]) -> int:
        """How many plans of the run end at its last batch boundary (0: no full batch).
        Batches are cut greedily from ``committed_next``: a batch ends at the fragment
        that brings it to ``debounce_count`` fragments or ``debounce_bytes`` bytes."""
        cfg = self.config
        length = count = size = 0
        for i, p in enumerate(run):
            count += 1
            size += p.entry.data_size if p.entry is not None else 0
            if count >= cfg.debounce_count or size >= cfg.debounce_bytes:
                length, count, size = i + 1, 0, 0
        return length

    def _commit_plan(self, run: list[_ReferencePlanState]) -> tuple[float, int]:
        """The commit rule of ``tierlog.tiering.state`` (changed there on purpose from the
        old count-or-time debounce; restated here, not imported, so the comparison checks
        it)."""
        cfg = self.config
        batched = self._batched_length(run)
        if batched:
            return 0.0, batched
        oldest = min(p.uploaded_at for p in run)
        cap = oldest + cfg.max_fragment_age
        following = self._plans[len(run)] if len(run) < len(self._plans) else None
        if following is not None and following.status in (
            PlanStatus.UPLOADING,
            PlanStatus.QUEUED,
        ):
            return cap, len(run)  # uploads stream in: the run is about to grow
        if self._flush:
            return 0.0, len(run)
        return min(cap, oldest + cfg.debounce_seconds), len(run)

    def _maybe_commit(self, now: float, effects: list[Effect]) -> None:
        if self._commit is not None or now < self._commit_retry_at:
            return
        run = self._run()
        if not run:
            return
        due, length = self._commit_plan(run)
        if now < due:
            return
        run = run[:length]
        commit_id = self.commits + 1
        self.commits = commit_id
        for p in run:
            p.status = PlanStatus.COMMITTING
        entries = tuple(p.entry for p in run if p.entry is not None)
        self._commit = (commit_id, len(run))
        effects.append(StartCommit(commit_id=commit_id, entries=entries))

    def _commit_succeeded(self, event: CommitSucceeded) -> None:
        if self._commit is None or self._commit[0] != event.commit_id:
            return
        count = self._commit[1]
        done, self._plans = self._plans[:count], self._plans[count:]
        for p in done:
            assert p.entry is not None
            self._lag_bytes -= p.entry.data_size
            self.committed_next = p.entry.next_offset
        self._commit = None
        self._commit_failures = 0
        self._commit_retry_at = 0.0

    def _commit_failed(self, event: CommitFailed, now: float, effects: list[Effect]) -> None:
        if self._commit is None or self._commit[0] != event.commit_id:
            return
        count = self._commit[1]
        for p in self._plans[:count]:
            p.status = PlanStatus.UPLOADED
        self._commit = None
        if event.deposed:
            self._halt(f"deposed: {event.reason}", effects)
            return
        self._commit_failures += 1
        self._commit_retry_at = now + self._backoff(self._commit_failures)
