"""The streams registry: catalog entries, their open local logs, and group commit.

Each stream has one writer thread (a single-worker executor): every mutating call on
its StreamLog runs there, as the log requires. Publish frames and StoreOffset
commands queue up on the event loop while the writer is busy; the next group takes
them all (up to ``group_commit_max_frames``), appends consecutive frames of the same
producer as one chunk, fsyncs once, and the loop then sends one PublishConfirm per
frame. Readers (subscriptions) read the segment files from the loop thread.

Back-pressure: a stream is *congested* when its queued bytes exceed a bound or the
tiering lag (``LagProvider``: committed bytes not yet in the remote tier, default 0)
exceeds the stream's ``max_lag_bytes``. Connections publishing to a congested stream
stop reading their socket until it is not congested any more (counted, never silent).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import operator
import os
import shutil
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.chunk import MAX_ENTRIES_PER_CHUNK, Entry, SubBatch
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishBatch
from tierlog.log.config import LogConfig
from tierlog.log.errors import (
    DamagedSegmentError,
    InvalidAppendError,
    LogError,
    RecordTooLargeError,
    SyncFailedError,
)
from tierlog.log.open_repairing import DamageReport, open_repairing
from tierlog.log.writer import StreamLog
from tierlog.server.chunk_source import ChunkSource, CommitNotifier, LocalChunkSource
from tierlog.server.config import ServerConfig
from tierlog.server.metrics import ServerMetrics
from tierlog.tiering.catalog import Catalog, StreamExistsError, StreamRecord
from tierlog.tiering.settings import StreamSettings

log = logging.getLogger("tierlog.server.broker")

_SUBBATCH = struct.Struct(">BHII")
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


class StreamUnavailableError(TierlogError):
    """The stream is closed or being deleted."""


if TYPE_CHECKING:
    from tierlog.server.tiered_source import TieredChunkSource


class StreamLifecycle(Protocol):
    """Told when a stream is opened and before it is closed (tiering hooks in here)."""

    async def opened(self, handle: StreamHandle) -> None: ...

    async def closing(self, handle: StreamHandle, *, flush: bool) -> None: ...

    def repair_damaged(self, record: StreamRecord, error: DamagedSegmentError) -> bool:
        """Rewrite a damaged local range from a healthy copy; True if anything was."""
        ...


class StreamListener(Protocol):
    """A connection that uses a stream and must hear when it goes away."""

    def stream_unavailable(self, stream: StreamHandle) -> None: ...

    def resume_publishing(self, stream: StreamHandle) -> None: ...


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


def _drop_duplicates(batch: PublishBatch, last: int) -> list[int]:
    """Indexes of the messages to keep: publishing ids above ``last`` and above every
    earlier id of the batch (what Osiris keeps); the others are confirmed as duplicates."""
    kept: list[int] = []
    for i, pid in enumerate(batch.publishing_ids):
        if pid > last:
            kept.append(i)
            last = pid
    return kept


def entries_of(batch: PublishBatch) -> list[Entry]:
    """The log's entries for a Publish frame: record bytes, or sub-batches passed verbatim."""
    raw = batch.entries
    if batch.record_counts is None:
        if isinstance(raw, tuple):
            return [e[4:] for e in raw]
        return [bytes(e[4:]) for e in raw]
    entries: list[Entry] = []
    for e in raw:
        if e[0] & 0x80:
            type_byte, records, uncompressed, _length = _SUBBATCH.unpack_from(e, 0)
            entries.append(
                SubBatch((type_byte >> 4) & 0x07, records, uncompressed, bytes(e[_SUBBATCH.size :]))
            )
        else:
            entries.append(bytes(e[4:]))
    return entries


