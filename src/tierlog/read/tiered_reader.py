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

import bisect
import os
import struct
import threading
import time
from collections.abc import Iterator
from typing import Literal

import numpy as np

from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.chunk import HEADER_SIZE, ChunkHeader, ChunkType, decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import CrcMismatchError, FormatError
from tierlog.formats.fragment import HEADER_SIZE as FRAGMENT_HEADER_SIZE
from tierlog.formats.fragment import FragmentIndex
from tierlog.formats.fragment_v2 import stored_sizes
from tierlog.formats.offload import ENTRY_HEADER_SIZE, decode_entry_header
from tierlog.log.errors import CorruptChunkError, OffsetGapError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import ChunkRead, LogReader, LogSource
from tierlog.log.segment_files import IndexView, SegmentRef, pread_exact
from tierlog.read.errors import (
    FragmentExpiredError,
    NotHeldLocallyError,
    OffsetUnavailableError,
    ReadError,
    RemoteDataCorruptError,
)
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import Prefetcher, RangeStream, Span
from tierlog.read.strategies import (
    ReadStrategy,
    TierView,
    choose_tier,
    default_hot_bytes,
    hot_tail_start,
)
from tierlog.remote.errors import OffsetBeyondEndError, OffsetOvertakenError
from tierlog.remote.manifest_tree import FragmentLocation, ManifestTree
from tierlog.remote.segments import SegmentChunkIndex, entry_runs

_U32 = struct.Struct(">I")
Tier = Literal["local", "remote"]


def check_remote_crc(header: ChunkHeader, data: bytes | memoryview) -> None:
    """Raise CrcMismatchError when a remote chunk's data does not match its header's CRC."""
    actual = crc32(data)
    if actual != header.data_crc:
        raise CrcMismatchError(
            f"chunk {header.chunk_id}: data CRC {actual:#010x} != header {header.data_crc:#010x}"
        )


_default_prefetcher: Prefetcher | None = None
_default_lock = threading.Lock()


def default_prefetcher() -> Prefetcher:
    """The process-wide prefetcher (default settings), made on first use."""
    global _default_prefetcher
    with _default_lock:
        if _default_prefetcher is None:
            _default_prefetcher = Prefetcher()
        return _default_prefetcher


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


def _aligned_spans(key: str, positions: list[int], end: int, step: int) -> Iterator[Span]:
    """``[positions[0], end)`` of ``key`` cut at chunk starts into spans of at most ``step``
    bytes (a chunk larger than ``step`` is a span of its own)."""
    if not positions:
        if end > FRAGMENT_HEADER_SIZE:
            yield key, FRAGMENT_HEADER_SIZE, end
        return
    start = prev = positions[0]
    for at in positions[1:]:
        if at - start > step and prev > start:
            yield key, start, prev
            start = prev
        prev = at
    if end - start > step and prev > start:
        yield key, start, prev
        start = prev
    yield key, start, end


def _index_spans(key: str, index: FragmentIndex, i: int, step: int) -> Iterator[Span]:
    """The spans reading chunks ``i`` on of one fragment or offloaded segment: a fragment's
    stored frames (v1: the chunks) end where its index starts; a segment's chunks come in
    runs of entries, one run per block."""
    positions: list[int] = index.records["position"][i:].astype(np.int64).tolist()
    if not isinstance(index, SegmentChunkIndex):
        yield from _aligned_spans(key, positions, index.trailer.index_start, step)
        return
    # one run of whole entries (entry header + chunk) per block; no block header or padding
    for lo, hi, end in entry_runs(index, i):
        starts = [p - ENTRY_HEADER_SIZE for p in positions[lo - i : hi - i]]
        yield from _aligned_spans(key, starts, end, step)


