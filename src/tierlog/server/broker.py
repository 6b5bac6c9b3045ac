"""The streams registry: catalog entries, their open local logs, and group commit.

Each stream has one writer lane on the node's shared writer pool (``server.writer_threads``
threads serve every stream, round robin, one task of a stream at a time): every mutating
call on its StreamLog runs there, in order, as the log requires. Publish frames and StoreOffset
commands queue up on the event loop while the writer is busy; the next group takes
them all (up to ``group_commit_max_frames``), appends consecutive frames of the same
producer as one chunk, fsyncs once, and the loop then sends one PublishConfirm per
frame. Readers (subscriptions) read the segment files from the loop thread.

Deduplication and chunk splitting are the log's (``StreamLog.append_batches``).

Back-pressure: a stream is *congested* when its queued bytes exceed a bound or the
tiering lag (``LagProvider``: committed bytes not yet in the remote tier as tiering's
back-pressure rule sees them, default 0) exceeds the stream's ``max_lag_bytes``.
Connections publishing to a congested stream stop reading their socket until it is
not congested any more (counted, never silent).

Start-up: ``start`` returns at once; the catalog's streams are opened (local recovery,
then the lifecycle's resolution) in the background, ``server.open_concurrency`` at a
time. Until a stream is open its state is ``resolving`` (or ``failed`` with the error)
and clients get the retriable STREAM_NOT_AVAILABLE, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tierlog.cluster.errors import NotLeaderError
from tierlog.concurrency import Lane, SerialPool
from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishBatch
from tierlog.log.config import LogConfig
from tierlog.log.errors import (
    DamagedRangeError,
    DamagedSegmentError,
    InvalidAppendError,
    LogError,
    RecordTooLargeError,
    SyncFailedError,
)
from tierlog.log.names import is_reserved
from tierlog.log.open_repairing import DamageReport, open_repairing
from tierlog.log.writer import BatchProgress, StreamLog
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.errors import StreamExistsError
from tierlog.remote.settings import StreamSettings
from tierlog.remote.super_streams import PartitionIndexes, SuperStreamCatalog
from tierlog.server.chunk_source import ChunkSource, CommitNotifier
from tierlog.server.config import ServerConfig
from tierlog.server.remote_ack import check_creatable
from tierlog.server.sac import SacCoordinator
from tierlog.server.subscriptions import DeliveryTurns
from tierlog.server.tiered_source import StreamChunkSource

log = get_logger("tierlog.server.broker")

MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""Queued publish bytes per stream above which publishers are paused."""
LAG_POLL_SECONDS = 0.5

LagProvider = Callable[[StreamRecord], int]
"""Committed bytes of a stream not yet durable in the remote tier (tiering supplies it)."""


class RemoteStatusProvider(Protocol):
    """Remote-tier fields of a stream's status (tiering fills them in later)."""

    def remote_status(self, record: StreamRecord) -> dict[str, Any]: ...


class NoRemoteStatus:
    """The default until tiering runs: every remote field present, unknown (None)."""

    def remote_status(self, record: StreamRecord) -> dict[str, Any]:
        return {
            "bytes": None,
            "fragments": None,
            "first_offset": None,
            "tiered_offset": None,
            "manifest_depth": None,
            "upload_lag_bytes": None,
        }


def no_lag(record: StreamRecord) -> int:
    return 0


if TYPE_CHECKING:
    from tierlog.remote.committed import CommittedManifest
    from tierlog.server.remote_ack import RemoteAckGate
    from tierlog.tiering.tierer import StreamTierer


class StreamLifecycle(Protocol):
    """Told when a stream is opened and before it is closed (tiering hooks in here)."""

    async def opened(self, handle: StreamHandle) -> None: ...

    async def closing(self, handle: StreamHandle, *, flush: bool) -> None: ...

    def repair_damaged(self, record: StreamRecord, error: DamagedSegmentError) -> bool:
        """Rewrite a damaged local range from a healthy copy; True if anything was."""
        ...


class ConfirmGate(Protocol):
    """Holds a written group's confirms until the stream's cluster commit reaches
    ``chunk_id``; ``dones`` are the group's publish callbacks with their local codes."""

    def group_written(
        self, handle: StreamHandle, chunk_id: int, dones: list[tuple[Done, int]]
    ) -> None: ...

    async def committed(self, chunk_id: int, timeout: float) -> bool:
        """Whether the cluster commit reaches ``chunk_id`` within ``timeout``."""
        ...


