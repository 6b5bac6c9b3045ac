"""Streams served read-only from the remote tier (read anywhere): the handle the protocol
handlers use for a stream this node does not write, its cursors, and the registry of such
streams with the one manifest follower thread.

``RemoteStreamHandle`` is a ``StreamHandle`` look-alike: subscriptions read the committed
manifest through the cross-tier reader without a local log; publishes are refused
(``STREAM_NOT_AVAILABLE``: send them to a member); StoreOffset and QueryOffset go to the
stream's leader when a cluster node has one that answers (``forward_offset``), else
StoreOffset goes to the MetaStore (``remote.consumer_offsets``) and QueryOffset answers from
there or (a read-only node) from the tracking state the remote tier holds. One
``ManifestFollower`` thread polls the manifest pointers of every stream served (bounded
rate) and wakes their consumers when a commit lands.

Freshness (see ``read.manifest_follower``): fragment age + upload + commit debounce +
``reader.poll_interval_seconds``. ``next`` and ``last`` resolve against the leader's
committed tail when ``leader_tail`` gets it (a cluster node asks the leader; chunks the
remote tier holds below that offset are not delivered), else against
the remote tier's tail, which lags the leader by that freshness (logged as
``read_anywhere_tail_from_remote`` with the remote tail it used).

Hooks for a cluster: ``RemoteStreams.handle(record)`` gives the read-only handle of any
catalog stream (a member node can serve its non-member streams through it), and
``RemoteStreams.leader_tail`` asks a stream's leader for its committed tail and a
producer's sequence (None: no reachable leader answered); ``RemoteStreams.forward_offset``
sends it consumer offsets (None: no links, the MetaStore keeps them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from tierlog.errors import TierlogError
from tierlog.formats.bloom import ChunkFilter
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishBatch
from tierlog.log.commit_point import CommitPoint
from tierlog.log.errors import CorruptChunkError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.logs import get_logger
from tierlog.read.errors import FragmentExpiredError, ReadError
from tierlog.read.manifest_follower import FollowedManifest, ManifestFollower
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.remote_tracking import RemoteTracking
from tierlog.read.strategies import ReadStrategy
from tierlog.read.tiered_reader import TieredChunk, TieredReader, default_prefetcher
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.consumer_offsets import ConsumerOffsets
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.remote.settings import StreamSettings
from tierlog.server.chunk_source import (
    ChunkSource,
    CommitNotifier,
    DeliverableChunk,
    deliverable_from_raw,
)
from tierlog.server.config import ServerConfig
from tierlog.server.errors import OffsetUnavailableError, SourceClosedError, UnreadableDataError
from tierlog.storage.object_store import ObjectStore

log = get_logger("tierlog.server.remote_stream")

_READS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="follower-read")
READ_AHEAD_BYTES = 1 << 20
READ_AHEAD_CHUNKS = 256


class CommittedTail(NamedTuple):
    """Where a stream's committed part ends on its leader: the offset after the last
    committed chunk, the last committed user chunk (-1: none) and, when asked for, a
    producer's last publishing id (None: unknown reference), and the committed chunk
    itself (-1: not told; StreamStats answers it)."""

    next_offset: int
    last_chunk_id: int
    sequence: int | None = None
    commit_chunk_id: int = -1


LeaderTail = Callable[[StreamRecord, str], Awaitable[CommittedTail | None]]
"""``(record, producer reference)`` → the stream leader's committed tail, or None when no
reachable leader answered (bounded by a timeout)."""


async def no_leader(record: StreamRecord, reference: str) -> CommittedTail | None:
    return None


class LeaderOffset(NamedTuple):
    """The leader's answer to a forwarded StoreOffset or QueryOffset: the consumer's
    offset (None: none stored)."""

    offset: int | None


ForwardOffset = Callable[[StreamRecord, str, int | None], Awaitable[LeaderOffset | None]]
"""``(record, consumer reference, offset to store or None to query)`` → the leader's
answer, or None when no reachable leader answered (bounded by a timeout)."""


def resolve_spec(spec: OffsetSpec, tail: CommittedTail | None) -> OffsetSpec:
    """``next`` and ``last`` against the leader's committed tail when it answered: the
    cursor waits at the remote tier's tail and skips what comes below that offset.
    Otherwise unchanged (the remote tier's tail, lagging the leader by the freshness
    above)."""
    if tail is None:
        return spec
    if spec.kind == "next":
        return OffsetSpec.offset(tail.next_offset)
    if spec.kind == "last":
        return OffsetSpec.offset(
            tail.last_chunk_id if tail.last_chunk_id >= 0 else tail.next_offset
        )
    return spec


class RemoteChunkCursor:
    """A subscription's position in a followed stream: a cross-tier reader without a
    local log (every read on a thread), a few chunks read ahead per thread hop."""

    def __init__(
        self, handle: RemoteStreamHandle, spec: OffsetSpec, chunk_filter: ChunkFilter | None = None
    ) -> None:
        self._handle = handle
        self._filter = chunk_filter
        # ``next`` / ``last`` are where the stream ends now (at Subscribe), not when the
        # first read runs: the leader is asked now, its answer awaited at the first read
        self._asked = spec
        self._tail: asyncio.Task[CommittedTail | None] | None = None
        if spec.kind in ("next", "last"):
            self._tail = asyncio.get_running_loop().create_task(handle.leader_tail())
        tree = handle.manifest_view.loaded_tree()
        if spec.kind == "next" and tree is not None and handle.listeners:
            spec = OffsetSpec.offset(tree.next_offset)  # polled: fresh within the interval
        self._spec = spec
        self._skip_below = -1  # chunks wholly below the leader's tail are not delivered
        self._reader: TieredReader | None = None
        self._ready: deque[TieredChunk] = deque()

    @property
    def next_offset(self) -> int:
        if self._ready:
            return self._ready[0].header.chunk_id
        return self._reader.next_offset if self._reader is not None else -1

    def _attach(self) -> None:
        self._handle.refresh_if_idle()
        self._reader = TieredReader(
            None,
            self._handle.manifest,
            self._spec,
            strategy=ReadStrategy.NOT_IN_DISK,
            prefetcher=default_prefetcher(),
            chunk_filter=self._filter,
        )

    def _read_run(self) -> TieredChunk | None:
        if self._reader is None:
            self._attach()
        reader = self._reader
        assert reader is not None
        first = reader.read_chunk()
        # the reader starts at the remote tier's tail when the leader's is further on:
        # whole chunks below that offset precede what ``next`` / ``last`` asked for
        while first is not None and first.header.next_offset <= self._skip_below:
            first = reader.read_chunk()
        if first is None:
            return None
        taken = first.header.data_length
        while taken < READ_AHEAD_BYTES and len(self._ready) < READ_AHEAD_CHUNKS:
            chunk = reader.read_chunk()
            if chunk is None:
                break
            self._ready.append(chunk)
            taken += chunk.header.data_length
        return first

    async def _resolve(self) -> None:
        """The leader's answer to ``next`` / ``last``, or the remote tier's (with its lag
        stated in the log)."""
        assert self._tail is not None
        task, self._tail = self._tail, None
        tail = await task
        if tail is not None:
            self._spec = resolve_spec(self._asked, tail)
            self._skip_below = self._spec.value
            return
        tree = self._handle.manifest_view.loaded_tree()
        log.info(
            "read_anywhere_tail_from_remote",
            stream=self._handle.name,
            spec=self._asked.kind,
            remote_next_offset=None if tree is None else tree.next_offset,
            lag="fragment age + upload + commit debounce + poll interval",
        )

    async def read(self) -> DeliverableChunk | None:
        if self._handle.notifier.closed:
            raise SourceClosedError("stream closed")
        if self._tail is not None:
            await self._resolve()
        if self._ready:
            chunk: TieredChunk | None = self._ready.popleft()
        else:
            loop = asyncio.get_running_loop()
            try:
                chunk = await loop.run_in_executor(_READS, self._read_run)
            except FragmentExpiredError as exc:
                first = self._handle.first_offset()
                if 0 <= self.next_offset < first:
                    raise OffsetOvertakenError(self.next_offset, first) from exc
                raise UnreadableDataError(f"remote data vanished: {exc}", "remote") from exc
            except CorruptChunkError as exc:
                raise UnreadableDataError(str(exc), "remote") from exc
            except ReadError as exc:
                raise UnreadableDataError(str(exc), "remote") from exc
        if chunk is None:
            return None
        assert chunk.raw is not None
        return deliverable_from_raw(chunk.header, chunk.raw)

    async def wait(self, timeout: float | None = None) -> None:
        if self._reader is None or self._ready or self._tail is not None:
            return
        tree = self._handle.manifest_view.committed_tree()
        if self._reader.next_offset < tree.next_offset:
            return
        await self._handle.notifier.wait(timeout)

    def close(self) -> None:
        self._ready.clear()
        if self._tail is not None:
            self._tail.cancel()
        if self._reader is not None:
            self._reader.close()


class RemoteTail:
    """What the handlers ask of a stream's ``log``, answered from the remote tier and
    the MetaStore."""

    def __init__(self, handle: RemoteStreamHandle) -> None:
        self._handle = handle

    def commit_point(self) -> CommitPoint:
        tree = self._handle.manifest_view.loaded_tree()
        end = 0 if tree is None else tree.next_offset
        return CommitPoint(end - 1, end, end, 0)

    def producer_sequence(self, reference: str) -> int | None:
        return None  # publishing goes to the stream's writer, not here

    def query_offset(self, reference: str) -> int | None:
        return self._handle.query_offset(reference)


class RemoteStreamHandle:
    """A catalog stream served read-only from the remote tier (the handlers' view of a
    ``StreamHandle``)."""

    def __init__(self, streams: RemoteStreams, record: StreamRecord) -> None:
        self.streams = streams
        self.record = record
        self.notifier = CommitNotifier()
        self.listeners: set[Any] = set()
        self.blocked: set[Any] = set()
        self.closed = False
        self.unavailable: str | None = None
        self.congested = False
        self.remote_ack = None  # what a written stream has and a read-only one has not
        self.delayed = None
        self.manifest_view: FollowedManifest = streams.follower.follow(
            record.incarnation,
            self._changed,
            m=record.settings.manifest_fanout,
            active=lambda: bool(self.listeners),  # polled while connections use it here
        )
        self.manifest = ManifestSource(self.manifest_view)
        self.tracking = RemoteTracking(self.manifest)
        self.log = RemoteTail(self)
        self.source: ChunkSource = self
        self._stores: set[Future[bool]] = set()
        self._forwards: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def vhost(self) -> str:
        return self.record.vhost

    @property
    def settings(self) -> StreamSettings:
        return self.record.settings

    def _changed(self) -> None:  # the follower's thread: a newer committed tree
        loop = self.streams.loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
            loop.call_soon_threadsafe(self.notifier.notify)

    def refresh_if_idle(self) -> None:
        """Read the pointer now unless the follower polls it (someone reads the stream
        here): an idle stream's tree may be old. Blocking: call it off the event loop."""
        if not self.listeners:
            self.manifest_view.poll()

    async def leader_tail(self, reference: str = "") -> CommittedTail | None:
        """The leader's committed tail (and ``reference``'s sequence), None when no
        reachable leader answered."""
        try:
            return await self.streams.leader_tail(self.record, reference)
        except Exception as exc:  # asking the leader failing must not fail the read
            log.warning("leader_tail_failed", stream=self.name, error=repr(exc))
            return None

    # -- ChunkSource --------------------------------------------------------------------
    def attach(
        self, spec: OffsetSpec, *, want_file: bool = False, chunk_filter: ChunkFilter | None = None
    ) -> RemoteChunkCursor:
        return RemoteChunkCursor(self, spec, chunk_filter)

    def first_offset(self) -> int:
        tree = self.manifest_view.loaded_tree()
        return 0 if tree is None else tree.first_offset

    # -- what a writer would do ---------------------------------------------------------
    def submit_publish(
        self, batch: PublishBatch, reference: str | None, done: Callable[[int], None]
    ) -> None:
        done(ResponseCode.STREAM_NOT_AVAILABLE)  # not a member: publish to the writer

    def block(self, listener: Any) -> None:
        pass

    def submit_store_offset(self, reference: str, offset: int) -> None:
        """StoreOffset: to the stream's leader when it answers (``forward_offset``), else
        into the MetaStore, under the writer epoch of the committed manifest this node
        follows (which the leader takes over)."""
        if self.streams.forward_offset is None:
            self._store_in_meta(reference, offset)
            return
        task = asyncio.get_running_loop().create_task(self._forward_store(reference, offset))
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    async def _forward_store(self, reference: str, offset: int) -> None:
        forward = self.streams.forward_offset
        assert forward is not None
        try:
            answer = await forward(self.record, reference, offset)
        except Exception as exc:  # forwarding failing must not lose the offset
            log.warning("store_offset_forward_failed", stream=self.name, error=repr(exc))
            answer = None
        if answer is not None:
            return
        log.info("store_offset_in_meta_store", stream=self.name, reference=reference)
        future = self._store_in_meta(reference, offset)
        with contextlib.suppress(Exception):  # logged by ``_stored``
            await asyncio.wrap_future(future)

    def _store_in_meta(self, reference: str, offset: int) -> Future[bool]:
        future = self.streams.io.submit(self._store_offset, reference, offset)
        self._stores.add(future)
        future.add_done_callback(self._stored)
        return future

    def _store_offset(self, reference: str, offset: int) -> bool:
        self.refresh_if_idle()  # the epoch of the manifest as it is now
        epoch = self.manifest_view.epoch
        return self.streams.offsets.store(self.record.incarnation, reference, offset, epoch)

    def _stored(self, future: Future[bool]) -> None:
        self._stores.discard(future)
        error = future.exception()
        if error is not None:
            log.warning("store_offset_failed", stream=self.name, error=repr(error))

    async def flush(self) -> None:
        """Wait for the StoreOffsets sent so far (QueryOffset then sees them)."""
        if self._forwards:
            await asyncio.gather(*list(self._forwards), return_exceptions=True)
        pending = [asyncio.wrap_future(f) for f in list(self._stores)]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def query_offset_async(self, reference: str) -> int | None:
        """The leader's answer when it gives one (``forward_offset``); on a read-only node
        (no links) ``query_offset`` off the event loop (MetaStore and object-store reads).

        A cluster node whose QueryOffset no leader answered refuses
        (``OffsetUnavailableError``: STREAM_NOT_AVAILABLE, the client asks again) rather
        than guess: the remote tier's tracking state lags the leader's log by the tiering
        delay, and a MetaStore value can be older than the log's (a store whose forward
        timed out is written there late, after newer stores reached the leader). The
        leader never answers such older values: it takes a MetaStore value over only when
        it is higher than its log's."""
        forward = self.streams.forward_offset
        loop = asyncio.get_running_loop()
        if forward is None:
            return await loop.run_in_executor(self.streams.io, self.query_offset, reference)
        try:
            answer = await forward(self.record, reference, None)
        except Exception as exc:  # asking the leader failing must not fail the query
            log.warning("query_offset_forward_failed", stream=self.name, error=repr(exc))
            answer = None
        if answer is not None:
            return answer.offset
        raise OffsetUnavailableError(
            f"{self.name}: no leader answered for the offset of {reference!r}"
        )

    def query_offset(self, reference: str) -> int | None:
        """The consumer's offset. A MetaStore value not taken over by a writer, stored under
        the current writer epoch or later, is the newest; one a writer took over is, until the
        remote tier holds the log beyond the take-over; otherwise the writer's log as the
        remote tier holds it (its tracking state), else whatever the MetaStore has."""
        self.refresh_if_idle()
        stored = self.streams.offsets.query(self.record.incarnation, reference)
        if stored is not None:
            if stored.taken_at is None and stored.epoch >= self.manifest_view.epoch:
                return stored.offset
            if stored.taken_at is not None:
                tree = self.manifest_view.committed_tree()
                if tree.next_offset < stored.taken_at:
                    return stored.offset
        try:
            tracked = self.tracking.consumer_offset(reference)
        except (TierlogError, OSError) as exc:
            log.warning("remote_tracking_failed", stream=self.name, error=repr(exc))
            tracked = None
        if tracked is not None:
            return tracked
        return None if stored is None else stored.offset

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.notifier.close()
        for listener in list(self.listeners):
            listener.stream_unavailable(self)
        self.listeners.clear()
        self.streams.follower.unfollow(self.record.incarnation)
        self.tracking.close()

    def status(self) -> dict[str, Any]:
        tree = self.manifest_view.loaded_tree()
        return {
            "vhost": self.vhost,
            "name": self.name,
            "state": "read-only",
            "incarnation": self.record.incarnation,
            "remote": {
                "first_offset": None if tree is None else tree.first_offset,
                "tiered_offset": None if tree is None else tree.next_offset,
                "epoch": self.manifest_view.epoch,
            },
            "settings": self.settings.to_dict(),
        }


