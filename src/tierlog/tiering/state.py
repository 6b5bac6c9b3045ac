"""The tiering decisions as a pure state machine: events in, effects out.

Nothing here does I/O or reads a clock: every event carries ``now``. The I/O shell
(``tiering.tierer``) feeds it committed chunks and the outcomes of uploads and
commits, and carries out the effects it returns. Because the machine is pure, tests
drive any interleaving of uploads, failures, ambiguous results and restarts
deterministically.

Rules it enforces (docs/design.md, docs/reliability.md):

* Only committed chunks are tiered; fragments are whole consecutive chunks of one
  segment, cut by size, by segment roll and by age. Once cut, a fragment's range is
  fixed: a retry re-sends the same plan, never a re-cut one.
* Uploads run concurrently (bounded); a failed upload is retried with backoff and
  never blocks later uploads (non-stop write).
* Only a contiguous run of uploaded fragments starting at the committed next offset
  is committed to the manifest, one commit at a time, by the commit rule below.
* If an upload adopted an existing object with a different range, the plans after it
  are cancelled and their chunks re-cut from the adopted fragment's next offset;
  cancelled objects are left for garbage collection (nothing at or after the committed
  next offset is ever deleted by the writer).
* A conflict or a deposed writer halts tiering for the stream; nothing is lost locally
  because local data is only freed below ``committed_next``.

The commit rule (the debounce). A commit costs one root PUT (plus branch PUTs in a tall
tree) whatever it holds, so the number of commits is the number of requests beyond the
fragments themselves; it must follow from the fragments, not from how fast they upload.
The uploaded run is cut into batches greedily from ``committed_next``: a batch ends at
the fragment that brings it to ``debounce_count`` fragments or ``debounce_bytes`` bytes
(a large fragment size cannot starve commits: 512 MiB = 8 fragments of 64 MiB; the
stream's settings hold it to half its ``max_lag_bytes``, since uploaded fragments count
as lag until committed). Then

1. a run holding a full batch is committed at once, up to its last batch boundary (the
   rest waits for its own batch);
2. otherwise, while the plan right after the run is uploading or queued (uploads are
   streaming back to back: the run is about to grow), it waits, for at most
   ``max_fragment_age`` after its oldest upload (a cap against uploads that never end);
3. otherwise (nothing in flight would extend it: the stream is idle or slower than the
   store, or the next upload waits to retry) it is committed at once on a flush, else
   ``debounce_seconds`` after its oldest fragment was uploaded.

So a backlog tiered back to back commits once per batch plus once for the tail,
whatever the upload timing (never more; fewer only if a slow commit lets two batches
go in one): with the defaults ≈ 15.5 fragment PUTs and ≈ 2 commit PUTs per GiB. A flush
cuts everything and commits the rest once the last upload in flight lands (committing
earlier pieces would not make it return sooner). A slow stream trades PUTs for
freshness: it commits each fragment ``debounce_seconds`` after its upload. What readers
of the remote tier see is therefore behind the local commit by at most
``max_fragment_age`` (the cut) + the upload + ``debounce_seconds`` on a slow stream,
and on a streaming one by the time to upload one batch (capped at
``max_fragment_age``). Streams that confirm on the remote tier (ack = remote) set
``debounce_count = 1``: every fragment is a batch, every uploaded run is committed at
once, whole.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from tierlog.errors import ConfigError
from tierlog.remote.fragments import FragmentEntry

MIB = 1 << 20
DEBOUNCE_BYTES = 512 * MIB  # default commit batch: 8 fragments of the default 64 MiB


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """A committed local chunk, as tiering needs to know it."""

    chunk_id: int
    next_offset: int  # chunk_id + number of offsets the chunk occupies
    timestamp: int  # ms
    epoch: int
    segment: int  # first offset of the segment file holding the chunk
    position: int  # byte position of the chunk in the segment file
    size: int  # total bytes of the chunk (header, bloom, data, trailer)
    data_crc: int
    chunk_type: int


@dataclass(frozen=True, slots=True)
class FragmentPlan:
    """A cut fragment: its range and chunks are fixed for every upload attempt."""

    plan_id: int
    segment: int
    seq: int  # fragment sequence number within its segment
    chunks: tuple[ChunkRef, ...]

    @property
    def first_offset(self) -> int:
        return self.chunks[0].chunk_id

    @property
    def next_offset(self) -> int:
        return self.chunks[-1].next_offset

    @property
    def position(self) -> int:
        return self.chunks[0].position

    @property
    def data_size(self) -> int:
        return sum(c.size for c in self.chunks)

    def entry(self, key: str) -> FragmentEntry:
        """What the manifest records once this plan is uploaded as the object ``key``."""
        return FragmentEntry(
            key=key,
            first_offset=self.first_offset,
            next_offset=self.next_offset,
            min_timestamp=min(c.timestamp for c in self.chunks),
            max_timestamp=max(c.timestamp for c in self.chunks),
            data_size=self.data_size,
            chunk_count=len(self.chunks),
        )


@dataclass(frozen=True, slots=True)
class TieringConfig:
    fragment_bytes: int = 64 * MIB
    max_fragment_age: float = 60.0
    max_uploads: int = 4
    debounce_count: int = 8
    debounce_seconds: float = 2.0
    debounce_bytes: int = DEBOUNCE_BYTES
    retry_base: float = 0.5
    retry_max: float = 30.0
    # The local log's segment size: lets the cutter give a segment's last fragment the
    # segment's small remainder instead of cutting a runt fragment (fewer PUTs).
    segment_bytes: int | None = None

    def __post_init__(self) -> None:
        # Users are held to 1 MiB .. 1 GiB by the stream settings; the machine itself
        # accepts any positive size so tests can cut many small fragments.
        if self.fragment_bytes < 1 or self.fragment_bytes > 1024 * MIB:
            raise ConfigError("tier.fragment_bytes must be in 1 B .. 1 GiB")
        if self.max_fragment_age <= 0 or self.debounce_seconds < 0:
            raise ConfigError("tier.max_fragment_age must be > 0, debounce_seconds >= 0")
        if self.max_uploads < 1 or self.debounce_count < 1 or self.debounce_bytes < 1:
            raise ConfigError(
                "tier.max_uploads, tier.debounce_count and tier.debounce_bytes must be >= 1"
            )
        if self.retry_base <= 0 or self.retry_max < self.retry_base:
            raise ConfigError("tier.retry_base must be > 0 and <= retry_max")


# --- events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunksCommitted:
    """The local commit offset advanced over these chunks (in offset order)."""

    chunks: tuple[ChunkRef, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; re-evaluate age cuts, retries and debounce."""


