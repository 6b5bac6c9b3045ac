"""The I/O shell around the tiering state machine for one stream.

``StreamTierer.start()`` resolves the manifest (follow next-offset pointers through
fragment trailers, adopt uploaded-but-unlisted fragments under the adoption rule),
brings the local log past the remote tail when the remote tier is ahead, makes the
fencing commit, and then feeds events to the state machine: committed chunks come from
the log's commit listener, uploads and commits run on the shared upload pool, and the
state machine runs as a serial task on the shared event pool whenever the stream has
events (``tiering.runtime``: no thread per stream; timers on one shared timer).
Every decision is taken by ``TieringState``; this module only carries effects out.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

from tierlog.formats.fragment import (
    fragment_size,
)
from tierlog.log.commit_point import CommitPoint
from tierlog.log.errors import BackPressureError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog
from tierlog.remote.errors import StreamDeletedError
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.manifest_tree import DEFAULT_M, ManifestTree
from tierlog.remote.settings import StreamSettings
from tierlog.storage.errors import AlreadyExistsError
from tierlog.storage.object_store import ObjectStore
from tierlog.tiering.backpressure import BackPressure
from tierlog.tiering.cold import FragmentCoder
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.errors import (
    CommitRetryError,
    FragmentConflictError,
    TieringError,
)
from tierlog.tiering.fragment_build import adopt_existing, build_fragment
from tierlog.tiering.memory_budget import ByteBudget
from tierlog.tiering.rate_limit import RateLimiter
from tierlog.tiering.resolution_io import ResolveResult, StartupResolver
from tierlog.tiering.retention import (
    RetentionPolicy,
)
from tierlog.tiering.runtime import TieringRuntime, default_runtime
from tierlog.tiering.state import (
    ChunkRef,
    ChunksCommitted,
    CommitFailed,
    CommitSucceeded,
    Effect,
    Event,
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
from tierlog.tiering.task_health import TaskHealth
from tierlog.tiering.tierer_retention import RetentionMixin

log = get_logger(__name__)

COMMIT_TICK_DELAY = 0.02
"""Commits within this many seconds share one turn of the state machine: a turn per
commit would wake the event pool for every group commit (thousands per second with
small publish frames) for decisions that only change at fragment size or age."""


class StreamTierer(RetentionMixin):
    """Tiers one stream's committed local log to the remote tier."""

    def __init__(
        self,
        stream_log: StreamLog,
        store: ObjectStore,
        catalog: Catalog,
        deletions: DeletionQueue,
        *,
        prefix: str = "",
        epoch: int = 1,
        config: TieringConfig | None = None,
        m: int = DEFAULT_M,
        clock: Callable[[], float] = time.monotonic,
        max_lag_bytes: int | None = None,
        min_free_disk_bytes: int = 0,
        gate_appends: bool = True,
        upload_bytes_per_second: float | None = None,
        retention: RetentionPolicy | None = None,
        retention_interval: float = 10.0,
        memory_budget: ByteBudget | None = None,
        settings: Callable[[], StreamSettings] | None = None,
        runtime: TieringRuntime | None = None,
        task_stall_seconds: float = 300.0,
    ) -> None:
        self.log = stream_log
        self.runtime = runtime or default_runtime()
        self._memory_budget = memory_budget
        self.remote = RemoteStream(store, prefix, os.path.basename(stream_log.stream_dir))
        # compression / encryption per the stream's settings (fragment format v2)
        self.coder = FragmentCoder(self.remote, settings) if settings is not None else None
        self.catalog = catalog
        self.deletions = deletions
        self.epoch = epoch
        config = config or TieringConfig()
        if config.segment_bytes is None:
            config = replace(config, segment_bytes=stream_log.config.max_segment_bytes)
        self.config = config
        self.clock = clock
        self.committer = ManifestCommitter(
            self.remote, catalog, deletions, epoch, m=m, settings=settings
        )
        self.state: TieringState | None = None
        self.halted: str | None = None
        self.puts = 0
        # events wait in the inbox until the stream's lane of the shared event pool runs
        # them; a pending Tick is never queued twice (one per log commit would cost a
        # task per commit)
        self._inbox: list[Event] = []
        self._inbox_lock = threading.Lock()
        self._drain_queued = False
        self._tick_queued = False
        self._commit_tick_armed = False
        self._lane = self.runtime.events.lane(self.remote.stream_dir)
        self._running = False
        self._tasks: set[Future[None]] = set()  # this stream's work on the upload pool
        self._deadline_timer: tuple[float, object] | None = None  # (deadline, handle)
        self._retention_timer: object | None = None
        self._handed = 0  # next offset of the last chunk handed to the state machine
        self._reader: LogReader | None = None
        self.commit_cap: Callable[[], int] | None = None
        """In a cluster: the last chunk id committed on a majority of the stream's
        members. Chunks after it are held back (only committed chunks are tiered);
        ``poke`` when it advances. None: every locally committed chunk (one node)."""
        self._held: list[ChunkRef] = []
        self._durable = threading.Condition()
        self._stopping = False
        self.backpressure = BackPressure(
            self.remote.stream_dir, stream_log.stream_dir, max_lag_bytes, min_free_disk_bytes
        )
        self.gate_appends = gate_appends
        self._limiter = RateLimiter(upload_bytes_per_second) if upload_bytes_per_second else None
        self.retention = retention or RetentionPolicy()
        self.retention_floor: int | None = None
        self.retention_interval = retention_interval
        self._next_retention = 0.0
        self._retention_running = threading.Lock()
        self.retention_trims = 0
        self._sealed_newest: dict[int, int] = {}  # sealed segment -> newest timestamp
        self.task_health = TaskHealth(self.remote.stream_dir, task_stall_seconds)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> ResolveResult:
        result = self.resolve()
        assert self.state is not None
        self._handed = self.state.committed_next
        self.log.add_commit_listener(self._on_commit)
        if self.gate_appends:
            self.log.set_append_gate(self._append_gate)
        self._running = True
        self._post(Tick())  # pick up chunks committed before the listener existed
        self._arm_retention()
        return result

    def stop(self, flush: bool = True, timeout: float = 30.0) -> None:
        """Stop tiering; with ``flush`` first cut, upload and commit everything committed."""
        if flush and self._running and not self.halted:
            self.flush(timeout)
        self._stopping = True
        if self.gate_appends:
            self.log.set_append_gate(None)
        with contextlib.suppress(ValueError):
            self.log.remove_commit_listener(self._on_commit)
        self._cancel_timers()
        self._lane.shutdown(wait=True, cancel_futures=True)
        with self._inbox_lock:
            tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        concurrent.futures.wait(tasks, timeout)
        self._running = False
        if self._reader is not None:
            self._reader.close()

    def flush(self, timeout: float = 30.0) -> bool:
        """Tier everything committed locally now; True once it is durable remotely."""
        target = self.log.commit_point().next_offset
        self._post(Flush())
        return self.wait_durable(target, timeout)

    def wait_durable(self, next_offset: int, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._durable:
            while self.durable_next < next_offset and not self.halted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._durable.wait(min(remaining, 0.5))
                self._post(Flush())
        return self.durable_next >= next_offset

    def _append_gate(self) -> None:
        """The log's append gate: refuse appends while the stream is over its
        back-pressure limits (nothing is written; the caller retries)."""
        reason = self.backpressure.check(self.lag_bytes)
        if reason is not None:
            raise BackPressureError(f"stream {self.remote.stream_dir}: {reason}", retry_after=0.1)

    @property
    def backpressure_active(self) -> bool:
        """The alarm: the last evaluation found the stream over its limits."""
        return self.backpressure.active

    @property
    def backpressure_events(self) -> int:
        return self.backpressure.events

    # -- queries --------------------------------------------------------------------------
    @property
    def object_store(self) -> ObjectStore:
        return self.remote.store

    def committed_tree(self) -> ManifestTree:
        """The committed manifest (``remote.committed.CommittedManifest``): this writer's
        cached root is always the committed one, so no I/O."""
        return self.committer.tree

    def refresh_committed(self) -> ManifestTree:
        return self.committer.tree

    @property
    def manifest_commits(self) -> int:
        return self.committer.commits

    @property
    def manifest_conflicts(self) -> int:
        return self.committer.conflicts

    @property
    def durable_next(self) -> int:
        """Offsets below this are durable in the remote tier (safe to free locally)."""
        return self.committer.tree.next_offset

    @property
    def lag_bytes(self) -> int:
        return self.state.lag_bytes if self.state is not None else 0

    @property
    def lag_seconds(self) -> float:
        """Seconds since the remote tier last held everything committed locally (0 as
        soon as the state machine has nothing left to tier, even before its next turn
        notes it)."""
        if self.lag_bytes == 0:
            return 0.0
        return self.task_health.lag_seconds()

    def deletable_segments(self) -> list[int]:
        """Sealed local segments whose every offset is in the committed manifest."""
        return self.local_segments_to_free(max_bytes=0, max_age_seconds=None)

    # -- resolution -----------------------------------------------------------------------
    def resolve(self) -> ResolveResult:
        """Fetch what resolution needs, let ``tiering.resolution`` decide, carry it out
        (``tiering.resolution_io``); the state machine starts from its decision."""
        resolver = StartupResolver(
            self.log, self.remote, self.committer, self.runtime.reads, self.epoch, self.config
        )
        result, self.state = resolver.run()
        self.log.set_tiered_offset(self.committer.tree.next_offset)
        return result

    # -- the event loop -------------------------------------------------------------------
    def _on_commit(self, point: CommitPoint) -> None:
        with self._inbox_lock:
            if self._commit_tick_armed or self._tick_queued:
                return  # a Tick is due anyway: it reads every chunk committed until then
            self._commit_tick_armed = True
        self.runtime.timer.call_later(COMMIT_TICK_DELAY, self._commit_tick)

    def _commit_tick(self) -> None:
        with self._inbox_lock:
            self._commit_tick_armed = False
        self._post(Tick())

    def _post(self, event: Event) -> None:
        """Queue an event for the state machine and make sure the stream's lane runs."""
        if self._stopping and not isinstance(event, (CommitSucceeded, CommitFailed)):
            return
        with self._inbox_lock:
            if not isinstance(event, Tick):
                self._inbox.append(event)
            elif not self._tick_queued:  # a queued Tick covers every later one
                self._tick_queued = True
                self._inbox.append(event)
            if self._drain_queued or not self._running:
                return
            self._drain_queued = True
        with contextlib.suppress(RuntimeError):  # stopped meanwhile
            self._lane.submit(self._drain)

    def _drain(self) -> None:
        """One turn of the state machine (on the stream's lane of the event pool):
        newly committed chunks and every queued event, then the effects."""
        with self._inbox_lock:
            events, self._inbox = self._inbox, []
            self._drain_queued = False
            self._tick_queued = False
        state = self.state
        if state is None or self.halted:
            return
        try:
            chunks = self._new_chunks()
            now = self.clock()
            effects: list[Effect] = []
            if chunks:
                effects += state.handle(ChunksCommitted(tuple(chunks)), now)
            for event in events:
                effects += state.handle(event, now)
            self._carry_out(effects)
            self.task_health.note_lag(state.lag_bytes)
        except Exception as exc:  # never let tiering die silently
            log.exception("tiering_failed", stream_dir=self.remote.stream_dir)
            self._halt(f"internal error: {exc}")
            return
        finally:
            if self._reader is not None:
                self._reader.park()  # no file held open by an idle stream
        if not self.halted and not self._stopping:
            self._arm_deadline(state.next_deadline())

    def _arm_deadline(self, deadline: float | None) -> None:
        """A Tick at the state machine's next deadline (one timer per stream at most)."""
        if deadline is None:
            return
        armed = self._deadline_timer
        if armed is not None and armed[0] <= deadline:
            return  # an earlier tick re-arms when it runs
        if armed is not None:
            armed[1].cancel()  # type: ignore[attr-defined]
        delay = max(0.001, deadline - self.clock())
        handle = self.runtime.timer.call_later(delay, self._deadline_reached)
        self._deadline_timer = (deadline, handle)

    def _deadline_reached(self) -> None:
        self._deadline_timer = None
        self._post(Tick())

    def _cancel_timers(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer[1].cancel()  # type: ignore[attr-defined]
            self._deadline_timer = None
        if self._retention_timer is not None:
            self._retention_timer.cancel()  # type: ignore[attr-defined]
            self._retention_timer = None

    def _submit(self, name: str, fn: Callable[..., None], *args: object) -> bool:
        """Run an upload or commit on the shared upload pool, tracked so ``stop`` can wait
        for it; the task reports its own outcome to the state machine, and anything that
        still escapes it halts the stream visibly."""
        with self._inbox_lock:
            if self._stopping and fn != self._commit:
                return False
            token = self.task_health.started(name)
            # the watchdog looks again once the task could be over its bound
            self.runtime.timer.call_later(self.task_health.stall_seconds + 0.05, self._check_stalls)

            def run() -> None:
                try:
                    fn(*args)
                except BaseException as exc:
                    log.exception(
                        "tiering_task_escaped", task=name, stream_dir=self.remote.stream_dir
                    )
                    self._halt(f"{name} failed unexpectedly: {exc!r}")
                    self._post(Tick())
                    raise
                finally:
                    self.task_health.finished(token)

            try:
                task = self.runtime.uploads.submit(run)
            except RuntimeError:  # the pool is shut down
                self.task_health.finished(token)
                return False
            self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return True

    def _check_stalls(self) -> None:
        self.task_health.check_stalls()

    def _task_done(self, task: Future[None]) -> None:
        with self._inbox_lock:
            self._tasks.discard(task)

    def poke(self) -> None:
        """Chunks may have become tierable (the cluster commit advanced)."""
        self._post(Tick())

    def _new_chunks(self) -> list[ChunkRef]:
        """Chunks committed since the last call (headers only: one pread each), up to
        ``commit_cap`` when there is one."""
        out = self._local_chunks()
        cap = self.commit_cap
        if cap is None:
            return out
        limit = cap()
        pending = self._held + out if self._held else out
        ready = 0
        while ready < len(pending) and pending[ready].chunk_id <= limit:
            ready += 1
        self._held = pending[ready:]
        return pending[:ready]

    def _local_chunks(self) -> list[ChunkRef]:
        """Chunks committed locally since the last call."""
        if self._reader is None:
            self._reader = LogReader(self.log, OffsetSpec.offset(self._handed), user_only=False)
        out: list[ChunkRef] = []
        reader = self._reader
        while True:
            chunk = reader.read_chunk(load=False)
            if chunk is None:
                return out
            h = chunk.header
            if h.next_offset <= self._handed:
                continue
            out.append(
                ChunkRef(
                    chunk_id=h.chunk_id,
                    next_offset=h.next_offset,
                    timestamp=h.timestamp,
                    epoch=h.epoch,
                    segment=reader.segment.first_offset,
                    position=chunk.position,
                    size=h.total_size,
                    data_crc=h.data_crc,
                    chunk_type=h.chunk_type,
                )
            )
            self._handed = h.next_offset

    def _carry_out(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, StartUpload):
                self._submit(f"upload {effect.plan.first_offset}", self._upload, effect.plan)
            elif isinstance(effect, StartCommit):
                self._submit(f"commit {effect.commit_id}", self._commit, effect)
            elif isinstance(effect, Halt):
                self._halt(effect.reason)

    def _halt(self, reason: str) -> None:
        if self.halted is None:
            self.halted = reason
            log.error("tiering_halted", stream_dir=self.remote.stream_dir, reason=reason)
        with self._durable:
            self._durable.notify_all()

    # -- effects (run on the pool) ----------------------------------------------------------
    def _upload(self, plan: FragmentPlan) -> None:
        budget, size = self._memory_budget, 0
        if budget is not None:
            last = plan.chunks[-1]
            span = last.position + last.size - plan.chunks[0].position
            size = fragment_size(span, len(plan.chunks))
            budget.acquire(size)
        try:
            self._build_and_put(plan)
        finally:
            if budget is not None:
                budget.release(size)

    def _build_and_put(self, plan: FragmentPlan) -> None:
        try:
            body, entry, sealed = build_fragment(self.log, self.remote, self.coder, plan)
            key = self.remote.fragment_key(plan.first_offset)
            if self._limiter is not None:
                self._limiter.acquire(len(body))
            try:
                self.remote.store.put_if_absent(key, body)
                self.puts += 1
                self.committer.note_upload(key, sealed)
            except AlreadyExistsError:
                entry = adopt_existing(self.log, self.remote, self.epoch, plan)
            self._post(UploadSucceeded(plan.plan_id, entry))
        except FragmentConflictError as exc:
            self.task_health.failed("upload", str(exc))
            self._post(UploadFailed(plan.plan_id, str(exc), retryable=False))
        except Exception as exc:  # storage, local I/O or a bug: retried with backoff
            reason = f"{type(exc).__name__}: {exc}"
            self.task_health.failed("upload", reason)
            self._post(UploadFailed(plan.plan_id, reason))
        else:
            self.task_health.succeeded("upload")

    def _commit(self, effect: StartCommit) -> None:
        """Every outcome reaches the state machine: success, a retryable failure (any
        exception but a deposition, including raw OS errors), or a deposition (halts)."""
        try:
            self.committer.commit(effect.entries)
            # truncation (a member following a new leader) must never cut tiered data
            self.log.set_tiered_offset(self.committer.tree.next_offset)
            event: Event = CommitSucceeded(effect.commit_id)
        except CommitRetryError as exc:
            event = CommitFailed(effect.commit_id, str(exc))
        except (TieringError, StreamDeletedError) as exc:
            event = CommitFailed(effect.commit_id, str(exc), deposed=True)
        except Exception as exc:
            event = CommitFailed(effect.commit_id, f"{type(exc).__name__}: {exc}")
        if isinstance(event, CommitFailed):
            self.task_health.failed("commit", event.reason)
        else:
            self.task_health.succeeded("commit")
        self._post(event)
        with self._durable:
            self._durable.notify_all()

    def status(self) -> dict[str, object]:
        tree = self.committer.tree
        return {
            "remote_first_offset": tree.first_offset,
            "tiered_next_offset": tree.next_offset,
            "remote_bytes": tree.header().total_bytes,
            "remote_fragments": tree.header().total_fragments,
            "manifest_height": tree.height,
            "upload_lag_bytes": self.lag_bytes,
            "halted": self.halted,
            "backpressure_active": self.backpressure_active,
            "backpressure_events": self.backpressure_events,
            "manifest_commits": self.manifest_commits,
            "manifest_conflicts": self.manifest_conflicts,
            **self.task_health.status(),
        }
