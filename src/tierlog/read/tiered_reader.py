"""The cross-tier reader: one stream, any offset spec, chunks from whichever tier holds them.

A ``TieredReader`` keeps one position (the next chunk id) and one cursor at a time: a
``LogReader`` on the local segment files, or a remote cursor walking fragments of the
committed manifest (binary search of the cached root, branch loads as needed, the fragment
index with one ranged GET, then the chunk bytes through an adaptive ``RangeStream``). Before
each chunk it checks that the position is still available (retention raises
``OffsetOvertakenError``, never skips) and that the cursor is still the right one for the
stream's ``ReadStrategy``; otherwise it re-decides with ``choose_tier``. So reading continues
across fragment boundaries, from the remote tier into the local one, and from a local
segment that local retention freed into the remote tier. Chunk bytes are the bytes the
local log wrote; remote chunks are CRC-checked before they are served.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Literal

from tierlog.errors import ConfigError
from tierlog.formats.bloom import ChunkFilter
from tierlog.formats.chunk import HEADER_SIZE, ChunkHeader, ChunkType
from tierlog.formats.errors import FormatError
from tierlog.log.errors import CorruptChunkError, OffsetGapError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import ChunkRead, LogReader, LogSource
from tierlog.read.chunk_lookup import (
    local_chunk_containing,
    local_first_at,
    local_gap_resumes,
    local_last_user,
    remote_chunk_containing,
    remote_first_at,
    remote_last_user,
)
from tierlog.read.errors import (
    FragmentExpiredError,
    NotHeldLocallyError,
    OffsetUnavailableError,
    ReadError,
    RemoteDataCorruptError,
)
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import Prefetcher, RangeStream
from tierlog.read.remote_cursor import RemoteCursor, default_prefetcher
from tierlog.read.strategies import (
    ReadStrategy,
    TierView,
    choose_tier,
    default_hot_bytes,
    hot_tail_start,
)
from tierlog.remote.errors import OffsetOvertakenError

Tier = Literal["local", "remote"]


class TieredChunk(ChunkRead):
    """A chunk and the tier it came from.

    Local chunks: ``segment_path`` / ``position`` / ``size`` locate it for ``os.sendfile``.
    Remote chunks: ``segment_path`` is the fragment's object key and ``position`` the
    chunk's byte position in the fragment; ``raw`` always holds the whole chunk.
    """

    __slots__ = ("tier",)

    def __init__(
        self,
        header: ChunkHeader,
        segment_path: str,
        position: int,
        raw: memoryview,
        skip_below: int,
        tier: Tier,
    ) -> None:
        super().__init__(header, segment_path, position, raw, skip_below)
        self.tier: Tier = tier

    def corrupt_error(self, exc: FormatError) -> Exception:
        """Remote damage is typed as such (the local copy may still be healthy)."""
        if self.tier == "remote":
            return RemoteDataCorruptError(
                f"{self.segment_path} at {self.position}: chunk {self.header.chunk_id}: {exc}"
            )
        return super().corrupt_error(exc)


class TieredReader:
    """Iterates a stream's committed chunks across the local and the remote tier.

    ``local`` is the local log (None on a node that reads the remote tier only);
    ``manifest`` the committed manifest (None: local only, like ``DISABLE``). Offsets
    below the stream's first available offset raise ``OffsetOvertakenError``.
    """

    def __init__(
        self,
        local: LogSource | None,
        manifest: ManifestSource | None,
        spec: OffsetSpec | None = None,
        *,
        strategy: ReadStrategy = ReadStrategy.NOT_IN_DISK,
        prefetcher: Prefetcher | None = None,
        verify_crc: bool = True,
        user_only: bool = True,
        hot_bytes: int | None = None,
        chunk_filter: ChunkFilter | None = None,
    ) -> None:
        if local is None and manifest is None:
            raise ConfigError("a tiered reader needs a local log, a manifest or both")
        if manifest is None and strategy is not ReadStrategy.DISABLE:
            strategy = ReadStrategy.DISABLE
        self._local = local
        self._manifest = manifest
        self._strategy = strategy
        self._prefetcher = prefetcher
        self._verify = verify_crc
        self._user_only = user_only
        self._filter = chunk_filter if user_only else None
        self.filtered_chunks = 0  # user chunks a filter ruled out (remote: never fetched)
        self._hot_bytes = hot_bytes if hot_bytes is not None else default_hot_bytes()
        self._local_cursor: LogReader | None = None
        self._remote_cursor: RemoteCursor | None = None
        self._closed = False
        self.local_chunks = 0  # chunks read from each tier (tracking chunks included)
        self.remote_chunks = 0
        self._next, self._skip_below = self._resolve(spec or OffsetSpec.next())

    # -- public API -------------------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        """The chunk id the reader expects next."""
        return self._next

    @property
    def skip_below(self) -> int:
        """The offset asked for: records (and whole chunks) below it are not handed out."""
        return self._skip_below

    @property
    def strategy(self) -> ReadStrategy:
        return self._strategy

    @property
    def tier(self) -> Tier | None:
        """The tier of the current cursor (None between cursors)."""
        if self._local_cursor is not None:
            return "local"
        return "remote" if self._remote_cursor is not None else None

    @property
    def range_stream(self) -> RangeStream | None:
        """The current remote cursor's range stream (for statistics)."""
        return self._remote_cursor.stream if self._remote_cursor is not None else None

    def close(self) -> None:
        if not self._closed:
            self._drop_cursors()
            self._closed = True

    def __enter__(self) -> TieredReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_chunk(self) -> TieredChunk | None:
        """The next committed chunk (user chunks only by default), or None when caught up."""
        if self._closed:
            raise ReadError("reader is closed")
        while True:
            got = self._next_any()
            if got is None:
                return None
            header, raw, path, position, tier = got
            if header.chunk_id < self._next:
                raise OffsetUnavailableError(
                    f"{path}: chunk {header.chunk_id} but the reader is at {self._next}"
                )
            self._next = header.next_offset
            if tier == "local":
                self.local_chunks += 1
            else:
                self.remote_chunks += 1
            if self._user_only and header.chunk_type != ChunkType.USER:
                continue
            if header.chunk_type == ChunkType.USER and header.next_offset <= self._skip_below:
                # wholly below the offset asked for (attached at a tier's end, which then
                # grew): the first chunk handed out is the one that holds the offset, as
                # in RabbitMQ; clients skip records only inside that first chunk
                continue
            if (
                self._filter is not None
                and header.chunk_type == ChunkType.USER
                and not self._filter.may_match(raw[HEADER_SIZE : header.data_start])
            ):
                self.filtered_chunks += 1  # a local chunk the bloom rules out
                continue
            return TieredChunk(header, path, position, raw, self._skip_below, tier)

    def chunks(self) -> Iterator[TieredChunk]:
        """Committed chunks until caught up (does not wait)."""
        while (chunk := self.read_chunk()) is not None:
            yield chunk

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, record bytes) of committed user records until caught up (does not wait).

        Each chunk's records come from ``ChunkRead.records`` (C iterators for chunks of
        same-length entries, else the one entry walk of ``formats.chunk``)."""
        return itertools.chain.from_iterable(map(TieredChunk.records, self.chunks()))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a chunk at or after the reader's position is committed."""
        if self._local is not None:
            commit = self._local.wait_for_commit(self._next, timeout)
            return commit.chunk_id >= self._next
        assert self._manifest is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._manifest.refresh().next_offset <= self._next:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return True

    # -- one chunk from whichever tier -------------------------------------------------------
    def _next_any(self) -> tuple[ChunkHeader, memoryview, str, int, Tier] | None:
        for _ in range(1000):
            self._check_available()
            if self._local_cursor is not None:
                if self._still_local():
                    try:
                        chunk = self._local_cursor.read_chunk()
                    except OffsetGapError as gap:
                        # the local log jumps: the view below sends the gap to the remote
                        # tier, or raises when no tier holds it (never a skip)
                        self._drop_cursors()
                        self._check_gap_held(gap)
                        continue
                    except CorruptChunkError:
                        # a local chunk does not validate: its healthy copy in the remote
                        # tier serves that one chunk; without one the error stands
                        self._drop_cursors()
                        if not self._remote_holds(self._next):
                            raise
                        self._open_remote(self._next + 1)
                        continue
                    if chunk is None:
                        return None
                    assert chunk.raw is not None
                    return chunk.header, chunk.raw, chunk.segment_path, chunk.position, "local"
                self._drop_cursors()
            if self._remote_cursor is not None:
                try:
                    got = self._remote_cursor.next_chunk()
                except FragmentExpiredError as exc:
                    self._expired(exc)
                if got is not None:
                    header, raw, key, position = got
                    return header, raw, key, position, "remote"
                # chunks the filter passed over up to the cursor's end are behind us
                self._next = max(self._next, self._remote_cursor.skipped_to)
                self.filtered_chunks += self._remote_cursor.skipped_chunks
                self._drop_cursors()
            choice = choose_tier(self._strategy, self._next, self._view())
            if choice.tier == "end":
                return None
            if choice.tier == "local":
                self._open_local()
            else:
                self._open_remote(choice.remote_until)
        raise ReadError(f"reader at {self._next} cannot settle on a tier")

    def _open_local(self) -> None:
        assert self._local is not None
        try:
            self._local_cursor = LogReader(
                self._local,
                OffsetSpec.offset(self._next),
                verify_crc=self._verify,
                user_only=False,
            )
        except FileNotFoundError:
            self._local_cursor = None  # freed under us: the next round goes remote

    def _open_remote(self, until: int) -> None:
        assert self._manifest is not None
        tree = self._manifest.tree()
        try:
            self._remote_cursor = RemoteCursor(
                self._manifest,
                self._prefetcher or default_prefetcher(),
                tree,
                self._next,
                until,
                self._verify,
                self._filter,
            )
        except FragmentExpiredError as exc:
            self._expired(exc)

    def _expired(self, exc: FragmentExpiredError) -> None:
        """A fragment or branch 404ed: overtaken if retention moved past us, else re-raise."""
        self._drop_cursors()
        assert self._manifest is not None
        self._manifest.forget(exc.key)
        tree = self._manifest.refresh()
        first = self._manifest.first_offset()
        if first is not None and self._next < first:
            raise OffsetOvertakenError(self._next, tree.first_offset) from exc
        raise exc

    def _still_local(self) -> bool:
        """Whether the local cursor may serve the next chunk: its segment still exists
        (retention frees it once tiered) and, with FORCE, the offset is not tiered."""
        assert self._local is not None
        if self._next < self._local.segment_refs()[0].first_offset:
            return False
        if self._strategy is ReadStrategy.FORCE and self._manifest is not None:
            return self._next >= self._manifest.tree().next_offset
        return True

    def _remote_holds(self, offset: int) -> bool:
        if self._strategy is ReadStrategy.DISABLE or self._manifest is None:
            return False
        tree = self._manifest.refresh()
        return tree.first_offset <= offset < tree.next_offset

    def _check_gap_held(self, gap: OffsetGapError) -> None:
        if self._strategy is ReadStrategy.DISABLE or self._manifest is None:
            raise OffsetUnavailableError(
                f"offsets [{gap.missing_from}, {gap.missing_to}) are not held locally and "
                f"remote reads are off: {gap}"
            ) from gap
        tree = self._manifest.refresh()
        if not tree.first_offset <= self._next < tree.next_offset:
            if self._next < tree.first_offset:
                raise OffsetOvertakenError(self._next, tree.first_offset) from gap
            raise OffsetUnavailableError(
                f"offsets [{gap.missing_from}, {gap.missing_to}) are in neither tier "
                f"(remote [{tree.first_offset}, {tree.next_offset})): {gap}"
            ) from gap

    def _local_gap_at(self, n: int) -> int | None:
        assert self._local is not None
        return local_gap_resumes(self._local, n)

    def _check_available(self) -> None:
        first = self._first_available()
        if self._next < first:
            raise OffsetOvertakenError(self._next, first)

    def _drop_cursors(self) -> None:
        if self._local_cursor is not None:
            self._local_cursor.close()
            self._local_cursor = None
        if self._remote_cursor is not None:
            self._remote_cursor.close()
            self._remote_cursor = None

    def _view(self) -> TierView:
        local_first: int | None = None
        local_next = 0
        hot_from = 0
        if self._local is not None:
            local_first = self._local.segment_refs()[0].first_offset
            local_next = self._local.commit_point().next_offset
            resumes = self._local_gap_at(self._next)
            if resumes is not None:
                local_first = resumes  # below it only the remote tier holds data
            if self._strategy is ReadStrategy.NOT_IN_MEM:
                hot_from = hot_tail_start(self._local, self._hot_bytes)
        remote_first = remote_next = 0
        if self._manifest is not None and self._strategy is not ReadStrategy.DISABLE:
            tree = self._manifest.tree()
            if self._next >= tree.next_offset and (local_first is None or self._next < local_first):
                tree = self._manifest.refresh()  # follow growth
            remote_first, remote_next = tree.first_offset, tree.next_offset
        return TierView(local_first, local_next, remote_first, remote_next, hot_from)

    # -- attaching ---------------------------------------------------------------------------
    def _first_available(self) -> int:
        """The stream's first offset: the manifest's, unless nothing was ever tiered."""
        if self._manifest is not None:
            first = self._manifest.first_offset()
            if first is not None:
                return first
        if self._local is not None:
            return self._local.segment_refs()[0].first_offset
        return 0

    def _end_offset(self) -> int:
        if self._local is not None:
            return self._local.commit_point().next_offset
        assert self._manifest is not None
        return self._manifest.refresh().next_offset

    def _resolve(self, spec: OffsetSpec) -> tuple[int, int]:
        """(chunk id to start at, skip records below)."""
        end = self._end_offset()
        if spec.kind == "next":
            return end, 0
        first = self._first_available()
        disable = self._strategy is ReadStrategy.DISABLE
        local_first = self._local.segment_refs()[0].first_offset if self._local else None
        if spec.kind == "first":
            if disable and local_first is not None:
                return max(first, local_first), 0
            return first, 0
        if spec.kind == "offset":
            n = spec.value
            if n < first:
                raise OffsetOvertakenError(n, first)
            if n >= end:
                return end, n
            found = local_chunk_containing(self._local, n)
            if found is not None:
                return found, n
            if disable:
                raise NotHeldLocallyError(n, local_first)
            return remote_chunk_containing(self._manifest, n), n
        if spec.kind == "last":
            found = local_last_user(self._local, first)
            if found is None and not disable:
                found = remote_last_user(self._manifest, local_first)
            return (end if found is None else found), 0
        # timestamp: the first chunk whose timestamp is >= the spec's
        ts = spec.value
        found = local_first_at(self._local, ts, first)
        if found is not None and (disable or local_first is None or found > local_first):
            return found, 0
        if found is not None and local_first is not None and local_first <= first:
            return found, 0
        if not disable:
            assert self._manifest is not None
            remote = remote_first_at(self._manifest, ts)
            if remote is not None:
                return max(remote, first), 0
        return (end if found is None else found), 0