@dataclass(eq=False)
class StreamHandle:
    """One open stream: catalog record, writer log, queue, readers' notifier."""

    record: StreamRecord
    log: StreamLog
    broker: Broker
    executor: ThreadPoolExecutor
    notifier: CommitNotifier = field(default_factory=CommitNotifier)
    pending: list[_Op] = field(default_factory=list)
    pending_bytes: int = 0
    writing: bool = False
    closed: bool = False
    tier_lag: int = 0
    _reopen_task: asyncio.Task[None] | None = None
    unavailable: str | None = None
    """Why appends are refused for now (retriable STREAM_NOT_AVAILABLE): the remote tier
    was not resolved yet, so any offset handed out could be one it already holds."""
    listeners: set[StreamListener] = field(default_factory=set)
    blocked: set[StreamListener] = field(default_factory=set)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _source: LocalChunkSource | TieredChunkSource | None = None

    def __post_init__(self) -> None:
        self._idle.set()
        self._source = LocalChunkSource(self.log, self.notifier)

    def use_source(self, source: TieredChunkSource) -> None:
        """Serve subscriptions from ``source`` (the cross-tier reader) from now on."""
        self._source = source

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
        """Where subscriptions read from (the cross-tier reader replaces this later)."""
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
        if self.closed:
            done(ResponseCode.STREAM_DOES_NOT_EXIST)
            return
        if self.unavailable is not None:
            done(ResponseCode.STREAM_NOT_AVAILABLE)
            return
        size = len(batch.entry_data()) if batch._data is not None else 16 * batch.num_entries
        self.pending.append(_PublishOp(batch, reference, done, size))
        self.pending_bytes += size
        self._kick()

    def submit_store_offset(self, reference: str, offset: int) -> None:
        if self.closed:
            return
        if self.unavailable is not None:
            log.warning(
                "event=store_offset_refused stream=%s reason=%s", self.name, self.unavailable
            )
            return
        self.pending.append(_StoreOffsetOp(reference, offset))
        self._kick()

    async def flush(self) -> None:
        """Wait until everything queued so far is written and committed."""
        while self.pending or self.writing:
            self._idle.clear()
            await self._idle.wait()

    def _kick(self) -> None:
        if self.writing or not self.pending or self.closed:
            return
        limit = self.broker.config.log.group_commit_max_frames
        ops, self.pending = self.pending[:limit], self.pending[limit:]
        self.pending_bytes -= sum(op.size for op in ops)
        self.writing = True
        self._idle.clear()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.executor, self._write_group, ops)
        future.add_done_callback(lambda f: self._group_done(ops, f))

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
                        log.warning(
                            "event=store_offset_rejected stream=%s error=%r", self.name, exc
                        )
                    i += 1
                    continue
                j = i + 1
                while j < n and isinstance(ops[j], _PublishOp) and ops[j].reference == op.reference:
                    j += 1
                self._append_run(ops, i, j, result)
                i = j
            self.log.sync()
        except (OSError, LogError) as exc:
            log.error("event=write_failed stream=%s error=%r", self.name, exc)
            result.error = repr(exc)
            code = ResponseCode.INTERNAL_ERROR
            if isinstance(exc, SyncFailedError | OSError):
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
        written = [0]  # frames of the run already durable-written (never appended twice)
        try:
            self._append(run, reference, result, written)
            return
        except (RecordTooLargeError, InvalidAppendError, ValueError):
            if len(run) - written[0] == 1:
                result.codes[lo + written[0]] = ResponseCode.PRECONDITION_FAILED
                return
        for k in range(written[0], len(run)):  # isolate the frame that cannot be written
            try:
                self._append([run[k]], reference, result, [0])
            except (RecordTooLargeError, InvalidAppendError, ValueError):
                result.codes[lo + k] = ResponseCode.PRECONDITION_FAILED

    def _append(
        self,
        run: list[_PublishOp],
        reference: str | None,
        result: _GroupResult,
        written: list[int],
    ) -> None:
        """Append a run of frames as pre-encoded chunks (``StreamLog.append_encoded``):
        frames are concatenated up to ``max_chunk_bytes``; with a ``reference``,
        publishing ids not above the producer's sequence are dropped first (a frame
        that is all new, the usual case, is checked in C and passed on as it is).
        ``written[0]`` counts the frames whose chunk is written."""
        limit = self.log.config.max_chunk_bytes
        last = -1
        if reference is not None:
            known = self.log.producer_sequence(reference)
            last = -1 if known is None else known
        parts: list[bytes] = []
        size = entries = records = 0
        first_id = last_id = -1
        pending = 0  # frames in ``parts``

        def flush() -> None:
            nonlocal parts, size, entries, records, pending
            if parts:
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                if reference is None:
                    self.log.append_encoded(data, entries, records)
                else:
                    self.log.append_encoded(
                        data,
                        entries,
                        records,
                        producer=reference,
                        first_publishing_id=first_id,
                        last_publishing_id=last_id,
                    )
                result.chunks += 1
            written[0] += pending
            parts, size, entries, records, pending = [], 0, 0, 0, 0

        for op in run:
            batch = op.batch
            data = batch.entry_data()
            if len(data) > limit:  # one frame over a chunk: the log's general append splits
                flush()
                entries_list = entries_of(batch)
                if reference is None:
                    appended = self.log.append(entries_list)
                else:
                    appended = self.log.append(entries_list, reference, batch.publishing_ids)
                    known = self.log.producer_sequence(reference)
                    last = -1 if known is None else known
                result.chunks += len(appended.chunk_ids)
                result.duplicates += len(appended.dropped)
                written[0] += 1
                continue
            n_entries = batch.num_entries
            n_records = batch.num_records
            if reference is not None:
                ids = batch.publishing_ids
                if ids[0] <= last or not all(map(operator.lt, ids, itertools.islice(ids, 1, None))):
                    kept = _drop_duplicates(batch, last)
                    result.duplicates += n_entries - len(kept)
                    if not kept:
                        pending += 1
                        continue
                    data = b"".join(batch.entries[i] for i in kept)
                    n_entries = len(kept)
                    counts = batch.record_counts
                    n_records = n_entries if counts is None else sum(counts[i] for i in kept)
                    ids = [ids[i] for i in kept]
                last = ids[-1]
            if parts and (size + len(data) > limit or entries + n_entries > MAX_ENTRIES_PER_CHUNK):
                flush()
            if reference is not None:
                if not parts:
                    first_id = ids[0]
                last_id = ids[-1]
            parts.append(data)
            size += len(data)
            entries += n_entries
            records += n_records
            pending += 1
        flush()

    def _group_done(self, ops: Sequence[_Op], future: asyncio.Future[_GroupResult]) -> None:
        self.writing = False
        metrics = self.broker.metrics
        try:
            result = future.result()
        except Exception as exc:  # the executor itself failed
            log.error("event=group_failed stream=%s error=%r", self.name, exc)
            result = _GroupResult([ResponseCode.INTERNAL_ERROR] * len(ops))
        metrics.fsyncs.inc()
        metrics.group_frames.observe(len(ops))
        metrics.chunks_written.inc(result.chunks)
        metrics.duplicate_messages.inc(result.duplicates)
        for op, code in zip(ops, result.codes, strict=True):
            if isinstance(op, _PublishOp):
                op.done(code)
        self.notifier.notify()
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
            self.broker.metrics.throttled.set(1, stream=self.name)

    def update_throttle(self) -> None:
        if self.blocked and not self.congested:
            blocked, self.blocked = self.blocked, set()
            self.broker.metrics.throttled.set(0, stream=self.name)
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
        self.executor.shutdown(wait=True)


