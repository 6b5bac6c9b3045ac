"""The manifest commit rule (the debounce) of the tiering state machine: the number of
commits follows from the fragments, not from how fast or in which order they upload.

A backlog tiered back to back is driven through a small discrete-event simulation of
the I/O shell (uploads that take drawn times, at most ``max_uploads`` at once, commits
that take a drawn time) and the commits are checked against the batches computed from
the fragment sizes alone.
"""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.remote.settings import StreamSettings
from tierlog.tiering.config import tiering_config
from tierlog.tiering.state import (
    ChunkRef,
    ChunksCommitted,
    CommitSucceeded,
    Effect,
    Flush,
    PlanStatus,
    StartCommit,
    StartUpload,
    Tick,
    TieringConfig,
    TieringState,
    UploadFailed,
    UploadSucceeded,
)

KEY = "stream/s/data/fragment"


def chunk(chunk_id: int, size: int) -> ChunkRef:
    return ChunkRef(
        chunk_id=chunk_id,
        next_offset=chunk_id + 1,
        timestamp=0,
        epoch=1,
        segment=0,
        position=0,
        size=size,
        data_crc=chunk_id,
        chunk_type=0,
    )


def batch_ends(sizes: list[int], count: int, max_bytes: int) -> list[int]:
    """Where the batches of a fragment sequence end (fragment counts), from the sizes
    alone: greedily, a batch ends at ``count`` fragments or ``max_bytes`` bytes; the tail
    that fills no batch ends at the end."""
    ends: list[int] = []
    n = size = 0
    for i, s in enumerate(sizes):
        n += 1
        size += s
        if n >= count or size >= max_bytes:
            ends.append(i + 1)
            n = size = 0
    if not ends or ends[-1] != len(sizes):
        ends.append(len(sizes))
    return ends


def tier_backlog(
    sizes: list[int],
    cfg: TieringConfig,
    upload_seconds: list[float],
    commit_seconds: float,
    flush_tail: bool = False,
) -> list[int]:
    """Tier a backlog of one fragment per chunk (``fragment_bytes`` = 1 cuts every chunk
    alone), all committed locally at t = 0; with ``flush_tail`` the last one is handed
    over with a Flush once every other plan has started uploading and a slot is free (as
    benches/tiering.py does with the uncut tail). Upload ``i`` takes
    ``upload_seconds[i]``. Returns the offset each commit ended at."""
    state = TieringState(cfg, committed_next=0)
    chunks = [chunk(i, s) for i, s in enumerate(sizes)]
    pending: list[tuple[float, int, object]] = []  # (time, seq, event)
    seq = 0
    ends: list[int] = []
    tail_sent = not flush_tail

    def apply(effects: list[Effect], now: float) -> None:
        nonlocal seq
        for e in effects:
            if isinstance(e, StartUpload):
                done = now + upload_seconds[e.plan.first_offset]
                event: object = UploadSucceeded(e.plan.plan_id, e.plan.entry(KEY))
                heapq.heappush(pending, (done, seq, event))
            else:
                assert isinstance(e, StartCommit)
                ends.append(e.entries[-1].next_offset)
                heapq.heappush(pending, (now + commit_seconds, seq, CommitSucceeded(e.commit_id)))
            seq += 1

    first = chunks[:-1] if flush_tail else chunks
    apply(state.handle(ChunksCommitted(tuple(first)), 0.0), 0.0)
    now = 0.0
    for _ in range(10_000):
        queued = any(status is PlanStatus.QUEUED for _, status in state.plans())
        if not tail_sent and not queued and state.in_flight() < cfg.max_uploads:
            apply(state.handle(ChunksCommitted((chunks[-1],)), now), now)
            apply(state.handle(Flush(), now), now)
            tail_sent = True
        if state.committed_next == len(sizes):
            return ends
        deadline = state.next_deadline()
        if pending and (deadline is None or pending[0][0] <= deadline):
            now, _, event = heapq.heappop(pending)
            apply(state.handle(event, now), now)  # type: ignore[arg-type]
        else:
            assert deadline is not None, "stuck: nothing in flight and no deadline"
            now = max(now, deadline)
            apply(state.handle(Tick(), now), now)
    raise AssertionError("backlog not tiered")


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 100), min_size=1, max_size=40),
    max_uploads=st.integers(1, 4),
    upload_seconds=st.floats(0.001, 50.0, allow_nan=False),
    data=st.data(),
)
def test_backlog_commits_once_per_batch_whatever_the_upload_speed(
    sizes: list[int], max_uploads: int, upload_seconds: float, data: st.DataObject
) -> None:
    """Uploads of 1 ms to 50 s each (the old 2 s timer fired at points that depended on
    that speed), commits faster than an upload: the commits end exactly at the batch
    ends computed from the sizes, as long as every batch holds at least ``max_uploads``
    fragments (uploads finishing together then cannot carry the run across two batch
    ends while a commit is in flight; true at the defaults: 512 MiB takes at least 5
    fragments of at most 96 MiB, 4 uploads)."""
    count = data.draw(st.integers(max_uploads, 10), label="debounce_count")
    max_bytes = data.draw(st.integers(max_uploads * 100, 1000), label="debounce_bytes")
    commit_seconds = data.draw(st.floats(0.0, upload_seconds * 0.99), label="commit_seconds")
    cfg = TieringConfig(
        fragment_bytes=1,
        max_uploads=max_uploads,
        debounce_count=count,
        debounce_bytes=max_bytes,
        debounce_seconds=2.0,
        max_fragment_age=3600.0,
    )
    times = [upload_seconds] * len(sizes)
    expected = batch_ends(sizes, count, max_bytes)
    assert tier_backlog(sizes, cfg, times, commit_seconds=commit_seconds) == expected


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 100), min_size=1, max_size=40),
    count=st.integers(1, 8),
    max_bytes=st.integers(1, 400),
    max_uploads=st.integers(1, 4),
    commit_seconds=st.floats(0.0, 20.0, allow_nan=False),
    data=st.data(),
)
def test_commits_end_at_batch_ends_whatever_the_timing(
    sizes: list[int],
    count: int,
    max_bytes: int,
    max_uploads: int,
    commit_seconds: float,
    data: st.DataObject,
) -> None:
    """Any batch sizes, upload and commit times, uploads finishing in any order: a commit
    may carry several batches (uploads that finish together or behind a slow one, a slow
    commit) but never a piece of one, so there are never more commits than batches."""
    cfg = TieringConfig(
        fragment_bytes=1,
        max_uploads=max_uploads,
        debounce_count=count,
        debounce_bytes=max_bytes,
        debounce_seconds=2.0,
        max_fragment_age=3600.0,
    )
    times = data.draw(
        st.lists(st.floats(0.001, 50.0, allow_nan=False), min_size=len(sizes), max_size=len(sizes))
    )
    expected = batch_ends(sizes, count, max_bytes)
    ends = tier_backlog(sizes, cfg, times, commit_seconds=commit_seconds)
    assert set(ends) <= set(expected) and ends[-1] == len(sizes)