class StreamPlacement(Protocol):
    """Which node leads each stream (the cluster service); None on a single node."""

    async def should_open(self, record: StreamRecord) -> bool:
        """Whether this node should open (and try to lead) a catalog stream now."""
        ...

    async def leading(self, handle: StreamHandle) -> None:
        """Take the leadership of a freshly opened stream before anyone can use it
        (``NotLeaderError`` if another node leads it)."""
        ...

    def not_available(self, vhost: str, name: str) -> bool:
        """A stream led elsewhere or leaderless that this node knows of."""
        ...

    async def stream_deleted(self, record: StreamRecord) -> None:
        """This node deleted the stream (its directory goes next): stop leading and
        following it here first."""
        ...


class StreamListener(Protocol):
    """A connection that uses a stream and must hear when it goes away."""

    def stream_unavailable(self, stream: StreamHandle) -> None: ...

    def resume_publishing(self, stream: StreamHandle) -> None: ...


LED_ELSEWHERE = "led-elsewhere"
"""``StreamOpening.state`` of a catalog stream this cluster node does not lead."""

OPENING = "opening"
"""``StreamHandle.unavailable`` while the first resolution after opening runs: clients
are told STREAM_NOT_AVAILABLE at once (declare publisher, subscribe); a resolution that
failed leaves local data readable and refuses appends until a retry succeeds."""

Done = Callable[[int], None]
"""Called on the event loop with a response code once an operation is durable."""


@dataclass(slots=True)
class _PublishOp:
    batch: PublishBatch
    reference: str | None
    done: Done
    size: int


@dataclass(slots=True)
class _StoreOffsetOp:
    reference: str
    offset: int
    size: int = 64


_Op = _PublishOp | _StoreOffsetOp


@dataclass(slots=True)
class _GroupResult:
    codes: list[int]
    chunks: int = 0
    duplicates: int = 0
    error: str = ""
    sync_failed: bool = False
    chunk_id: int = -1  # the last chunk written once the group is committed locally