class RemoteStreams:
    """Every catalog stream this node serves read-only, and the one follower thread."""

    def __init__(
        self,
        config: ServerConfig,
        catalog: Catalog,
        store: ObjectStore,
        *,
        leader_tail: LeaderTail = no_leader,
        forward_offset: ForwardOffset | None = None,
    ) -> None:
        reader = config.reader
        self.catalog = catalog
        self.offsets = ConsumerOffsets(catalog.meta)
        self.follower = ManifestFollower(
            catalog,
            store,
            config.tier.prefix,
            interval=reader.poll_interval_seconds,
            max_reads_per_second=reader.max_pointer_reads_per_second,
        )
        self.leader_tail = leader_tail
        self.forward_offset = forward_offset  # None: no links, the MetaStore holds them
        self.io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="read-only-meta")
        self._handles: dict[tuple[str, str], RemoteStreamHandle] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # set by ``start``

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.follower.start()

    def handle(self, record: StreamRecord) -> RemoteStreamHandle:
        key = (record.vhost, record.name)
        handle = self._handles.get(key)
        if handle is not None and handle.record.incarnation != record.incarnation:
            handle.close()  # deleted and created again: a new incarnation
            handle = None
        if handle is None:
            handle = RemoteStreamHandle(self, record)
            self._handles[key] = handle
        return handle

    def known(self, vhost: str, name: str) -> RemoteStreamHandle | None:
        return self._handles.get((vhost, name))

    def drop(self, vhost: str, name: str) -> None:
        """Close the read-only handle of a stream (this node became a member of it)."""
        handle = self._handles.pop((vhost, name), None)
        if handle is not None:
            handle.close()

    def forget_missing(self, present: set[tuple[str, str]]) -> None:
        for key in [k for k in self._handles if k not in present]:
            self._handles.pop(key).close()

    def close(self) -> None:
        for handle in list(self._handles.values()):
            handle.close()
        self._handles.clear()
        self.follower.stop()
        self.io.shutdown(wait=False)