@dataclass(frozen=True, slots=True)
class Flush:
    """Cut and commit everything pending now (shutdown, admin call, tests)."""


@dataclass(frozen=True, slots=True)
class UploadSucceeded:
    """The fragment object exists remotely: uploaded, or adopted with ``entry``'s range."""

    plan_id: int
    entry: FragmentEntry


@dataclass(frozen=True, slots=True)
class UploadFailed:
    """The upload failed; ``retryable`` False means a conflict that halts tiering."""

    plan_id: int
    reason: str
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class CommitSucceeded:
    """The conditional put of the new root took effect (possibly found on re-read)."""

    commit_id: int


@dataclass(frozen=True, slots=True)
class CommitFailed:
    """The commit did not take effect. ``deposed``: a newer epoch owns the stream."""

    commit_id: int
    reason: str
    deposed: bool = False


Event = (
    ChunksCommitted | Tick | Flush | UploadSucceeded | UploadFailed | CommitSucceeded | CommitFailed
)


# --- effects ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartUpload:
    plan: FragmentPlan
    attempt: int


@dataclass(frozen=True, slots=True)
class StartCommit:
    """Append these entries (contiguous from ``committed_next``) to the manifest and
    commit: branch PUTs → root PUT → conditional put."""

    commit_id: int
    entries: tuple[FragmentEntry, ...]


@dataclass(frozen=True, slots=True)
class Halt:
    reason: str


Effect = StartUpload | StartCommit | Halt


# --- the machine --------------------------------------------------------------------


class PlanStatus(Enum):
    QUEUED = "queued"
    UPLOADING = "uploading"
    WAITING_RETRY = "waiting-retry"
    UPLOADED = "uploaded"
    COMMITTING = "committing"


@dataclass(slots=True)
class _PlanState:
    plan: FragmentPlan
    status: PlanStatus = PlanStatus.QUEUED
    attempts: int = 0
    retry_at: float = 0.0
    uploaded_at: float = 0.0
    entry: FragmentEntry | None = None