@dataclass(eq=False)
class StreamHandle:
    """One open stream: catalog record, writer log, queue, readers' notifier."""

    record: StreamRecord
    log: StreamLog
    broker: Broker
    executor: Executor
    notifier: CommitNotifier = field(default_factory=CommitNotifier)
    pending: list[_Op] = field(default_factory=list)
    pending_bytes: int = 0
    writing: bool = False
    closed: bool = False
    tier_lag: int = 0
    activity: int = 0  # write groups done (the lag poll skips streams without any)
    polled_activity: int = -1
    _reopen_task: asyncio.Task[None] | None = None
    unavailable: str | None = None
    """Why appends are refused for now (retriable STREAM_NOT_AVAILABLE): the remote tier
    was not resolved yet, so any offset handed out could be one it already holds."""
    listeners: set[StreamListener] = field(default_factory=set)
    blocked: set[StreamListener] = field(default_factory=set)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _kick_scheduled: bool = False
    _source: StreamChunkSource | None = None
    confirm_gate: ConfirmGate | None = None
    """In a cluster: publishes are confirmed at the stream's cluster commit, not at the
    local fsync (None: at the local fsync, a single node)."""
    commit_fence: Callable[[], None] | None = None
    """In a cluster: called before each manifest commit of the stream; raises when its
    leader may no longer commit (see ``ManifestCommitter.fence``)."""
    cluster_commit: Callable[[], int] | None = None
    """In a cluster: the stream's last chunk committed on a majority (tiering stops
    there); ``tier_poke`` is called when it advances."""
    tier_poke: Callable[[], None] | None = None
    delayed: Any = None
    """The publish path of a stream created with ``x-tierlog-delayed=true`` (a
    ``DelayedIntake``, set by the delayed-delivery service); None for every other stream."""
    remote_ack: RemoteAckGate | None = None
    """Set for ``ack = remote`` streams: confirms wait for the remote tier's commit."""

    def __post_init__(self) -> None:
        self._idle.set()
        self._source = StreamChunkSource(
            self.log, self.notifier, lambda: self.record.settings.read_strategy
        )

    def tier_started(self, tierer: StreamTierer | CommittedManifest) -> None:
        """Subscriptions attached from now on read across tiers through ``tierer``."""
        assert self._source is not None
        self._source.tier_started(tierer)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def vhost(self) -> str:
        return self.record.vhost

    @property
    def settings(self) -> StreamSettings:
        return self.record.settings

    @property
    def source(self) -> ChunkSource:
        """Where subscriptions read from (local, and remote once tiering started)."""
        assert self._source is not None
        return self._source

    def first_offset(self) -> int:
        """The stream's first offset across tiers."""
        assert self._source is not None
        return self._source.first_offset()

    @property
    def congested(self) -> bool:
        return (
            self.pending_bytes > MAX_QUEUED_BYTES
            or self.tier_lag > self.record.settings.max_lag_bytes
        )

    # ----------------------------------------------------------------- submitting

    def submit_publish(self, batch: PublishBatch, reference: str | None, done: Done) -> None:
        """A client's publish (through a declared publisher): never onto a stream with a
        reserved name, never under a reserved producer reference. The commands refuse
        both first; this is the last gate (one check per frame, not per message)."""
        if is_reserved(self.record.name) or is_reserved(reference):
            done(ResponseCode.ACCESS_REFUSED)
            return
        self.submit_internal(batch, reference, done)

    def submit_internal(self, batch: PublishBatch, reference: str | None, done: Done) -> None:
        """The server's own appends (delayed delivery's system-stream records and its
        dispatcher's appends), which may use reserved names: no client command calls this."""
        if self.closed:
            done(ResponseCode.STREAM_DOES_NOT_EXIST)
            return
        if self.unavailable is not None:
            done(ResponseCode.STREAM_NOT_AVAILABLE)
            return
        size = len(batch.entry_data())
        self.pending.append(_PublishOp(batch, reference, done, size))
        self.pending_bytes += size
        self._kick()

    def submit_store_offset(self, reference: str, offset: int) -> None:
        if self.closed:
            return
        if self.unavailable is not None:
            log.warning("store_offset_refused", stream=self.name, reason=self.unavailable)
            return
        self.pending.append(_StoreOffsetOp(reference, offset))
        self._kick()

    async def flush(self) -> None:
        """Wait until everything queued so far is written and committed."""
        while self.pending or self.writing:
            self._idle.clear()
            await self._idle.wait()

    def _kick(self) -> None:
        """Start the next group once per loop iteration: every frame that arrived in
        this iteration (all connections) joins it."""
        if self._kick_scheduled or self.writing or not self.pending or self.closed:
            return
        self._kick_scheduled = True
        asyncio.get_running_loop().call_soon(self._start_group)

    def _start_group(self) -> None:
        self._kick_scheduled = False
        if self.writing or not self.pending or self.closed:
            return
        limit = self.broker.config.log.group_commit_max_frames
        if len(self.pending) <= limit:
            ops, self.pending = self.pending, []
            self.pending_bytes = 0
        else:
            ops, self.pending = self.pending[:limit], self.pending[limit:]
            self.pending_bytes -= sum(op.size for op in ops)
        self.writing = True
        self._idle.clear()
        if self._write_inline(ops):
            return
        future = self.executor.submit(self._write_group, ops)
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._group_finished, ops, f))

    def _write_inline(self, ops: list[_Op]) -> bool:
        """In ``os`` sync mode a group is a ``pwritev`` per chunk into the page cache,
        cheaper than the hop to the writer thread and back: write it here, on the event
        loop, when the stream's writer lane is idle and the group cannot roll the
        segment (a roll fsyncs the sealed one: that stays on the writer thread)."""
        lane = self.executor
        if not isinstance(lane, Lane) or self.log.sync_mode != "os":
            return False
        data = sum(op.size for op in ops)
        chunks = len(ops) + data // self.log.config.max_chunk_bytes + 1
        if not self.log.fits_active_segment(data, chunks) or not lane.try_enter():
            return False
        try:
            result = self._write_group(ops)
        except Exception as exc:
            log.error("group_failed", stream=self.name, error=repr(exc))
            result = _GroupResult([ResponseCode.INTERNAL_ERROR] * len(ops))
        finally:
            lane.leave()
        self._group_done(ops, result)
        return True

    def _write_group(self, ops: Sequence[_Op]) -> _GroupResult:
        """Writer thread: append every op (same-producer runs as one chunk), fsync once."""
        result = _GroupResult([ResponseCode.OK] * len(ops))
        i = 0
        n = len(ops)
        try:
            while i < n:
                op = ops[i]
                if isinstance(op, _StoreOffsetOp):
                    try:
                        self.log.store_offset(op.reference, op.offset)
                    except (InvalidAppendError, ValueError) as exc:
                        log.warning("store_offset_rejected", stream=self.name, error=repr(exc))
                    i += 1
                    continue
                j = i + 1
                while j < n and isinstance(ops[j], _PublishOp) and ops[j].reference == op.reference:
                    j += 1
                self._append_run(ops, i, j, result)
                i = j
            result.chunk_id = self.log.sync().chunk_id
        except (OSError, LogError) as exc:
            log.error("write_failed", stream=self.name, error=repr(exc))
            result.error = repr(exc)
            code = ResponseCode.INTERNAL_ERROR
            if isinstance(exc, DamagedRangeError):  # offsets lost: no append may reuse them
                code = ResponseCode.STREAM_NOT_AVAILABLE
            elif isinstance(exc, SyncFailedError | OSError):
                # an I/O error (failed fsync, disk full mid-write or mid-roll) leaves the
                # files in an unknown state: reopen (recovery) before accepting more
                result.sync_failed = True
                code = ResponseCode.STREAM_NOT_AVAILABLE
            for k in range(len(ops)):
                result.codes[k] = code
        return result

    def _append_run(self, ops: Sequence[_Op], lo: int, hi: int, result: _GroupResult) -> None:
        run = [op for op in ops[lo:hi] if isinstance(op, _PublishOp)]
        reference = run[0].reference
        progress = BatchProgress()  # frames of the run already written (never twice)
        try:
            self._append(run, reference, result, progress)
            return
        except (RecordTooLargeError, InvalidAppendError, ValueError):
            if len(run) - progress.batches == 1:
                result.codes[lo + progress.batches] = ResponseCode.PRECONDITION_FAILED
                return
        for k in range(progress.batches, len(run)):  # isolate the frame that cannot be written
            try:
                self._append([run[k]], reference, result, BatchProgress())
            except (RecordTooLargeError, InvalidAppendError, ValueError):
                result.codes[lo + k] = ResponseCode.PRECONDITION_FAILED

    def _append(
        self,
        run: list[_PublishOp],
        reference: str | None,
        result: _GroupResult,
        progress: BatchProgress,
    ) -> None:
        """Append a run of frames through the log's one append path for pre-encoded
        batches (deduplication by ``reference`` and chunk splitting happen there)."""
        try:
            self.log.append_batches([op.batch for op in run], reference, progress)
        finally:
            result.chunks += progress.chunks
            result.duplicates += progress.duplicates

    def _group_finished(self, ops: Sequence[_Op], future: Future[_GroupResult]) -> None:
        try:
            result = future.result()
        except Exception as exc:  # the executor itself failed
            log.error("group_failed", stream=self.name, error=repr(exc))
            result = _GroupResult([ResponseCode.INTERNAL_ERROR] * len(ops))
        self._group_done(ops, result)

    def _group_done(self, ops: Sequence[_Op], result: _GroupResult) -> None:
        """On the loop: confirm (or refuse) every frame of a written group."""
        self.writing = False
        metrics = self.broker.metrics
        metrics.group_commits.inc()
        metrics.group_commit_frames.observe(len(ops))
        metrics.chunks_written.inc(result.chunks)
        metrics.duplicate_messages.inc(result.duplicates)
        dones = [
            (op.done, code)
            for op, code in zip(ops, result.codes, strict=True)
            if isinstance(op, _PublishOp)
        ]
        if self.confirm_gate is not None:
            # a cluster: the leader's own write counts toward the stream's commit
            # whatever its confirms wait for (ack = remote: the remote commit, below)
            gated = [] if self.remote_ack is not None else dones
            self.confirm_gate.group_written(self, result.chunk_id, gated)
        if self.remote_ack is not None:
            # ack = remote: confirmed at the remote commit (in a cluster only chunks the
            # members committed are tiered, and a deposed leader's commits are fenced)
            self.remote_ack.after_group(dones)
        elif self.confirm_gate is None:
            for done, code in dones:
                done(code)
        self.notifier.notify()
        self.activity += 1
        if result.sync_failed and self.unavailable is None and not self.closed:
            self.unavailable = f"fdatasync failed, reopening: {result.error}"
            self._reopen_task = asyncio.create_task(self.broker.reopen_after_sync_failure(self))
        if self.pending and not self.closed:
            self._kick()
        else:
            self._idle.set()
        self.update_throttle()

    # ----------------------------------------------------------------- back-pressure

    def block(self, listener: StreamListener) -> None:
        if listener not in self.blocked:
            self.blocked.add(listener)
            self.broker.metrics.throttle_events.inc()

    def update_throttle(self) -> None:
        if self.blocked and not self.congested:
            blocked, self.blocked = self.blocked, set()
            for listener in blocked:
                listener.resume_publishing(self)

    # ----------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        refs = self.log.segment_refs()
        local_bytes = 0
        for ref in refs:
            with contextlib.suppress(FileNotFoundError):
                local_bytes += os.path.getsize(ref.segment_path) + os.path.getsize(ref.index_path)
        commit = self.log.commit_point()
        remote = self.broker.remote_status.remote_status(self.record)
        if remote.get("upload_lag_bytes") is None:
            remote = {**remote, "upload_lag_bytes": self.tier_lag}
        return {
            "vhost": self.vhost,
            "name": self.name,
            # resolving: the first resolution runs; unavailable: appends refused (resolution
            # failed and is retried, or the log is being reopened) with the reason
            "state": (
                "available"
                if self.unavailable is None
                else "resolving"
                if self.unavailable == OPENING
                else "unavailable"
            ),
            "error": None if self.unavailable in (None, OPENING) else self.unavailable,
            "incarnation": self.record.incarnation,
            "created_ns": self.record.created_ns,
            "local": {
                "bytes": local_bytes,
                "segments": len(refs),
                "first_offset": refs[0].first_offset,
                "committed_chunk_id": commit.chunk_id,
                "committed_offset": commit.next_offset - 1,
                "next_offset": commit.next_offset,
                "epoch": self.log.epoch,
            },
            "remote": remote,
            "settings": self.settings.to_dict(),
            "publishers_throttled": bool(self.blocked),
            "queued_bytes": self.pending_bytes,
        }

    # ----------------------------------------------------------------- closing

    async def close(self, *, notify: bool) -> None:
        """Stop accepting work, finish the queue, close the log and the writer thread."""
        if self.closed:
            return
        await self.flush()
        self.closed = True
        self.notifier.close()
        if notify:
            for listener in list(self.listeners):
                listener.stream_unavailable(self)
        self.listeners.clear()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.log.close)
        self.executor.shutdown(wait=False)  # a lane of the shared pool: nothing to join