@pytest.mark.parametrize("upload_seconds", [0.5, 1.0, 2.5, 10.0, 30.0])
def test_bench_shaped_backlog_has_a_fixed_request_count(upload_seconds: float) -> None:
    """The shape of benches/tiering.py at the defaults: 31 fragments of a 2 GiB log (four
    segments of six 64 MiB fragments and a 92.8 MiB last one, then two more and a
    19.6 MiB tail that a flush hands over once only it is left). Whether an upload takes
    0.5 s or 30 s (each a third longer or shorter than the next, so they finish out of
    order), with commits of 0.3 s it is 4 commits: three batches of 8 fragments and the
    rest. The old rule (5 fragments or 2 s) made 6 to 10 of them depending on the speed."""
    mib = 1 << 20
    segment = [64 * mib] * 6 + [int(92.8 * mib)]
    sizes = segment * 4 + [64 * mib, 64 * mib, int(19.6 * mib)]
    cfg = TieringConfig(fragment_bytes=1)
    assert (cfg.debounce_count, cfg.debounce_bytes) == (8, 512 * mib)
    times = [upload_seconds * (1.0, 1.33, 0.67)[i % 3] for i in range(len(sizes))]
    ends = tier_backlog(sizes, cfg, times, commit_seconds=0.3, flush_tail=True)
    assert ends == [8, 16, 24, 31]


def test_streaming_run_waits_for_its_batch_not_for_the_clock() -> None:
    cfg = TieringConfig(fragment_bytes=10, max_uploads=5, debounce_count=3, debounce_seconds=2)
    state = TieringState(cfg, committed_next=0)
    effects = state.handle(ChunksCommitted(tuple(chunk(i, 10) for i in range(3))), 0)
    p0, p1, p2 = (e.plan for e in effects if isinstance(e, StartUpload))
    state.handle(UploadSucceeded(p0.plan_id, p0.entry(KEY)), 0.0)
    assert state.next_deadline() == pytest.approx(cfg.max_fragment_age)  # the cap only
    assert state.handle(Tick(), 30.0) == []
    assert state.handle(UploadSucceeded(p1.plan_id, p1.entry(KEY)), 31.0) == []
    (commit,) = state.handle(UploadSucceeded(p2.plan_id, p2.entry(KEY)), 32.0)
    assert isinstance(commit, StartCommit) and len(commit.entries) == 3


