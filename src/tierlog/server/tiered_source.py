"""The one ChunkSource of a stream: subscriptions read any offset, local or remote.

``StreamChunkSource`` is built once per open stream from its local log; when tiering
starts it is told the stream's remote tier (the live tierer), and from then on every
cursor it attaches reads across tiers through ``read.TieredReader`` (local log + the
tierer's committed manifest, with the stream's read strategy and the process-wide
prefetcher). Before that, cursors read the local log only. Remote reads block on the
object store, so they run on a thread pool; chunks held locally are read inline (a pread
from the page cache), exactly like the local-only cursor.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tierlog.formats.bloom import ChunkFilter
from tierlog.log.errors import CorruptChunkError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogSource
from tierlog.read.chunk_lookup import local_gap_resumes
from tierlog.read.errors import FragmentExpiredError, ReadError
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.remote_cursor import default_prefetcher
from tierlog.read.strategies import ReadStrategy
from tierlog.read.tiered_reader import TieredChunk, TieredReader
from tierlog.remote.committed import CommittedManifest
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.server.chunk_source import (
    CommitNotifier,
    DeliverableChunk,
    LocalChunkCursor,
    LocalChunkSource,
    deliverable_from_raw,
)
from tierlog.server.errors import SourceClosedError, UnreadableDataError
from tierlog.tiering.tierer import StreamTierer

_REMOTE_READS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="remote-read")

READ_AHEAD_BYTES = 1 << 20
"""Remote chunks one thread hop reads for a cursor at least (after the first): a hop
costs tens of microseconds of the event loop and the GIL, a chunk can be a few hundred
bytes."""
MAX_READ_AHEAD_BYTES = 4 << 20
"""At most this much per hop: one prefetch request while few readers share the budget
(the views pin their fetched blocks until delivered, so it follows the request size,
which shrinks as readers multiply)."""
READ_AHEAD_CHUNKS = 256


class StreamChunkSource:
    """Where a stream's subscriptions read from: its local log, plus its remote tier once
    tiering has started (the remote part is fixed from then on; cursors attached before
    keep reading the local log, which holds everything they can reach)."""

    def __init__(
        self, log: LogSource, notifier: CommitNotifier, strategy: Callable[[], str]
    ) -> None:
        self._log = log
        self._notifier = notifier
        self._strategy = strategy
        self._local = LocalChunkSource(log, notifier)
        self._tierer: StreamTierer | CommittedManifest | None = None
        self._manifest: ManifestSource | None = None

    def limit_reads(self, log: LogSource) -> None:
        """Cursors attached from now on read the local log through ``log``, a view that
        ends earlier (``ack = remote`` streams: only what the remote tier committed)."""
        self._log = log
        self._local = LocalChunkSource(log, self._notifier)

    def tier_started(self, tierer: StreamTierer | CommittedManifest) -> None:
        """The stream's remote tier is resolved: attach across tiers from now on."""
        self._manifest = ManifestSource(tierer)
        self._tierer = tierer

    def first_offset(self) -> int:
        if self._tierer is not None:
            tree = self._tierer.committed_tree()
            if not tree.is_empty:
                return tree.first_offset
        return self._log.segment_refs()[0].first_offset

    def attach(
        self, spec: OffsetSpec, *, want_file: bool = False, chunk_filter: ChunkFilter | None = None
    ) -> LocalChunkCursor | TieredChunkCursor:
        if self._manifest is None:
            return self._local.attach(spec, want_file=want_file, chunk_filter=chunk_filter)
        return TieredChunkCursor(self, spec, want_file, chunk_filter)

    def strategy(self) -> ReadStrategy:
        return ReadStrategy.parse(self._strategy())

    def reader(self, spec: OffsetSpec, local: LogSource) -> TieredReader:
        """A blocking reader of the whole stream from ``spec`` over ``local`` (the stream's
        full local log: an internal reader such as a delayed stream's scheduler reads
        everything committed locally, not the consumers' view, which on a cluster leader
        or an ``ack = remote`` stream ends earlier) and, once tiering started, the remote
        tier (the stream's read strategy)."""
        if self._manifest is None:
            return TieredReader(local, None, spec)
        return TieredReader(
            local,
            self._manifest,
            spec,
            strategy=self.strategy(),
            prefetcher=default_prefetcher(),
        )

    def new_reader(self, spec: OffsetSpec, chunk_filter: ChunkFilter | None = None) -> TieredReader:
        assert self._manifest is not None
        return TieredReader(
            self._log,
            self._manifest,
            spec,
            strategy=self.strategy(),
            prefetcher=default_prefetcher(),
            chunk_filter=chunk_filter,
        )