@dataclass(slots=True)
class TieringState:
    """Per-stream tiering state. Construct after resolution with the committed
    manifest's next offset and, if its last fragment is in a segment the log still
    appends to, that fragment's (segment, seq)."""

    config: TieringConfig
    committed_next: int
    last_fragment: tuple[int, int] | None = None  # (segment, seq) of the last fragment
    halted: str | None = None
    commits: int = 0
    upload_attempts: int = 0
    # Pending chunks (handed over, not cut) are held in two parts so that no event
    # rescans them: ``_open`` is the fragment being filled (consecutive chunks of one
    # segment, its running size and size limit kept alongside), ``_unscanned`` the
    # chunks accepted since the last cut pass (only non-empty inside ``handle``, or
    # after a halt). Each chunk is looked at a constant number of times.
    _open: list[tuple[ChunkRef, float]] = field(default_factory=list)
    _open_size: int = 0
    _open_limit: int = 0
    _unscanned: deque[tuple[ChunkRef, float]] = field(default_factory=deque)
    _plans: list[_PlanState] = field(default_factory=list)
    _uploading: int = 0  # plans in UPLOADING
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
        if self._unscanned:
            return self._unscanned[-1][0].next_offset
        if self._open:
            return self._open[-1][0].next_offset
        return self._cut_next

    @property
    def pending_chunks(self) -> int:
        """Chunks handed over and not yet cut into a fragment."""
        return len(self._open) + len(self._unscanned)

    def plans(self) -> list[tuple[FragmentPlan, PlanStatus]]:
        return [(p.plan, p.status) for p in self._plans]

    def in_flight(self) -> int:
        return self._uploading

    def idle(self) -> bool:
        """Nothing pending, cut or committing: everything handed over is durable."""
        return not self._open and not self._unscanned and not self._plans and self._commit is None

    def _first_pending_seen(self) -> float | None:
        if self._open:
            return self._open[0][1]
        if self._unscanned:
            return self._unscanned[0][1]
        return None

    def next_deadline(self) -> float | None:
        """The earliest time at which a Tick may produce effects."""
        if self.halted:
            return None
        times: list[float] = []
        first_seen = self._first_pending_seen()
        if first_seen is not None:
            times.append(first_seen + self.config.max_fragment_age)
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
            self._unscanned.append((chunk, now))
            self._lag_bytes += chunk.size

    def _cut(self, now: float) -> None:
        """Move the unscanned chunks into the open fragment, cutting it whenever the next
        chunk is in another segment (a segment roll ends the fragment) or would overflow
        its size limit; then cut the open fragment if it reached its limit, is old enough,
        or a flush is on. The first chunk of a fragment is always taken, even if larger
        than the limit. Cost: constant per chunk, whatever the number pending."""
        unscanned = self._unscanned
        while unscanned:
            item = unscanned.popleft()
            chunk = item[0]
            if self._open and (
                chunk.segment != self._open[0][0].segment
                or self._open_size + chunk.size > self._open_limit
            ):
                self._cut_open()
            if not self._open:
                self._open_limit = self._size_limit(chunk)
            self._open.append(item)
            self._open_size += chunk.size
        if not self._open:
            return
        full = self._open_size >= self._open_limit
        aged = now - self._open[0][1] >= self.config.max_fragment_age
        if full or aged or self._flush:
            self._cut_open()

    def _cut_open(self) -> None:
        chunks = tuple(c for c, _ in self._open)
        self._open = []
        self._open_size = 0
        self._plans.append(_PlanState(plan=self._new_plan(chunks)))
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
                self._uploading += 1
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
        self._uploading -= 1
        p.uploaded_at = now
        p.entry = entry
        if entry.next_offset == p.plan.next_offset:
            return
        # Adopted an existing object with another range: cancel every later plan and
        # re-cut their chunks (and ours beyond the adopted range) from entry.next_offset.
        # Cancelled uploads are forgotten; their objects are left for garbage collection.
        returned = [(c, now) for c in p.plan.chunks]
        for later in self._plans[i + 1 :]:
            if later.status is PlanStatus.UPLOADING:
                self._uploading -= 1
            returned.extend((c, now) for c in later.plan.chunks)
        del self._plans[i + 1 :]
        returned.extend(self._open)
        returned.extend(self._unscanned)
        self._open = []
        self._open_size = 0
        self._unscanned = deque(
            (c, seen) for c, seen in returned if c.chunk_id >= entry.next_offset
        )
        self._cut_next = entry.next_offset
        self._lag_bytes = self._recount_lag()
        self.last_fragment = (p.plan.segment, p.plan.seq)

    def _recount_lag(self) -> int:
        total = sum(c.size for c, _ in self._open) + sum(c.size for c, _ in self._unscanned)
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
        self._uploading -= 1
        p.retry_at = now + self._backoff(p.attempts)

    def _backoff(self, attempts: int) -> float:
        return min(self.config.retry_max, self.config.retry_base * (2 ** max(0, attempts - 1)))

    def _run(self) -> list[_PlanState]:
        """The leading run of uploaded plans, contiguous from committed_next."""
        run: list[_PlanState] = []
        expected = self.committed_next
        for p in self._plans:
            if p.status is not PlanStatus.UPLOADED or p.entry is None:
                break
            if p.entry.first_offset != expected:
                break
            run.append(p)
            expected = p.entry.next_offset
        return run

    def _batched_length(self, run: list[_PlanState]) -> int:
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

    def _commit_plan(self, run: list[_PlanState]) -> tuple[float, int]:
        """When the run is committed (the module docstring's commit rule), and how many of
        its plans: up to its last batch boundary when it holds a full batch, else all."""
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