def test_streaming_run_is_committed_at_the_cap() -> None:
    """An upload that never ends holds the run back for at most ``max_fragment_age``."""
    cfg = TieringConfig(fragment_bytes=10, max_fragment_age=60.0, debounce_count=3)
    state = TieringState(cfg, committed_next=0)
    effects = state.handle(ChunksCommitted(tuple(chunk(i, 10) for i in range(2))), 0)
    p0, _p1 = (e.plan for e in effects if isinstance(e, StartUpload))
    state.handle(UploadSucceeded(p0.plan_id, p0.entry(KEY)), 1.0)
    assert state.handle(Tick(), 60.9) == []
    (commit,) = state.handle(Tick(), 61.0)
    assert isinstance(commit, StartCommit) and len(commit.entries) == 1


def test_run_behind_a_retrying_upload_commits_after_the_debounce() -> None:
    """A failing store must not hold back what is already uploaded."""
    cfg = TieringConfig(fragment_bytes=10, debounce_count=5, debounce_seconds=2.0)
    state = TieringState(cfg, committed_next=0)
    effects = state.handle(ChunksCommitted(tuple(chunk(i, 10) for i in range(2))), 0)
    p0, p1 = (e.plan for e in effects if isinstance(e, StartUpload))
    state.handle(UploadSucceeded(p0.plan_id, p0.entry(KEY)), 0.5)
    state.handle(UploadFailed(p1.plan_id, "503"), 0.6)
    assert state.next_deadline() == pytest.approx(1.1)  # the retry comes first
    state.handle(Tick(), 1.1)  # retried: in flight again, the run waits
    assert state.handle(UploadFailed(p1.plan_id, "503"), 1.2) == []
    assert state.next_deadline() == pytest.approx(2.2)  # retry at 1.2 + 1.0 ...
    assert state.handle(Tick(), 2.2)  # ... in flight again
    state.handle(UploadFailed(p1.plan_id, "503"), 2.3)  # retry at 4.3
    (commit,) = state.handle(Tick(), 2.5)  # 2 s after p0's upload
    assert isinstance(commit, StartCommit) and len(commit.entries) == 1


def test_flush_commits_once_when_the_last_upload_lands() -> None:
    cfg = TieringConfig(fragment_bytes=10, max_uploads=4, debounce_count=10)
    state = TieringState(cfg, committed_next=0)
    effects = state.handle(ChunksCommitted(tuple(chunk(i, 10) for i in range(3))), 0)
    plans = [e.plan for e in effects if isinstance(e, StartUpload)]
    state.handle(Flush(), 0.0)
    assert state.handle(UploadSucceeded(plans[0].plan_id, plans[0].entry(KEY)), 0.1) == []
    assert state.handle(UploadSucceeded(plans[1].plan_id, plans[1].entry(KEY)), 0.2) == []
    (commit,) = state.handle(UploadSucceeded(plans[2].plan_id, plans[2].entry(KEY)), 0.3)
    assert isinstance(commit, StartCommit) and len(commit.entries) == 3


def test_bytes_end_a_batch_before_the_count() -> None:
    cfg = TieringConfig(fragment_bytes=1, max_uploads=4, debounce_count=8, debounce_bytes=100)
    state = TieringState(cfg, committed_next=0)
    effects = state.handle(ChunksCommitted(tuple(chunk(i, 60) for i in range(4))), 0)
    plans = [e.plan for e in effects if isinstance(e, StartUpload)]
    assert state.handle(UploadSucceeded(plans[0].plan_id, plans[0].entry(KEY)), 0.1) == []
    (commit,) = state.handle(UploadSucceeded(plans[1].plan_id, plans[1].entry(KEY)), 0.2)
    assert isinstance(commit, StartCommit) and len(commit.entries) == 2  # 120 >= 100


def test_stream_settings_give_batches_of_8_fragments_and_at_most_half_the_lag_limit() -> None:
    mib = 1 << 20
    default = tiering_config(StreamSettings())
    assert (default.debounce_count, default.debounce_bytes) == (8, 512 * mib)
    small = tiering_config(StreamSettings(max_lag_bytes=256 * mib))
    assert small.debounce_bytes == 128 * mib