class _RemoteCursor:
    """Chunks of consecutive fragments of one manifest snapshot, from ``chunk_id`` up to
    (not including) ``until``."""

    def __init__(
        self,
        manifest: ManifestSource,
        prefetcher: Prefetcher,
        tree: ManifestTree,
        chunk_id: int,
        until: int,
        verify_crc: bool,
    ) -> None:
        self._manifest = manifest
        self._tree = tree
        self._until = until
        self._verify = verify_crc
        self._enter(manifest.locate_offset(tree, chunk_id))
        i = bisect.bisect_right(self._ids, chunk_id) - 1
        if i < 0 or self._ids[i] != chunk_id:
            raise RemoteDataCorruptError(f"{self.key}: no chunk starts at {chunk_id}")
        self._i = i
        self._request_bytes = prefetcher.config.request_bytes
        self._prefetcher = prefetcher
        self._spans_stopped_at: int | None = None  # read-ahead stopped before this fragment
        self._stream: RangeStream = prefetcher.open(manifest.store, self._spans(self._loc, i))

    def _enter(self, loc: FragmentLocation) -> None:
        index: FragmentIndex = self._manifest.fragment_index(loc)
        records = index.records
        self._loc = loc
        self.key = loc.key
        self._decoder = self._manifest.frame_decoder(loc, index)  # None: frames are chunks
        self._ids: list[int] = records["chunk_id"].astype(np.int64).tolist()
        self._sizes: list[int] = records["size"].astype(np.int64).tolist()
        self._stored: list[int] = stored_sizes(index).astype(np.int64).tolist()
        self._positions: list[int] = records["position"].astype(np.int64).tolist()
        # an offloaded segment: a 12-byte entry header precedes each chunk in the stream,
        # and chunks are checked against the CRC-32 of their whole bytes from its index
        self._segment = isinstance(index, SegmentChunkIndex)
        self._crcs: list[int] = records["crc"].tolist() if self._segment else []
        self._i = 0

    def _spans(self, first: FragmentLocation, i: int) -> Iterator[Span]:
        """The data regions of the fragments from chunk ``i`` of ``first`` on, cut at chunk
        boundaries into spans of at most one request (so no chunk straddles two requests and
        every chunk is served as a slice of one buffer, without a copy)."""
        step = self._request_bytes
        first_index = self._manifest.fragment_index(first)
        yield from _index_spans(first.key, first_index, i, step)
        loc = first
        while loc.next_offset < self._until:
            loc = self._manifest.locate_offset(self._tree, loc.next_offset)
            try:
                index = self._manifest.fragment_index(loc)  # cached: ``_enter`` reuses it
            except TierlogError:
                # Where its frames (or a segment's entries) end is unknown: stop reading
                # ahead here. The reader loads the index again when it gets there (the error
                # surfaces then, or it was transient) and opens a new stream from there.
                self._spans_stopped_at = loc.entry.first_offset
                return
            yield from _index_spans(loc.key, index, 0, step)

    @property
    def stream(self) -> RangeStream:
        return self._stream

    def next_chunk(self) -> tuple[ChunkHeader, memoryview, str, int] | None:
        """The next chunk, or None at ``until`` / the end of the snapshot."""
        if self._i >= len(self._ids):
            nxt = self._loc.next_offset
            if nxt >= self._until or nxt >= self._tree.next_offset:
                return None
            self._enter(self._manifest.locate_offset(self._tree, nxt))
            if self._spans_stopped_at == self._loc.entry.first_offset:
                self._stream.close()
                self._spans_stopped_at = None
                self._stream = self._prefetcher.open(
                    self._manifest.store, self._spans(self._loc, 0)
                )
        i = self._i
        chunk_id = self._ids[i]
        if chunk_id >= self._until:
            return None
        size = self._sizes[i]
        if self._segment:
            entry = self._stream.read(ENTRY_HEADER_SIZE + size)
            raw = entry[ENTRY_HEADER_SIZE:]
        else:
            raw = self._stream.read(self._stored[i])
        try:
            if self._segment:
                length, entry_id = decode_entry_header(entry)
                if (length, entry_id) != (size, chunk_id):
                    raise RemoteDataCorruptError(
                        f"{self.key}: entry ({length} bytes, id {entry_id}) at "
                        f"{self._positions[i] - ENTRY_HEADER_SIZE}, the index says chunk "
                        f"{chunk_id} of {size} bytes"
                    )
            elif self._decoder is not None:
                raw = memoryview(self._decoder.decode(i, raw))
            header = decode_header(raw)
            if header.chunk_id != chunk_id or header.total_size != size:
                raise RemoteDataCorruptError(
                    f"{self.key}: chunk at {self._positions[i]} is {header.chunk_id} "
                    f"({header.total_size} bytes), the index says {chunk_id} ({size} bytes)"
                )
            if self._verify and self._segment:
                if crc32(raw) != self._crcs[i]:
                    raise CrcMismatchError(f"chunk {chunk_id}: CRC of its bytes does not match")
            elif self._verify:
                start = header.data_start
                check_remote_crc(header, raw[start : start + header.data_length])
        except FormatError as exc:
            raise RemoteDataCorruptError(f"{self.key}: chunk {chunk_id}: {exc}") from exc
        self._i = i + 1
        return header, raw, self.key, self._positions[i]

    def close(self) -> None:
        self._stream.close()


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
        self._hot_bytes = hot_bytes if hot_bytes is not None else default_hot_bytes()
        self._local_cursor: LogReader | None = None
        self._remote_cursor: _RemoteCursor | None = None
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
            return TieredChunk(header, path, position, raw, self._skip_below, tier)

    def chunks(self) -> Iterator[TieredChunk]:
        """Committed chunks until caught up (does not wait)."""
        while (chunk := self.read_chunk()) is not None:
            yield chunk

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, record bytes) of committed user records until caught up (does not wait)."""
        unpack = _U32.unpack_from
        while (chunk := self.read_chunk()) is not None:
            header = chunk.header
            raw = chunk.raw
            assert raw is not None
            pos = header.data_start
            end = pos + header.data_length
            offset = header.chunk_id
            if offset < self._skip_below or header.num_entries != header.num_records:
                yield from _records(chunk)
                continue
            while pos < end:
                (length,) = unpack(raw, pos)
                if length >= 0x80000000:  # a sub-batch after all: the general path
                    rest = ChunkRead(header, chunk.segment_path, chunk.position, raw, 0)
                    yield from _records(rest, pos, offset)
                    offset = header.next_offset
                    break
                pos += 4
                stop = pos + length
                if stop > end:
                    raise _corrupt(chunk, "bad entry length")
                yield offset, raw[pos:stop]
                offset += 1
                pos = stop
            if offset != header.next_offset:
                raise _corrupt(chunk, "bad record count")

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
            self._remote_cursor = _RemoteCursor(
                self._manifest,
                self._prefetcher or default_prefetcher(),
                tree,
                self._next,
                until,
                self._verify,
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
            found = self._local_chunk_containing(n)
            if found is not None:
                return found, n
            if disable:
                raise NotHeldLocallyError(n, local_first)
            return self._remote_chunk_containing(n), n
        if spec.kind == "last":
            found = self._local_last_user(first)
            if found is None and not disable:
                found = self._remote_last_user(local_first)
            return (end if found is None else found), 0
        # timestamp: the first chunk whose timestamp is >= the spec's
        ts = spec.value
        found = self._local_first_at(ts, first)
        if found is not None and (disable or local_first is None or found > local_first):
            return found, 0
        if found is not None and local_first is not None and local_first <= first:
            return found, 0
        if not disable:
            remote = self._remote_first_at(ts)
            if remote is not None:
                return max(remote, first), 0
        return (end if found is None else found), 0

    def _local_chunk_containing(self, n: int) -> int | None:
        if self._local is None:
            return None
        refs = self._local.segment_refs()
        commit = self._local.commit_point()
        if not refs[0].first_offset <= n < commit.next_offset:
            return None
        ref = [r for r in refs if r.first_offset <= n][-1]
        if self._local_gap_at(n) is not None:
            return None  # between local segments: only the remote tier holds it
        try:
            index = IndexView.load(ref.index_path)
        except FileNotFoundError:
            return None
        below = index.last_at_or_below(n, index.limit_to(commit.chunk_id))
        return ref.first_offset if below is None else below.chunk_id

    def _local_last_user(self, first: int) -> int | None:
        if self._local is None:
            return None
        commit = self._local.commit_point()
        for ref in reversed(self._local.segment_refs()):
            try:
                index = IndexView.load(ref.index_path)
            except FileNotFoundError:
                return None
            for n in range(index.limit_to(commit.chunk_id) - 1, -1, -1):
                record = index.record(n)
                if record.chunk_id < first:
                    return None
                if record.chunk_type == ChunkType.USER:
                    return record.chunk_id
        return None

    def _local_first_at(self, ts: int, first: int) -> int | None:
        if self._local is None:
            return None
        commit = self._local.commit_point()
        for ref in self._local.segment_refs():
            try:
                index = IndexView.load(ref.index_path)
            except FileNotFoundError:
                continue
            count = index.limit_to(commit.chunk_id)
            if count and index.record(count - 1).timestamp >= ts:
                found = index.first_with_timestamp(ts, count)
                assert found is not None
                return max(found.chunk_id, first)
        return None

    def _remote_tree(self, offset: int) -> ManifestTree:
        assert self._manifest is not None
        tree = self._manifest.tree()
        return self._manifest.refresh() if offset >= tree.next_offset else tree

    def _remote_chunk_containing(self, n: int) -> int:
        if self._manifest is None:
            raise OffsetUnavailableError(f"offset {n} is not held locally and there is no manifest")
        tree = self._remote_tree(n)
        try:
            loc = self._manifest.locate_offset(tree, n)
        except OffsetBeyondEndError as exc:
            raise OffsetUnavailableError(f"offset {n} is in neither tier") from exc
        index = self._manifest.fragment_index(loc)
        i = index.find_offset(n)
        assert i is not None
        return int(index.records["chunk_id"][i])

    def _remote_last_user(self, local_first: int | None) -> int | None:
        if self._manifest is None:
            return None
        tree = self._manifest.tree()
        top = tree.next_offset if local_first is None else min(tree.next_offset, local_first)
        at = top - 1
        while at >= tree.first_offset and not tree.is_empty:
            loc = self._manifest.locate_offset(tree, at)
            index = self._manifest.fragment_index(loc)
            records = index.records
            users = np.nonzero(
                (records["chunk_type"] == ChunkType.USER) & (records["chunk_id"] <= at)
            )[0]
            if len(users):
                return int(records["chunk_id"][users[-1]])
            at = loc.entry.first_offset - 1
        return None

    def _remote_first_at(self, ts: int) -> int | None:
        assert self._manifest is not None
        tree = self._manifest.tree()
        if tree.is_empty:
            return None
        loc = self._manifest.locate_timestamp(tree, ts)
        if loc is None:
            return None
        index = self._manifest.fragment_index(loc)
        i = index.find_timestamp(ts)
        if i is None:
            return loc.next_offset if loc.next_offset < tree.next_offset else None
        return int(index.records["chunk_id"][i])


def local_gap_resumes(local: LogSource, n: int) -> int | None:
    """Where local data resumes when offset ``n`` falls in a gap between local segments
    (the log was restarted past the remote tail): local segments are a set of ranges,
    and the offsets between them are served by the remote tier or not at all."""
    refs = local.segment_refs()
    i = bisect.bisect_right([r.first_offset for r in refs], n) - 1
    if i < 0 or i + 1 >= len(refs):
        return None
    end = _segment_end(refs[i])
    if end is None or n < end:
        return None
    return refs[i + 1].first_offset


def _segment_end(ref: SegmentRef) -> int | None:
    """The offset after a sealed segment's last chunk (None when it cannot be read)."""
    try:
        index = IndexView.load(ref.index_path)
        if index.count == 0:
            return ref.first_offset
        last = index.record(index.count - 1)
        fd = os.open(ref.segment_path, os.O_RDONLY)
        try:
            header = decode_header(pread_exact(fd, HEADER_SIZE, last.position))
        finally:
            os.close(fd)
    except (OSError, FormatError):
        return None
    return header.next_offset


def _records(
    chunk: ChunkRead, position: int | None = None, offset: int | None = None
) -> Iterator[tuple[int, memoryview]]:
    """The general record walk of ``ChunkRead`` with remote corruption typed as such."""
    try:
        if position is None or offset is None:
            yield from chunk.records()
        else:
            yield from chunk.records_from(position, offset)
    except CorruptChunkError as exc:
        if isinstance(chunk, TieredChunk) and chunk.tier == "remote":
            raise RemoteDataCorruptError(str(exc)) from exc
        raise


def _corrupt(chunk: TieredChunk, reason: str) -> Exception:
    message = f"{chunk.segment_path} at {chunk.position}: chunk {chunk.header.chunk_id}: {reason}"
    if chunk.tier == "remote":
        return RemoteDataCorruptError(message)
    return CorruptChunkError(message)
