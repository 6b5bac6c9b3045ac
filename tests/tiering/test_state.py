"""The tiering state machine under random interleavings, failures, ambiguous results
and crashes, against an in-memory model of the remote tier.

The model plays the I/O shell: create-only fragment objects keyed by first offset,
adoption of an existing object when its chunks match the log, a manifest with a
versioned pointer, commits that may fail before or after taking effect, and crashes
that lose all in-memory state followed by resolution (follow next pointers).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.tiering.state_reference import ReferenceTieringState
from tierlog.errors import ConfigError
from tierlog.remote.fragments import FragmentEntry
from tierlog.tiering.state import (
    ChunkRef,
    ChunksCommitted,
    CommitFailed,
    CommitSucceeded,
    Flush,
    FragmentPlan,
    Halt,
    StartCommit,
    StartUpload,
    Tick,
    TieringConfig,
    TieringState,
    UploadFailed,
    UploadSucceeded,
)

KEY = "stream/s/data/fragment"  # the state machine carries the key, never reads it


def make_chunk(
    chunk_id: int, records: int, size: int, segment: int, ts: int, position: int = 0
) -> ChunkRef:
    return ChunkRef(
        chunk_id=chunk_id,
        next_offset=chunk_id + records,
        timestamp=ts,
        epoch=1,
        segment=segment,
        position=position,
        size=size,
        data_crc=chunk_id,
        chunk_type=0,
    )


def entry_of(chunks: list[ChunkRef]) -> FragmentEntry:
    return FragmentPlan(plan_id=0, segment=chunks[0].segment, seq=0, chunks=tuple(chunks)).entry(
        KEY
    )


class TieringMachine(RuleBasedStateMachine):
    @initialize(
        fragment_bytes=st.integers(40, 400),
        max_uploads=st.integers(1, 4),
        debounce_count=st.integers(1, 5),
        segment_bytes=st.none() | st.integers(100, 2000),
    )
    def setup(
        self, fragment_bytes: int, max_uploads: int, debounce_count: int, segment_bytes: int | None
    ) -> None:
        self.config = TieringConfig(
            segment_bytes=segment_bytes,
            fragment_bytes=fragment_bytes,
            max_fragment_age=5.0,
            max_uploads=max_uploads,
            debounce_count=debounce_count,
            debounce_seconds=2.0,
            retry_base=0.5,
            retry_max=4.0,
        )
        self.now = 0.0
        self.log: list[ChunkRef] = []  # the committed local log
        self.segment = 0
        self.remote: dict[int, FragmentEntry] = {}  # create-only objects by first offset
        self.manifest: list[FragmentEntry] = []
        self.uploads: list[StartUpload] = []
        self.commit: StartCommit | None = None
        self.state = TieringState(self.config, committed_next=0)
        self.halted: str | None = None

    # -- helpers -------------------------------------------------------------------
    def manifest_next(self) -> int:
        return self.manifest[-1].next_offset if self.manifest else 0

    def apply(self, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, StartUpload):
                assert effect.plan.first_offset >= self.state.committed_next
                self.uploads.append(effect)
            elif isinstance(effect, StartCommit):
                assert self.commit is None
                assert effect.entries[0].first_offset == self.manifest_next()
                self.commit = effect
            elif isinstance(effect, Halt):
                self.halted = effect.reason

    def feed(self, event: object) -> None:
        self.apply(self.state.handle(event, self.now))  # type: ignore[arg-type]

    def chunks_matching(self, entry: FragmentEntry) -> bool:
        ids = [c.chunk_id for c in self.log]
        return entry.first_offset in ids and (
            entry.next_offset in ids or entry.next_offset == self.log[-1].next_offset
        )

    # -- the outside world -----------------------------------------------------------
    @rule(
        records=st.integers(1, 5),
        size=st.integers(1, 150),
        roll=st.booleans(),
        batch=st.integers(1, 4),
    )
    def append_and_commit_locally(self, records: int, size: int, roll: bool, batch: int) -> None:
        new = []
        for _ in range(batch):
            if roll and self.log:
                self.segment = self.log[-1].next_offset
                roll = False
            start = self.log[-1].next_offset if self.log else 0
            prev = self.log[-1] if self.log and self.log[-1].segment == self.segment else None
            position = prev.position + prev.size if prev else 8
            chunk = make_chunk(start, records, size, self.segment, int(self.now * 1000), position)
            self.log.append(chunk)
            new.append(chunk)
        self.feed(ChunksCommitted(tuple(new)))

    @rule(dt=st.floats(0.1, 8.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick())

    @rule()
    def flush(self) -> None:
        self.feed(Flush())

    @precondition(lambda self: self.uploads)
    @rule(i=st.integers(0, 10), outcome=st.sampled_from(["ok", "fail", "ambiguous"]))
    def upload_completes(self, i: int, outcome: str) -> None:
        upload = self.uploads.pop(i % len(self.uploads))
        plan = upload.plan
        key = plan.first_offset
        if outcome == "fail":
            self.feed(UploadFailed(plan.plan_id, "injected error before the put"))
            return
        if key not in self.remote:
            self.remote[key] = plan.entry(KEY)  # the create-only put takes effect
            if outcome == "ambiguous":
                self.feed(UploadFailed(plan.plan_id, "timeout after the put took effect"))
                return
            self.feed(UploadSucceeded(plan.plan_id, plan.entry(KEY)))
            return
        # AlreadyExists: adopt the existing object (it is ours: it matches the log).
        existing = self.remote[key]
        assert self.chunks_matching(existing)
        self.feed(UploadSucceeded(plan.plan_id, existing))

    @precondition(lambda self: self.commit is not None)
    @rule(outcome=st.sampled_from(["ok", "fail", "applied-but-failed", "deposed"]))
    def commit_completes(self, outcome: str) -> None:
        commit = self.commit
        assert commit is not None
        self.commit = None
        if outcome in ("ok", "applied-but-failed"):
            self.manifest.extend(commit.entries)
        if outcome == "ok":
            self.feed(CommitSucceeded(commit.commit_id))
        elif outcome == "applied-but-failed":
            # The shell re-reads the pointer, finds its own root, and reports success.
            self.feed(CommitSucceeded(commit.commit_id))
        elif outcome == "fail":
            self.feed(CommitFailed(commit.commit_id, "version conflict"))
        else:
            self.feed(CommitFailed(commit.commit_id, "newer epoch", deposed=True))

    @rule()
    def crash_and_resolve(self) -> None:
        """Lose all in-memory state; resolve by following next pointers; fence; resume."""
        self.uploads.clear()
        self.commit = None
        next_offset = self.manifest_next()
        while next_offset in self.remote:
            entry = self.remote[next_offset]
            self.manifest.append(entry)  # adopted by the fencing commit
            next_offset = entry.next_offset
        last = None
        if self.manifest:
            last_entry = self.manifest[-1]
            seg = next(c.segment for c in self.log if c.chunk_id == last_entry.first_offset)
            last = (seg, 0)
        self.state = TieringState(self.config, committed_next=next_offset, last_fragment=last)
        self.halted = None
        self.feed(ChunksCommitted(tuple(c for c in self.log if c.chunk_id >= next_offset)))

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def manifest_is_contiguous_and_chunk_aligned(self) -> None:
        expected = 0
        boundaries = {c.chunk_id for c in self.log}
        for entry in self.manifest:
            assert entry.first_offset == expected, (entry, expected)
            assert entry.next_offset > entry.first_offset
            assert entry.first_offset in boundaries
            expected = entry.next_offset
        total = sum(e.data_size for e in self.manifest)
        covered = sum(c.size for c in self.log if c.next_offset <= expected)
        assert total == covered

    @invariant()
    def committed_next_is_durable(self) -> None:
        # Local data may be freed below committed_next: it must be in the manifest.
        assert self.state.committed_next <= self.manifest_next()

    @invariant()
    def lag_counts_exactly_the_undurable_bytes(self) -> None:
        if self.halted:
            return
        handed = self.state.pending_offset
        expected = sum(c.size for c in self.log if self.state.committed_next <= c.chunk_id < handed)
        assert self.state.lag_bytes == expected

    @invariant()
    def uploads_bounded(self) -> None:
        assert self.state.in_flight() <= self.config.max_uploads

    def teardown(self) -> None:
        """Liveness: with no more failures, everything committed locally reaches the manifest."""
        if not hasattr(self, "state") or self.halted:
            return
        self.feed(Flush())
        for _ in range(10_000):
            if self.commit is not None:
                commit = self.commit
                self.commit = None
                self.manifest.extend(commit.entries)
                self.feed(CommitSucceeded(commit.commit_id))
            elif self.uploads:
                upload = self.uploads.pop(0)
                key = upload.plan.first_offset
                entry = self.remote.setdefault(key, upload.plan.entry(KEY))
                self.feed(UploadSucceeded(upload.plan.plan_id, entry))
            else:
                deadline = self.state.next_deadline()
                if deadline is None:
                    break
                self.now = max(self.now, deadline) + 0.01
                self.feed(Tick())
            if self.state.idle():
                break
        note(f"manifest={self.manifest}")
        end = self.log[-1].next_offset if self.log else 0
        assert self.manifest_next() == end
        assert self.state.committed_next == end
        assert self.state.lag_bytes == 0


TestTieringMachine = TieringMachine.TestCase


def test_fragment_is_cut_by_size_and_never_spans_segments() -> None:
    state = TieringState(
        TieringConfig(fragment_bytes=100, max_fragment_age=60.0, max_uploads=8),
        committed_next=0,
    )
    chunks = [make_chunk(i, 1, 40, 0 if i < 5 else 5, 0) for i in range(8)]
    effects = state.handle(ChunksCommitted(tuple(chunks)), now=0.0)
    uploads = [e.plan for e in effects if isinstance(e, StartUpload)]
    # 40+40 fits 100, a third chunk would not; chunk 4 is alone (segment roll at 5);
    # 5..6 is full; chunk 7 waits for more data or for its age.
    cuts = [(p.first_offset, p.next_offset) for p in uploads]
    assert cuts == [(0, 2), (2, 4), (4, 5), (5, 7)]
    assert all(len({c.segment for c in p.chunks}) == 1 for p in uploads)
    assert [p.seq for p in uploads] == [0, 1, 2, 0]
    assert state.handle(Tick(), now=59.0) == []
    (aged,) = state.handle(Tick(), now=60.0)
    assert isinstance(aged, StartUpload)
    assert (aged.plan.first_offset, aged.plan.next_offset) == (7, 8)


def test_quiet_stream_cut_by_age_then_committed_after_debounce() -> None:
    cfg = TieringConfig(fragment_bytes=1 << 20, max_fragment_age=60.0, debounce_seconds=2.0)
    state = TieringState(cfg, committed_next=0)
    assert state.handle(ChunksCommitted((make_chunk(0, 1, 10, 0, 0),)), now=0.0) == []
    assert state.next_deadline() == 60.0
    (upload,) = state.handle(Tick(), now=60.0)
    assert isinstance(upload, StartUpload)
    assert (
        state.handle(UploadSucceeded(upload.plan.plan_id, upload.plan.entry(KEY)), now=60.5) == []
    )
    assert state.next_deadline() == pytest.approx(62.5)
    (commit,) = state.handle(Tick(), now=62.5)
    assert isinstance(commit, StartCommit)
    state.handle(CommitSucceeded(commit.commit_id), now=62.6)
    assert state.committed_next == 1 and state.idle()


def test_failed_upload_does_not_block_later_uploads_or_reorder_commits() -> None:
    cfg = TieringConfig(fragment_bytes=10, max_uploads=3, debounce_count=1)
    state = TieringState(cfg, committed_next=0)
    effects = state.handle(ChunksCommitted(tuple(make_chunk(i, 1, 10, 0, 0) for i in range(3))), 0)
    p0, p1, p2 = (e.plan for e in effects if isinstance(e, StartUpload))
    state.handle(UploadFailed(p0.plan_id, "boom"), 0.1)
    # Later uploads finish; nothing is committed past the gap.
    assert state.handle(UploadSucceeded(p1.plan_id, p1.entry(KEY)), 0.2) == []
    assert state.handle(UploadSucceeded(p2.plan_id, p2.entry(KEY)), 0.3) == []
    (retry,) = state.handle(Tick(), 0.6)
    assert isinstance(retry, StartUpload) and retry.plan == p0 and retry.attempt == 2
    (commit,) = state.handle(UploadSucceeded(p0.plan_id, p0.entry(KEY)), 0.7)
    assert isinstance(commit, StartCommit)
    assert [e.first_offset for e in commit.entries] == [0, 1, 2]


def test_conflict_and_deposed_halt() -> None:
    cfg = TieringConfig(fragment_bytes=10, debounce_count=1)
    state = TieringState(cfg, committed_next=0)
    (up,) = state.handle(ChunksCommitted((make_chunk(0, 1, 10, 0, 0),)), 0)
    assert isinstance(up, StartUpload)
    (halt,) = state.handle(UploadFailed(up.plan.plan_id, "index mismatch", retryable=False), 1)
    assert isinstance(halt, Halt) and state.halted
    assert state.handle(Tick(), 2) == []

    state = TieringState(cfg, committed_next=0)
    (up,) = state.handle(ChunksCommitted((make_chunk(0, 1, 10, 0, 0),)), 0)
    assert isinstance(up, StartUpload)
    (commit,) = state.handle(UploadSucceeded(up.plan.plan_id, up.plan.entry(KEY)), 0)
    assert isinstance(commit, StartCommit)
    (halt,) = state.handle(CommitFailed(commit.commit_id, "epoch 3 > 2", deposed=True), 1)
    assert isinstance(halt, Halt) and "deposed" in halt.reason
    assert state.committed_next == 0


def test_adopting_a_longer_fragment_recuts_the_rest() -> None:
    cfg = TieringConfig(fragment_bytes=10, max_uploads=4, debounce_count=10)
    state = TieringState(cfg, committed_next=0)
    chunks = [make_chunk(i, 1, 10, 0, 0) for i in range(4)]
    effects = state.handle(ChunksCommitted(tuple(chunks)), 0)
    plans = [e.plan for e in effects if isinstance(e, StartUpload)]
    assert len(plans) == 4
    # An earlier attempt left [0, 3) at key 0: adopt it; plans 1 and 2 are cancelled.
    recut = state.handle(UploadSucceeded(plans[0].plan_id, entry_of(chunks[:3])), 1)
    assert [
        (e.plan.first_offset, e.plan.next_offset) for e in recut if isinstance(e, StartUpload)
    ] == [(3, 4)]
    # Late completions of cancelled plans are ignored.
    state.handle(UploadSucceeded(plans[1].plan_id, plans[1].entry(KEY)), 101)
    assert state.lag_bytes == 40


def test_gap_in_local_log_halts() -> None:
    state = TieringState(TieringConfig(), committed_next=10)
    (halt,) = state.handle(ChunksCommitted((make_chunk(12, 1, 10, 0, 0),)), 0)
    assert isinstance(halt, Halt) and "gap" in halt.reason


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        TieringConfig(fragment_bytes=0)
    with pytest.raises(ConfigError):
        TieringConfig(max_uploads=0)
    with pytest.raises(ConfigError):
        replace(TieringConfig(), retry_base=10, retry_max=1)


def test_replayed_chunks_are_idempotent() -> None:
    state = TieringState(TieringConfig(fragment_bytes=1000), committed_next=0)
    chunk = make_chunk(0, 2, 10, 0, 0)
    state.handle(ChunksCommitted((chunk,)), 0)
    state.handle(ChunksCommitted((chunk,)), 0)
    assert state.lag_bytes == 10


def test_rate_limiter_spaces_reservations_at_the_rate() -> None:
    from tierlog.tiering.rate_limit import RateLimiter

    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    limiter = RateLimiter(1000.0, clock=lambda: now[0], sleep=sleep)
    assert limiter.acquire(500) == 0.0  # the first reservation goes at once
    assert limiter.acquire(500) == pytest.approx(0.5)
    assert limiter.acquire(1000) == pytest.approx(0.5)
    assert sum(slept) == pytest.approx(1.0)  # 2000 bytes at 1000 B/s: 2 s, first free
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_segment_tail_goes_into_the_last_fragment_instead_of_a_runt() -> None:
    cfg = TieringConfig(fragment_bytes=100, segment_bytes=450, max_uploads=10)
    state = TieringState(cfg, committed_next=0)
    # 10-byte chunks from file position 8; the segment rolls after the chunk crossing 450.
    chunks = [make_chunk(i, 1, 10, 0, 0, 8 + 10 * i) for i in range(45)]
    effects = state.handle(ChunksCommitted(tuple(chunks)), 0)
    sizes = [e.plan.data_size for e in effects if isinstance(e, StartUpload)]
    # Full-size fragments until a full one would leave less than half a fragment; that
    # last one takes the segment's remainder (up to 1.5x) instead of leaving a runt.
    assert sizes == [100, 100, 100, 150]
    effects = state.handle(ChunksCommitted((make_chunk(45, 1, 10, 45, 0, 8),)), 0)
    assert not [e for e in effects if isinstance(e, StartUpload)]  # new segment: waits


# --- the incremental machine takes exactly the decisions of the rescanning one -----------


class SameDecisionsAsReference(RuleBasedStateMachine):
    """Feeds the incremental ``TieringState`` and the rescanning reference copy
    (tests/tiering/state_reference.py) the same events and asserts identical effects and
    identical observable state after every step: chunks of varied sizes, segments
    (rolls, positions near a segment's end), timestamps and epochs; replays and gaps;
    upload successes, failures, conflicts and adoptions of shorter or longer objects;
    commit successes, failures and deposition; time passing; flushes; restarts."""

    @initialize(
        fragment_bytes=st.integers(20, 600),
        max_uploads=st.integers(1, 4),
        debounce_count=st.integers(1, 5),
        debounce_seconds=st.sampled_from([0.0, 1.0, 2.0]),
        debounce_bytes=st.integers(20, 3000),
        max_fragment_age=st.sampled_from([0.5, 5.0, 60.0]),
        segment_bytes=st.none() | st.integers(50, 3000),
    )
    def setup(
        self,
        fragment_bytes: int,
        max_uploads: int,
        debounce_count: int,
        debounce_seconds: float,
        debounce_bytes: int,
        max_fragment_age: float,
        segment_bytes: int | None,
    ) -> None:
        self.config = TieringConfig(
            fragment_bytes=fragment_bytes,
            max_fragment_age=max_fragment_age,
            max_uploads=max_uploads,
            debounce_count=debounce_count,
            debounce_seconds=debounce_seconds,
            debounce_bytes=debounce_bytes,
            retry_base=0.5,
            retry_max=4.0,
            segment_bytes=segment_bytes,
        )
        self.now = 0.0
        self.log: list[ChunkRef] = []
        self.segment = 0
        self.epoch = 1
        self.uploads: list[FragmentPlan] = []  # every plan ever started (stale ids too)
        self.commit_ids: list[int] = []
        self.committed_next = 0
        self._restart(0, None)

    def _restart(self, committed_next: int, last: tuple[int, int] | None) -> None:
        self.new = TieringState(self.config, committed_next=committed_next, last_fragment=last)
        self.old = ReferenceTieringState(
            self.config, committed_next=committed_next, last_fragment=last
        )

    def feed(self, event: object) -> None:
        new = self.new.handle(event, self.now)  # type: ignore[arg-type]
        old = self.old.handle(event, self.now)  # type: ignore[arg-type]
        assert new == old, (event, new, old)
        for effect in new:
            if isinstance(effect, StartUpload):
                self.uploads.append(effect.plan)
            elif isinstance(effect, StartCommit):
                self.commit_ids.append(effect.commit_id)

    def next_chunk(self, records: int, size: int, roll: bool) -> ChunkRef:
        if roll and self.log:
            self.segment = self.log[-1].next_offset
        start = self.log[-1].next_offset if self.log else 0
        prev = self.log[-1] if self.log and self.log[-1].segment == self.segment else None
        position = prev.position + prev.size if prev else 8
        chunk = ChunkRef(
            chunk_id=start,
            next_offset=start + records,
            timestamp=int(self.now * 1000) + size % 7,
            epoch=self.epoch,
            segment=self.segment,
            position=position,
            size=size,
            data_crc=start * 31 + size,
            chunk_type=size % 3,
        )
        self.log.append(chunk)
        return chunk

    @rule(
        sizes=st.lists(st.integers(1, 700), min_size=1, max_size=12),
        records=st.integers(1, 5),
        roll_at=st.none() | st.integers(0, 11),
    )
    def chunks_committed(self, sizes: list[int], records: int, roll_at: int | None) -> None:
        chunks = tuple(
            self.next_chunk(records, size, roll=i == roll_at) for i, size in enumerate(sizes)
        )
        self.feed(ChunksCommitted(chunks))

    @rule(count=st.integers(20, 300), size=st.integers(1, 40), roll_every=st.integers(0, 150))
    def many_small_chunks(self, count: int, size: int, roll_every: int) -> None:
        """Many chunks pending against a large fragment: the case rescans were slow at."""
        chunks = tuple(
            self.next_chunk(1, size + i % 5, roll=roll_every > 0 and i % roll_every == 0)
            for i in range(count)
        )
        for i in range(0, count, 7):
            self.feed(ChunksCommitted(chunks[i : i + 7]))

    @rule(extra=st.sampled_from([-1, 0, 0, 1]), then=st.integers(0, 2))
    def fill_to_the_limit(self, extra: int, then: int) -> None:
        """A chunk that fills the fragment being filled exactly (or one byte short or
        over), maybe followed by more: the boundary cases of the size cut."""
        open_size, limit = self.new._open_size, self.new._open_limit
        size = limit - open_size + extra if self.new._open else self.config.fragment_bytes
        chunks = [self.next_chunk(1, max(1, size), roll=False)]
        chunks += [self.next_chunk(1, 5 + i, roll=False) for i in range(then)]
        self.feed(ChunksCommitted(tuple(chunks)))

    @rule(count=st.integers(2, 4))
    def trickle_then_age(self, count: int) -> None:
        """Chunks handed over at different times, then time runs to the next deadline:
        the age cut counts from the fragment's first chunk."""
        step = self.config.max_fragment_age / 3
        for i in range(count):
            self.feed(ChunksCommitted((self.next_chunk(1, 3 + i, roll=False),)))
            self.now += step
        self.until_next_deadline()

    @rule(back=st.integers(1, 10), extra=st.integers(0, 3))
    def replay_some(self, back: int, extra: int) -> None:
        """Chunks already handed over again (idempotent), maybe followed by new ones."""
        old = self.log[-back:]
        new = [self.next_chunk(1, 10 + i, roll=False) for i in range(extra)]
        self.feed(ChunksCommitted(tuple(old + new)))

    @rule(skip=st.integers(1, 3))
    def gap(self, skip: int) -> None:
        start = self.log[-1].next_offset + skip if self.log else skip
        chunk = ChunkRef(start, start + 1, 0, self.epoch, self.segment, 8, 10, 0, 0)
        self.feed(ChunksCommitted((chunk,)))

    @rule(dt=st.sampled_from([0.0, 0.01, 0.3, 0.5, 1.0, 2.0, 4.5, 5.0, 61.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick())

    @rule()
    def until_next_deadline(self) -> None:
        deadline = self.new.next_deadline()
        if deadline is not None:
            self.now = max(self.now, deadline)
            self.feed(Tick())

    @rule()
    def flush(self) -> None:
        self.feed(Flush())

    @precondition(lambda self: self.uploads)
    @rule(
        i=st.integers(0, 1000),
        outcome=st.sampled_from(["ok", "ok", "fail", "conflict", "adopt"]),
        adopt_by=st.integers(-3, 6),
    )
    def upload_completes(self, i: int, outcome: str, adopt_by: int) -> None:
        plan = self.uploads[i % len(self.uploads)]  # may be stale, finished or cancelled
        if outcome == "ok":
            self.feed(UploadSucceeded(plan.plan_id, plan.entry(KEY)))
        elif outcome == "fail":
            self.feed(UploadFailed(plan.plan_id, "injected"))
        elif outcome == "conflict":
            self.feed(UploadFailed(plan.plan_id, "conflict", retryable=False))
        else:
            # An existing object at the plan's key with another range: some chunks of
            # the log starting at the plan's first chunk (shorter or longer than the plan).
            ids = [c.chunk_id for c in self.log]
            start = ids.index(plan.first_offset)
            end = min(len(self.log), max(start + 1, start + len(plan.chunks) + adopt_by))
            self.feed(UploadSucceeded(plan.plan_id, entry_of(self.log[start:end])))

    @precondition(lambda self: self.commit_ids)
    @rule(i=st.integers(0, 1000), outcome=st.sampled_from(["ok", "ok", "fail", "deposed"]))
    def commit_completes(self, i: int, outcome: str) -> None:
        commit_id = self.commit_ids[-1 - i % len(self.commit_ids)]  # mostly the latest
        if outcome == "ok":
            self.feed(CommitSucceeded(commit_id))
        elif outcome == "fail":
            self.feed(CommitFailed(commit_id, "version conflict"))
        else:
            self.feed(CommitFailed(commit_id, "newer epoch", deposed=True))

    @rule(new_epoch=st.booleans(), keep_last=st.booleans())
    def restart(self, new_epoch: bool, keep_last: bool) -> None:
        """Both machines lose their state and resume from what was committed; the log
        is handed over again from there."""
        committed = self.new.committed_next
        last = self.new.last_fragment if keep_last else None
        self._restart(committed, last)
        self.uploads.clear()
        self.commit_ids.clear()
        if new_epoch:
            self.epoch += 1
        self.feed(ChunksCommitted(tuple(c for c in self.log if c.next_offset > committed)))

    @invariant()
    def same_observable_state(self) -> None:
        if not hasattr(self, "new"):
            return
        new, old = self.new, self.old
        assert new.halted == old.halted
        assert new.committed_next == old.committed_next
        assert new.last_fragment == old.last_fragment
        assert new.commits == old.commits
        assert new.upload_attempts == old.upload_attempts
        assert new.lag_bytes == old.lag_bytes
        assert new.cut_next == old.cut_next
        assert new.pending_offset == old.pending_offset
        assert new.pending_chunks == len(old._pending)
        assert new.plans() == old.plans()
        assert new.in_flight() == old.in_flight()
        assert new.idle() == old.idle()
        assert new.next_deadline() == old.next_deadline()


SameDecisionsAsReference.TestCase.settings = settings(stateful_step_count=60)
TestSameDecisionsAsReference = SameDecisionsAsReference.TestCase