@dataclass(slots=True)
class StreamOpening:
    """A catalog stream not open yet: being resolved, or failed (with the error)."""

    record: StreamRecord
    state: str = "resolving"
    error: str | None = None

    def status(self) -> dict[str, Any]:
        return {
            "vhost": self.record.vhost,
            "name": self.record.name,
            "incarnation": self.record.incarnation,
            "created_ns": self.record.created_ns,
            "state": self.state,
            "error": self.error,
            "settings": self.record.settings.to_dict(),
        }


class Broker:
    """All streams of this server, opened from the catalog."""

    def __init__(
        self,
        config: ServerConfig,
        catalog: Catalog,
        metrics: Metrics,
        *,
        lag_provider: LagProvider = no_lag,
        remote_status: RemoteStatusProvider | None = None,
        lifecycle: StreamLifecycle | None = None,
    ) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.catalog = catalog
        self.metrics = metrics
        self.lag_provider = lag_provider
        self.remote_status: RemoteStatusProvider = remote_status or NoRemoteStatus()
        self.streams_dir = config.storage.streams_dir
        self._streams: dict[tuple[str, str], StreamHandle] = {}
        self._opening: dict[tuple[str, str], StreamOpening] = {}
        self._creating: set[tuple[str, str]] = set()
        self.connections: set[Any] = set()
        self._lock = asyncio.Lock()
        self._lag_task: asyncio.Task[None] | None = None
        self._open_task: asyncio.Task[None] | None = None
        self.catalog_loaded = asyncio.Event()
        self._open_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.writers = SerialPool(config.server.writer_threads, "writer")
        self.delivery_turns = DeliveryTurns()
        self.sac = SacCoordinator(PartitionIndexes(SuperStreamCatalog(catalog.meta)))
        """The node's single-active-consumer groups (``server/sac.py``)."""
        self.all_open = asyncio.Event()
        self._closing = False
        self.placement: StreamPlacement | None = None
        self.handle_opened: Callable[[StreamHandle], None] | None = None
        self.read_elsewhere: Callable[[str, str], StreamHandle | None] | None = None
        """A cluster node's read-only handle of a stream it is not a member of."""
        """Told of every handle before it is published (delayed delivery attaches its
        publish path to delayed streams here)."""

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Nothing is opened here: ``open_streams`` loads the catalog and opens its
        streams in the background once the listeners are open."""
        os.makedirs(self.streams_dir, exist_ok=True)
        self._lag_task = asyncio.create_task(self._poll_lag())

    def open_streams(self) -> None:
        """Load the catalog (every stream is ``resolving`` until open) and open its
        streams in the background. Until the catalog is loaded every stream name is
        answered as not available yet (retriable), and creations and deletions wait."""
        if self._open_task is None:
            self._open_task = asyncio.create_task(self._load_and_open())

    async def _load_and_open(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                records = await loop.run_in_executor(None, self.catalog.list)
                break
            except (TierlogError, OSError) as exc:  # the MetaStore answered at start-up
                log.error("catalog_load_failed", error=repr(exc))
                await asyncio.sleep(1.0)
        for record in records:
            self._opening[(record.vhost, record.name)] = StreamOpening(record)
        self.catalog_loaded.set()
        await self._open_all(records)

    async def _open_all(self, records: list[StreamRecord]) -> None:
        """Open (recover, resolve) every catalog stream, ``open_concurrency`` at a time."""
        if not records:
            self.all_open.set()
            return
        limit = asyncio.Semaphore(self.config.server.open_concurrency)
        started = asyncio.get_running_loop().time()

        async def open_one(record: StreamRecord) -> None:
            key = (record.vhost, record.name)
            async with limit:
                opening = self._opening.get(key)
                if opening is None:  # deleted meanwhile
                    return
                try:
                    if self.placement is not None and not await self.placement.should_open(record):
                        opening.state = LED_ELSEWHERE
                        return
                    await self._open(record)
                except NotLeaderError:
                    opening.state = LED_ELSEWHERE
                    return
                except (TierlogError, OSError) as exc:
                    opening.state, opening.error = "failed", repr(exc)
                    log.error(
                        "stream_open_failed",
                        vhost=record.vhost,
                        stream=record.name,
                        error=repr(exc),
                    )
                    return
                self._opening.pop(key, None)

        tasks = {}
        for record in records:
            key = (record.vhost, record.name)
            tasks[key] = asyncio.create_task(open_one(record))
        self._open_tasks = tasks
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        self._open_tasks = {}
        self.all_open.set()
        states = [o.state for o in self._opening.values()]
        log.info(
            "streams_opened",
            streams=len(records),
            # a stream another node leads is not a failure (this node follows it, or
            # reads it from the remote tier)
            failed=states.count("failed"),
            led_elsewhere=states.count(LED_ELSEWHERE),
            seconds=round(asyncio.get_running_loop().time() - started, 3),
        )

    def opening(self, vhost: str, name: str) -> StreamOpening | None:
        """The stream's start-up state while it is not open (None once open or unknown)."""
        return self._opening.get((vhost, name))

    def not_available_yet(self, vhost: str, name: str) -> bool:
        """A stream that is not open may still be one: the catalog is loading, or the
        stream is being opened (or failed to open) after a restart."""
        if not self.catalog_loaded.is_set() or (vhost, name) in self._opening:
            return True
        return self.placement is not None and self.placement.not_available(vhost, name)

    def opening_streams(self) -> list[StreamOpening]:
        """Catalog streams not open yet (a stream resolving is listed by its handle)."""
        return [o for key, o in self._opening.items() if key not in self._streams]

    async def close(self) -> None:
        self._closing = True
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
        if self._open_task is not None:
            self._open_task.cancel()
            for task in list(self._open_tasks.values()):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._open_task
            await asyncio.gather(*self._open_tasks.values(), return_exceptions=True)
        limit = asyncio.Semaphore(self.config.server.open_concurrency)

        async def close_one(handle: StreamHandle) -> None:
            async with limit:
                if self.lifecycle is not None:
                    await handle.flush()  # queued publishes first, then the final tiering
                    await self.lifecycle.closing(handle, flush=True)
                await handle.close(notify=False)

        # streams close concurrently (bounded): a final tiering each, not one after another
        results = await asyncio.gather(
            *(close_one(h) for h in list(self._streams.values())), return_exceptions=True
        )
        for error in results:
            if isinstance(error, BaseException):
                log.error("stream_close_failed", error=repr(error))
        self._streams.clear()
        self.writers.shutdown(wait=False)

    async def _open(self, record: StreamRecord) -> StreamHandle:
        settings = record.settings
        config = self.config.log.log_config(
            settings.max_segment_bytes,
            settings.max_segment_chunks,
            self.config.server.frame_max,
            settings.sync,
            settings.filter_size,
        )
        path = os.path.join(self.streams_dir, record.incarnation)
        executor = self.writers.lane(record.name)
        loop = asyncio.get_running_loop()

        def open_log() -> StreamLog:
            if os.path.isdir(path):
                return self._open_existing(record, path, config)
            return StreamLog.create(
                self.streams_dir, record.vhost, record.name, config, created_ns=record.created_ns
            )

        try:
            stream_log = await loop.run_in_executor(executor, open_log)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        handle = StreamHandle(record, stream_log, self, executor)
        if self.placement is not None:  # leadership before anyone sees the stream
            try:
                await self.placement.leading(handle)
            except BaseException:
                await handle.close(notify=False)
                raise
        if self.handle_opened is not None:
            self.handle_opened(handle)
        if self.lifecycle is not None:
            handle.unavailable = OPENING  # until the lifecycle (tiering) has resolved
        key = (record.vhost, record.name)
        self._streams[key] = handle
        if self.lifecycle is not None:
            try:
                await self.lifecycle.opened(handle)
            except BaseException:
                if self._streams.get(key) is handle:
                    del self._streams[key]
                await handle.close(notify=False)
                raise
        if stream_log.lost_range is not None:  # reads below it work, appends are refused
            handle.unavailable = stream_log.lost_range.describe()
        log.info(
            "stream_opened",
            vhost=record.vhost,
            stream=record.name,
            incarnation=record.incarnation,
            next_offset=stream_log.next_offset,
        )
        return handle

    def _open_existing(self, record: StreamRecord, path: str, config: LogConfig) -> StreamLog:
        """Open with recovery; damage recovery may not cut is repaired from the remote tier
        when it holds the range durably, else the file is moved aside and the stream
        refused (DamagedSegmentError naming file and range)."""

        def repair(exc: DamagedSegmentError) -> bool:
            if self.lifecycle is None:
                return False
            try:
                return self.lifecycle.repair_damaged(record, exc)
            except (TierlogError, OSError) as repair_exc:
                log.error(
                    "segment_repair_failed",
                    stream=record.name,
                    file=exc.segment_path,
                    error=repr(repair_exc),
                )
                return False

        report = DamageReport()
        try:
            return open_repairing(path, config, repair, report)
        finally:
            if report.repaired:
                self.metrics.local_damage_repaired.labels(record.vhost, record.name).inc(
                    len(report.repaired)
                )
            if report.refused is not None:
                self.metrics.local_damage_refused.labels(record.vhost, record.name).inc()

    async def reopen_after_sync_failure(self, handle: StreamHandle) -> None:
        """Close a stream whose fdatasync failed (its users are told) and open it again:
        recovery finds what really reached the disk before anything more is accepted."""
        async with self._lock:
            key = (handle.vhost, handle.name)
            if self._streams.get(key) is not handle:
                return
            del self._streams[key]
            if self.lifecycle is not None:
                await self.lifecycle.closing(handle, flush=False)
            try:
                await handle.close(notify=True)
            except (LogError, OSError) as exc:
                log.error("stream_close_failed", stream=handle.name, error=repr(exc))
            delay = 0.2
            while not self._closing:
                try:
                    await self._open(handle.record)
                except (TierlogError, OSError) as exc:  # e.g. the disk is still full
                    log.error("stream_reopen_failed", stream=handle.name, error=repr(exc))
                    await asyncio.sleep(delay)
                    delay = min(5.0, delay * 2)
                    continue
                log.warning("stream_reopened_after_io_error", stream=handle.name)
                return

    # ----------------------------------------------------------------- cluster placement

    async def take_over(self, record: StreamRecord) -> StreamHandle | None:
        """Open a catalog stream this node may now lead (its leader's lease is gone);
        None if another node got it first or it is open already."""
        key = (record.vhost, record.name)
        if self.busy(record.vhost, record.name) or self._closing:
            return None
        opening = self._opening.setdefault(key, StreamOpening(record, LED_ELSEWHERE))
        opening.state, opening.error = "resolving", None
        try:
            handle = await self._open(record)
        except NotLeaderError:
            opening.state = LED_ELSEWHERE
            return None
        except BaseException as exc:
            opening.state, opening.error = "failed", repr(exc)
            raise
        if self._opening.get(key) is opening:
            del self._opening[key]
        return handle

    def busy(self, vhost: str, name: str) -> bool:
        """Open, being created, or being opened here right now."""
        key = (vhost, name)
        opening = self._opening.get(key)
        return (
            key in self._streams
            or key in self._creating
            or (opening is not None and opening.state == "resolving")
        )

    async def release(self, handle: StreamHandle, reason: str) -> None:
        """Stop serving a stream this node no longer leads: its users are told (they
        look the leader up again), tiering stops without a final flush."""
        async with self._lock:
            key = (handle.vhost, handle.name)
            if self._streams.get(key) is not handle:
                return
            del self._streams[key]
            self._opening[key] = StreamOpening(handle.record, LED_ELSEWHERE, reason)
            if self.lifecycle is not None:
                await self.lifecycle.closing(handle, flush=False)
            try:
                await handle.close(notify=True)
            except (LogError, OSError) as exc:
                log.error("stream_close_failed", stream=handle.name, error=repr(exc))
            log.warning("stream_released", vhost=handle.vhost, stream=handle.name, reason=reason)

    def led_elsewhere(self, record: StreamRecord) -> None:
        """A catalog stream another node created or leads: known here, not open."""
        key = (record.vhost, record.name)
        if key not in self._streams and key not in self._creating:
            self._opening.setdefault(key, StreamOpening(record, LED_ELSEWHERE))

    def forget_elsewhere(self, vhost: str, name: str) -> None:
        """A stream led elsewhere was deleted from the catalog."""
        opening = self._opening.get((vhost, name))
        if opening is not None and opening.state == LED_ELSEWHERE:
            del self._opening[(vhost, name)]

    # ----------------------------------------------------------------- streams

    def get(self, vhost: str, name: str) -> StreamHandle | None:
        return self._streams.get((vhost, name))

    def readable(self, vhost: str, name: str) -> StreamHandle | None:
        """The handle consumers use: the open stream, else (on a cluster node) the
        read-only handle of a stream this node is not a member of."""
        handle = self.get(vhost, name)
        if handle is None and self.read_elsewhere is not None:
            return self.read_elsewhere(vhost, name)
        return handle

    def streams(self) -> list[StreamHandle]:
        return list(self._streams.values())

    async def exists(self, vhost: str, name: str) -> bool:
        """Whether the stream exists: open, opening, led elsewhere, being created here,
        or in the catalog (created on another node since the last scan)."""
        await self.catalog_loaded.wait()
        key = (vhost, name)
        if key in self._streams or key in self._opening or key in self._creating:
            return True
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.catalog.get, vhost, name) is not None

    async def create_stream(self, vhost: str, name: str, settings: StreamSettings) -> StreamHandle:
        """Create in the catalog then on disk; StreamExistsError if it exists.

        Creations of different streams run concurrently (the catalog's create-only put
        decides between racing creators of one name)."""
        await self.catalog_loaded.wait()
        check_creatable(self.config, settings)
        key = (vhost, name)
        if key in self._streams or key in self._opening or key in self._creating:
            raise StreamExistsError(f"stream {name!r} already exists")
        loop = asyncio.get_running_loop()
        self._creating.add(key)
        try:
            record = await loop.run_in_executor(None, self.catalog.create, vhost, name, settings)
            try:
                return await self._open(record)
            except BaseException:
                await loop.run_in_executor(None, self.catalog.delete, vhost, name)
                raise
        finally:
            self._creating.discard(key)

    async def delete_stream(self, vhost: str, name: str) -> StreamRecord:
        """Close the stream (telling its users), delete it from the catalog, then its files.

        The catalog delete enqueues the incarnation's cleanup (remote objects); the local
        directory goes here at once.
        """
        await self.catalog_loaded.wait()
        while (vhost, name) in self._creating:  # let a creation in progress finish first
            await asyncio.sleep(0.01)
        async with self._lock:
            record = self.catalog.require(vhost, name)
            opening = self._open_tasks.get((vhost, name))
            if opening is not None and not opening.done():
                await asyncio.gather(opening, return_exceptions=True)  # let it finish first
            self._opening.pop((vhost, name), None)
            handle = self._streams.pop((vhost, name), None)
            if handle is not None:
                if self.lifecycle is not None:
                    await self.lifecycle.closing(handle, flush=False)
                await handle.close(notify=True)
            self.catalog.delete(vhost, name)
            if self.placement is not None:
                await self.placement.stream_deleted(record)
            path = os.path.join(self.streams_dir, record.incarnation)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: shutil.rmtree(path, ignore_errors=True)
            )
            log.info("stream_deleted", vhost=vhost, stream=name, incarnation=record.incarnation)
            return record

    def update_settings(self, vhost: str, name: str, changes: dict[str, Any]) -> StreamRecord:
        """Change retention / tier settings (segment size applies from the next open)."""
        handle = self.get(vhost, name)
        if handle is None:
            return self.catalog.require(vhost, name)
        try:
            handle.record.settings.updated(**changes)
        except TypeError as exc:
            raise ConfigError(str(exc)) from exc
        record = self.catalog.update_settings(vhost, name, **changes)
        handle.record = record
        if "sync" in changes:  # the writer thread reads it at its next commit
            handle.log.set_sync_mode(record.settings.sync or self.config.log.sync)
        handle.update_throttle()
        return record

    # ----------------------------------------------------------------- back-pressure

    async def _poll_lag(self) -> None:
        """Refresh the tiering lag of streams that wrote since the last poll or still
        lag or throttle (an idle stream's lag cannot grow: no work per idle stream)."""
        while True:
            await asyncio.sleep(LAG_POLL_SECONDS)
            for handle in list(self._streams.values()):
                if handle.activity != handle.polled_activity or handle.tier_lag or handle.blocked:
                    handle.polled_activity = handle.activity
                    self.refresh_lag(handle)

    def refresh_lag(self, handle: StreamHandle) -> None:
        try:
            handle.tier_lag = int(self.lag_provider(handle.record))
        except Exception as exc:
            log.error("lag_provider_failed", stream=handle.name, error=repr(exc))
            return
        handle.update_throttle()