class TieredChunkCursor:
    """Reads through a TieredReader; while the position is held locally (and the
    strategy reads local data) it hands over to a LocalChunkCursor, which can use
    sendfile, and takes over again if local retention frees the segment under it."""

    def __init__(
        self,
        source: StreamChunkSource,
        spec: OffsetSpec,
        want_file: bool,
        chunk_filter: ChunkFilter | None = None,
    ) -> None:
        self._source = source
        self._spec = spec
        self._want_file = want_file
        self._filter = chunk_filter
        self._reader: TieredReader | None = None
        self._local: LocalChunkCursor | None = None
        self._next = -1
        self._ready: deque[TieredChunk] = deque()
        self._served = False
        # the offset asked for: a cursor re-attached before it reached it (handed to the
        # local tier, or back to the reader) starts at the chunk that holds it, never
        # at a tier's end below it (clients skip records inside the first chunk only)
        self._asked = spec.value if spec.kind == "offset" else -1

    @property
    def next_offset(self) -> int:
        if self._local is not None:
            return self._local.next_offset
        if self._ready:
            return self._ready[0].header.chunk_id
        return self._reader.next_offset if self._reader is not None else self._next

    def _read_run(self) -> TieredChunk | None:
        """Reader thread: the next chunk, and while they come from the remote tier,
        more of them (up to ``READ_AHEAD_BYTES``) into ``_ready``, so one thread hop
        serves many small chunks. The prefetcher keeps the GETs ahead of this, so a
        read here rarely waits for the store."""
        reader = self._reader
        assert reader is not None
        first = reader.read_chunk()
        if first is None or first.tier != "remote":
            return first
        if not self._served:  # a seek: its first chunk goes out before any read-ahead
            self._served = True
            return first
        taken = first.header.data_length
        ready = self._ready
        limit = min(
            MAX_READ_AHEAD_BYTES, max(READ_AHEAD_BYTES, default_prefetcher().request_size())
        )
        while taken < limit and len(ready) < READ_AHEAD_CHUNKS:
            chunk = reader.read_chunk()
            if chunk is None:
                break
            ready.append(chunk)
            if chunk.tier != "remote":
                break
            taken += chunk.header.data_length
        return first

    async def _call(self, fn: Callable[[], TieredChunk | None]) -> TieredChunk | None:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(_REMOTE_READS, fn)
        except FragmentExpiredError as exc:
            first = self._source.first_offset()
            if self.next_offset < first:
                raise OffsetOvertakenError(self.next_offset, first) from exc
            raise UnreadableDataError(f"remote data vanished: {exc}", "remote") from exc
        except CorruptChunkError as exc:
            raise UnreadableDataError(str(exc), "local") from exc
        except ReadError as exc:
            raise UnreadableDataError(str(exc), "remote") from exc

    def _go_local_if_held(self) -> None:
        """Hand over to the local cursor when the reader's position is held locally."""
        reader = self._reader
        if reader is None or reader.tier == "remote":
            return
        if self._source.strategy() is not ReadStrategy.NOT_IN_DISK:
            return
        position = reader.next_offset
        if position < self._source._log.segment_refs()[0].first_offset:
            return
        if local_gap_resumes(self._source._log, position) is not None:
            return  # between local segments: the remote tier serves it
        try:
            local = self._source._local.attach(
                OffsetSpec.offset(max(position, self._asked)),
                want_file=self._want_file,
                chunk_filter=self._filter,
            )
        except (SourceClosedError, FileNotFoundError):
            return
        if local.next_offset > position:
            local.close()  # the segment went between the check and the attach
            return
        reader.close()
        self._reader = None
        self._next = position
        self._local = local

    async def read(self) -> DeliverableChunk | None:
        if self._source._notifier.closed:
            raise SourceClosedError("stream closed")
        if self._local is not None:
            try:
                return await self._local.read()
            except (OffsetOvertakenError, FileNotFoundError, CorruptChunkError):
                # Local retention freed the segment, the local log jumps past offsets only
                # the remote tier holds (OffsetGapError), or a local chunk does not
                # validate: the cross-tier reader serves it from the remote tier or raises.
                position = self._local.next_offset
                self._local.close()
                self._local = None
                self._spec = OffsetSpec.offset(max(position, self._asked))
                self._next = position
        if self._reader is None:
            spec = self._spec

            def attach() -> None:
                self._reader = self._source.new_reader(spec, self._filter)
                return None

            await self._call(attach)
            self._go_local_if_held()
            if self._local is not None:
                return await self.read()
        if self._ready:
            chunk: TieredChunk | None = self._ready.popleft()
        else:
            chunk = await self._call(self._read_run)
        if chunk is None:
            return None
        if chunk.tier == "local" and not self._ready:
            self._go_local_if_held()
        assert chunk.raw is not None
        return deliverable_from_raw(chunk.header, chunk.raw)

    async def wait(self, timeout: float | None = None) -> None:
        if self._local is not None:
            await self._local.wait(timeout)
            return
        if self.next_offset <= self._source._log.commit_point().chunk_id:
            return
        await self._source._notifier.wait(timeout)

    def close(self) -> None:
        self._ready.clear()  # drop the views into fetched blocks at once
        if self._reader is not None:
            self._reader.close()
        if self._local is not None:
            self._local.close()