class Broker:
    """All streams of this server, opened from the catalog."""

    def __init__(
        self,
        config: ServerConfig,
        catalog: Catalog,
        metrics: ServerMetrics,
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
        self.connections: set[Any] = set()
        self._lock = asyncio.Lock()
        self._lag_task: asyncio.Task[None] | None = None
        self._closing = False
        metrics.streams.source = lambda: [((), float(len(self._streams)))]
        self.damage_repaired = metrics.registry.counter(
            "tierlog_local_damage_repaired_total",
            "Damaged local segment ranges rewritten from the remote tier (by stream).",
        )
        self.damage_refused = metrics.registry.counter(
            "tierlog_local_damage_refused_total",
            "Streams refused because a local segment is damaged and no healthy copy exists.",
        )

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        os.makedirs(self.streams_dir, exist_ok=True)
        for record in self.catalog.list():
            try:
                await self._open(record)
            except (TierlogError, OSError) as exc:
                log.error("event=stream_open_failed stream=%s error=%r", record.name, exc)
        self._lag_task = asyncio.create_task(self._poll_lag())

    async def close(self) -> None:
        self._closing = True
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
        for handle in list(self._streams.values()):
            if self.lifecycle is not None:
                await handle.flush()  # queued publishes first, then the final tiering
                await self.lifecycle.closing(handle, flush=True)
            await handle.close(notify=False)
        self._streams.clear()

    async def _open(self, record: StreamRecord) -> StreamHandle:
        settings = record.settings
        config = self.config.log.log_config(
            settings.max_segment_bytes, settings.max_segment_chunks, self.config.server.frame_max
        )
        path = os.path.join(self.streams_dir, record.incarnation)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"writer-{record.name}")
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
        if self.lifecycle is not None:
            handle.unavailable = "opening"  # until the lifecycle (tiering) has resolved
        self._streams[(record.vhost, record.name)] = handle
        if self.lifecycle is not None:
            await self.lifecycle.opened(handle)
        log.info(
            "event=stream_opened stream=%s incarnation=%s next_offset=%d",
            record.name,
            record.incarnation,
            stream_log.next_offset,
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
                    "event=segment_repair_failed stream=%s file=%s error=%r",
                    record.name,
                    exc.segment_path,
                    repair_exc,
                )
                return False

        report = DamageReport()
        try:
            return open_repairing(path, config, repair, report)
        finally:
            if report.repaired:
                self.damage_repaired.inc(len(report.repaired), stream=record.incarnation)
            if report.refused is not None:
                self.damage_refused.inc(stream=record.incarnation)

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
                log.error("event=stream_close_failed stream=%s error=%r", handle.name, exc)
            delay = 0.2
            while not self._closing:
                try:
                    await self._open(handle.record)
                except (TierlogError, OSError) as exc:  # e.g. the disk is still full
                    log.error("event=stream_reopen_failed stream=%s error=%r", handle.name, exc)
                    await asyncio.sleep(delay)
                    delay = min(5.0, delay * 2)
                    continue
                log.warning("event=stream_reopened_after_io_error stream=%s", handle.name)
                return

    # ----------------------------------------------------------------- streams

    def get(self, vhost: str, name: str) -> StreamHandle | None:
        return self._streams.get((vhost, name))

    def streams(self) -> list[StreamHandle]:
        return list(self._streams.values())

    async def create_stream(self, vhost: str, name: str, settings: StreamSettings) -> StreamHandle:
        """Create in the catalog then on disk; StreamExistsError if it exists."""
        async with self._lock:
            if (vhost, name) in self._streams:
                raise StreamExistsError(f"stream {name!r} already exists")
            record = self.catalog.create(vhost, name, settings)
            try:
                return await self._open(record)
            except BaseException:
                self.catalog.delete(vhost, name)
                raise

    async def delete_stream(self, vhost: str, name: str) -> StreamRecord:
        """Close the stream (telling its users), delete it from the catalog, then its files.

        The catalog delete enqueues the incarnation's cleanup (remote objects); the local
        directory goes here at once.
        """
        async with self._lock:
            record = self.catalog.require(vhost, name)
            handle = self._streams.pop((vhost, name), None)
            if handle is not None:
                if self.lifecycle is not None:
                    await self.lifecycle.closing(handle, flush=False)
                await handle.close(notify=True)
            self.catalog.delete(vhost, name)
            path = os.path.join(self.streams_dir, record.incarnation)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: shutil.rmtree(path, ignore_errors=True)
            )
            log.info("event=stream_deleted stream=%s incarnation=%s", name, record.incarnation)
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
        handle.update_throttle()
        return record

    # ----------------------------------------------------------------- back-pressure

    async def _poll_lag(self) -> None:
        while True:
            await asyncio.sleep(LAG_POLL_SECONDS)
            for handle in list(self._streams.values()):
                self.refresh_lag(handle)

    def refresh_lag(self, handle: StreamHandle) -> None:
        try:
            handle.tier_lag = int(self.lag_provider(handle.record))
        except Exception as exc:
            log.error("event=lag_provider_failed stream=%s error=%r", handle.name, exc)
            return
        handle.update_throttle()
