"""Readers of a stream log: attach at an offset spec, iterate committed chunks and records.

A reader preads the segment files itself, so readers run in any thread while the
writer appends. It sees committed chunks only (the writer's published commit point)
and, by default, user chunks only (tracking chunks are skipped, as consumers expect,
but only once they verifiably are tracking chunks: see ``_verified_tracking``).
Chunks are handed out as one buffer with memoryviews into it (no per-record copies)
plus their file position and size for ``os.sendfile``.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Literal, NamedTuple, Protocol

from tierlog.formats.bloom import ChunkFilter
from tierlog.formats.chunk import (
    HEADER_SIZE,
    SIMPLE_ENTRY_HEADER_SIZE,
    ChunkHeader,
    ChunkType,
    check_crc,
    count_entries,
    decode_header,
    iter_records,
    iter_uniform_records,
    uniform_record_size,
)
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.chunk_checks import (
    index_type_mismatch,
    load_index_or_none,
    next_chunk_id,
    verified_tracking,
)
from tierlog.log.commit_point import CommitPoint
from tierlog.log.damage import LostRange
from tierlog.log.errors import CorruptChunkError, LogClosedError, OffsetGapError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.recovery import recover
from tierlog.log.segment_files import (
    ASYNC_CRC_MIN_BYTES,
    IndexView,
    SegmentRef,
    crc32_in_background,
    pread_exact,
)

_READ_AHEAD_CHUNKS = 2
"""Chunks ``records()`` reads ahead while CRCs are being checked. Two, because the
helper thread can only start a CRC when the reading thread releases the GIL (in its
next pread), so a CRC submitted now runs while the previous chunk is handed out."""


class LogSource(Protocol):
    """What a reader needs from a log: its segments and its commit point."""

    def segment_refs(self) -> tuple[SegmentRef, ...]: ...

    def commit_point(self) -> CommitPoint: ...

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint: ...

    def trusted_from(self) -> int:
        """Chunk ids from here on had their CRC checked by this process (recovery or write)."""
        ...


class LogView:
    """A read-only view of a stream directory: nothing is repaired or written.

    The good prefix found by recovery counts as committed. Used by ``tierlog dump``
    and by tools reading another process's (or RabbitMQ's) stream directory.
    """

    def __init__(self, stream_dir: str) -> None:
        recovered = recover(stream_dir, repair=False)
        self.stream_dir = stream_dir
        self.notes = tuple(recovered.notes)
        self._refs = tuple(s.ref for s in recovered.segments)
        last = recovered.last_chunk
        tail = recovered.segments[-1]
        self._commit = CommitPoint(
            last.chunk_id if last else -1, recovered.next_offset, tail.ref.first_offset, tail.size
        )
        self.tracking = recovered.tracking
        self._trusted = tail.ref.first_offset  # recovery CRC-checked the tail segment

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        return self._refs

    def commit_point(self) -> CommitPoint:
        return self._commit

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        return self._commit

    def trusted_from(self) -> int:
        return self._trusted

    def producer_sequence(self, producer: str | bytes) -> int | None:
        """A producer's last publishing id as a restarted writer would see it, or None."""
        ident = producer.encode("utf-8") if isinstance(producer, str) else producer
        known = self.tracking.sequences.get(ident)
        return known[1] if known else None

    def query_offset(self, consumer: str | bytes) -> int | None:
        """A consumer's stored offset as a restarted writer would see it, or None."""
        ident = consumer.encode("utf-8") if isinstance(consumer, str) else consumer
        return self.tracking.offsets.get(ident)


class ChunkRead:
    """One chunk handed to a consumer.

    ``raw`` holds the whole chunk (header to trailer) when it was loaded; for
    ``os.sendfile`` use ``segment_path``, ``position`` and ``header.total_size``.
    """

    __slots__ = ("header", "position", "raw", "segment_path", "skip_below")

    def __init__(
        self,
        header: ChunkHeader,
        segment_path: str,
        position: int,
        raw: memoryview | None,
        skip_below: int,
    ) -> None:
        self.header = header
        self.segment_path = segment_path
        self.position = position
        self.raw = raw
        self.skip_below = skip_below

    @property
    def size(self) -> int:
        return self.header.total_size

    @property
    def data(self) -> memoryview:
        """The entry data (a view into ``raw``)."""
        if self.raw is None:
            raise ValueError("chunk was read without its data (load=False)")
        start = self.header.data_start
        return self.raw[start : start + self.header.data_length]

    @property
    def trailer(self) -> memoryview:
        if self.raw is None:
            raise ValueError("chunk was read without its data (load=False)")
        return self.raw[self.header.data_start + self.header.data_length :]

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, record) for every record, skipping offsets the reader attached past."""
        fast = self.uniform_records()
        if fast is not None:
            return fast
        return self.records_from(self.header.data_start, self.header.chunk_id)

    def uniform_records(self) -> Iterator[tuple[int, memoryview]] | None:
        """The records as C-level iterators when the chunk is simple entries of one length
        (no Python frame per record); None for any other chunk."""
        header = self.header
        raw = self.raw
        if raw is None or header.num_entries != header.num_records:
            return None
        start = header.data_start
        size = uniform_record_size(raw[start : start + header.data_length], header.num_entries)
        if size is None:
            return None
        skip = min(max(0, self.skip_below - header.chunk_id), header.num_entries)
        start += skip * (SIMPLE_ENTRY_HEADER_SIZE + size)
        return iter_uniform_records(
            raw, start, size, header.num_entries - skip, header.chunk_id + skip
        )

    def records_from(self, position: int, offset: int) -> Iterator[tuple[int, memoryview]]:
        """Records of the entries starting at byte ``position`` of the chunk (at ``offset``):
        the one entry walk of ``formats.chunk``, over this chunk's buffer in place."""
        if self.raw is None:
            raise ValueError("chunk was read without its data (load=False)")
        header = self.header
        raw = self.raw
        start = header.data_start
        end = start + header.data_length
        entries = header.num_entries
        if position != start:
            entries -= count_entries(raw, start, position)
        records = iter_records(offset, raw, entries, position, end, self.corrupt_error)
        if offset >= self.skip_below:
            return records
        skip = self.skip_below
        return itertools.dropwhile(lambda record: record[0] < skip, records)

    def corrupt_error(self, exc: FormatError) -> Exception:
        """The error a damaged chunk raises while its records are walked."""
        return CorruptChunkError(
            f"{self.segment_path}: chunk {self.header.chunk_id} at {self.position}: {exc}"
        )


class _Fetched(NamedTuple):
    """A chunk read from disk whose CRC may still be being computed."""

    chunk: ChunkRead
    ref: SegmentRef
    crc: Future[int] | None


class LogReader:
    """Iterates a log's committed chunks from an offset spec; one reader per thread.

    ``verify_crc``: check each loaded chunk's data CRC unless this process already
    did (recovery checks the whole tail segment on open; the writer computed the CRC
    of everything it wrote), so every chunk is verified once per process and bit rot
    in older sealed segments is never served. ``verify_crc="always"`` checks on every
    read, ``False`` never (clients of the stream protocol check CRCs themselves).
    ``chunk_filter``: user chunks whose bloom filter rules them out are passed over (a
    subscription's ``filter.N`` values; ``formats/bloom.py``).
    """

    def __init__(
        self,
        source: LogSource,
        spec: OffsetSpec | None = None,
        *,
        verify_crc: bool | Literal["always"] = True,
        user_only: bool = True,
        chunk_filter: ChunkFilter | None = None,
    ) -> None:
        self._source = source
        self._verify = verify_crc
        self._user_only = user_only
        self._filter = chunk_filter if user_only else None
        ref, position, chunk_id, skip_below = resolve(source, spec or OffsetSpec.next())
        lost = getattr(source, "lost_range", None)  # a writer's log only (``damage``)
        if isinstance(lost, LostRange) and chunk_id >= lost.first_offset:
            raise lost.error(f"a read at offset {chunk_id} is refused")  # never skipped
        self._ref = ref
        self._fd = os.open(ref.segment_path, os.O_RDONLY)
        self._pos = position
        self._next = chunk_id
        self._skip_below = skip_below
        self._closed = False
        self._ahead: deque[_Fetched] = deque()  # read ahead by records(), not handed out
        self._ahead_error: CorruptChunkError | None = None  # met while reading ahead
        self._index: IndexView | None = None  # of ``_index_ref``, for ``_check_not_tracking``
        self._index_ref: SegmentRef | None = None

    @property
    def next_offset(self) -> int:
        """The chunk id the reader expects next."""
        if self._ahead:
            return self._ahead[0].chunk.header.chunk_id
        return self._next

    @property
    def segment(self) -> SegmentRef:
        if self._ahead:
            return self._ahead[0].ref
        return self._ref

    @property
    def position(self) -> int:
        if self._ahead:
            return self._ahead[0].chunk.position
        return self._pos

    def close(self) -> None:
        if not self._closed:
            if self._fd >= 0:
                os.close(self._fd)
            self._closed = True
            self._ahead.clear()

    def park(self) -> None:
        """Close the segment file until the next read (a reader that waits long between
        reads, like tiering's on a quiet stream, holds no file open meanwhile)."""
        if not self._closed and self._fd >= 0 and not self._ahead:
            os.close(self._fd)
            self._fd = -1

    def _unpark(self) -> bool:
        """Reopen the current segment, or the next one if the current went (local
        retention frees only segments read to the end)."""
        try:
            self._fd = os.open(self._ref.segment_path, os.O_RDONLY)
            return True
        except FileNotFoundError:
            return self._advance_segment()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_chunk(self, load: bool = True) -> ChunkRead | None:
        """The next committed chunk, or None when the reader has caught up.

        With ``load=False`` only the header is read (for ``os.sendfile`` users) and
        the CRC is not checked.
        """
        if self._closed:
            raise LogClosedError("reader is closed")
        if self._ahead:
            return self._settle(self._ahead.popleft())
        if self._ahead_error is not None:
            error, self._ahead_error = self._ahead_error, None
            raise error
        fetched = self._fetch(load, defer_crc=False)
        return None if fetched is None else fetched.chunk

    def _fetch(self, load: bool, defer_crc: bool) -> _Fetched | None:
        """Read the next committed chunk; with ``defer_crc`` a large chunk's CRC is left
        to the helper thread (``_settle`` checks it)."""
        while True:
            commit = self._source.commit_point()
            if self._next > commit.chunk_id:
                return None
            if self._fd < 0 and not self._unpark():
                return None
            head = pread_exact(self._fd, HEADER_SIZE, self._pos)
            if not head:
                if not self._advance_segment():
                    return None
                continue
            try:
                header = decode_header(head)
            except FormatError as exc:
                raise self._corrupt(exc) from exc
            if header.chunk_id != self._next:
                if self._pos == FILE_HEADER_SIZE and header.chunk_id > self._next:
                    raise OffsetGapError(
                        f"{self._ref.segment_path}: the local log jumps from {self._next} to "
                        f"{header.chunk_id}; those offsets are not held locally",
                        self._next,
                        header.chunk_id,
                    )
                raise self._corrupt(f"chunk id {header.chunk_id}, expected {self._next}")
            if header.chunk_id > commit.chunk_id:
                return None
            if header.next_offset > commit.next_offset:
                # a record count (outside the CRC) pointing past the committed end would
                # make the reader look caught up: the rest of the log silently unread
                raise self._corrupt(
                    f"chunk {header.chunk_id} holds {header.num_records} records, past the "
                    f"committed end {commit.next_offset}"
                )
            position = self._pos
            total = header.total_size
            self._pos = position + total
            self._next = header.next_offset
            if self._user_only and header.next_offset <= self._skip_below:
                # wholly below the offset asked for (attached past the commit, which
                # then grew): as in RabbitMQ, the first chunk a consumer gets is the one
                # that holds its offset; clients skip records only inside that chunk
                continue
            if header.chunk_type != ChunkType.USER and (self._user_only or load):
                tracking = self._verified_tracking(header, position)
                if self._user_only:
                    continue
                chunk = ChunkRead(
                    header, self._ref.segment_path, position, tracking, self._skip_below
                )
                return _Fetched(chunk, self._ref, None)
            if self._filter is not None and not self._filter.may_match(
                pread_exact(self._fd, header.bloom_size, position + HEADER_SIZE)
                if header.bloom_size
                else b""
            ):
                continue  # the chunk's bloom rules it out: its data is never read
            if (
                header.num_records == 1
                and header.num_entries == 1
                and header.trailer_length == 0
                and (self._verify == "always" or header.chunk_id < self._source.trusted_from())
            ):
                self._check_not_tracking(header, position)
            raw: memoryview | None = None
            if load:
                sealed = header.chunk_id < self._source.trusted_from()
                peek = HEADER_SIZE if sealed else 0  # the next chunk's header, see below
                data = pread_exact(self._fd, total + peek, position)
                if len(data) < total:
                    raise self._corrupt(f"chunk {header.chunk_id} is truncated", position)
                if sealed:
                    next_id = next_chunk_id(data, total)
                    if next_id is not None and next_id != header.next_offset:
                        raise self._corrupt(
                            f"chunk {header.chunk_id} says {header.num_records} records but the "
                            f"next chunk is {next_id}",
                            position,
                        )
                raw = memoryview(data)[:total]
                if self._verify == "always" or (
                    self._verify and header.chunk_id < self._source.trusted_from()
                ):
                    start = header.data_start
                    body = raw[start : start + header.data_length]
                    if defer_crc and header.data_length >= ASYNC_CRC_MIN_BYTES:
                        future = crc32_in_background(body)
                        chunk = ChunkRead(
                            header, self._ref.segment_path, position, raw, self._skip_below
                        )
                        return _Fetched(chunk, self._ref, future)
                    try:
                        check_crc(header, body)
                    except FormatError as exc:
                        raise self._corrupt(exc, position) from exc
            chunk = ChunkRead(header, self._ref.segment_path, position, raw, self._skip_below)
            return _Fetched(chunk, self._ref, None)

    def _verified_tracking(self, header: ChunkHeader, position: int) -> memoryview:
        """The bytes of a chunk whose header says tracking, once they verifiably are
        (``chunk_checks.verified_tracking``)."""
        try:
            return verified_tracking(self._fd, header, position)
        except FormatError as exc:
            raise self._corrupt(exc, position) from exc

    def _check_not_tracking(self, header: ChunkHeader, position: int) -> None:
        """Refuse a single-record user chunk that the segment's index names a tracking
        chunk (``chunk_checks.index_type_mismatch``)."""
        if self._index_ref != self._ref:
            self._index = load_index_or_none(self._ref.index_path)
            self._index_ref = self._ref
        if self._index is not None:
            problem = index_type_mismatch(self._index, header, position)
            if problem is not None:
                raise self._corrupt(problem, position)

    def _settle(self, fetched: _Fetched) -> ChunkRead:
        """The fetched chunk once its CRC (if computed in the helper thread) matches."""
        chunk = fetched.chunk
        if fetched.crc is not None:
            crc = fetched.crc.result()
            if crc != chunk.header.data_crc:
                raise CorruptChunkError(
                    f"{chunk.segment_path} at {chunk.position}: chunk {chunk.header.chunk_id}: "
                    f"data CRC {crc:#010x} != header {chunk.header.data_crc:#010x}"
                )
        return chunk

    def chunks(self) -> Iterator[ChunkRead]:
        """Committed chunks until the reader has caught up (does not wait)."""
        while (chunk := self.read_chunk()) is not None:
            yield chunk

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, record bytes) of committed user records until caught up (does not wait).

        Chunks of same-length simple entries are iterated by C iterators (no Python
        frame per record); others by the one entry walk of ``formats.chunk``. CRC checks
        of large chunks run in a helper thread one chunk ahead, so they overlap with
        handing out records; a chunk's records are only handed out once its CRC matched.
        """
        return itertools.chain.from_iterable(self._chunk_record_iters())

    def _chunk_record_iters(self) -> Iterator[Iterator[tuple[int, memoryview]]]:
        ahead = self._ahead
        while True:
            if self._closed:
                raise LogClosedError("reader is closed")
            if not ahead:
                if self._ahead_error is not None:
                    error, self._ahead_error = self._ahead_error, None
                    raise error
                first = self._fetch(True, defer_crc=True)
                if first is None:
                    return
                ahead.append(first)
            # keep reading ahead while CRCs run in the helper thread
            while len(ahead) <= _READ_AHEAD_CHUNKS and ahead[-1].crc is not None:
                try:
                    more = self._fetch(True, defer_crc=True)
                except CorruptChunkError as exc:  # raised once the chunks before it are out
                    self._ahead_error = exc
                    break
                if more is None:
                    break
                ahead.append(more)
            yield self._settle(ahead.popleft()).records()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a chunk at or after the reader's position is committed."""
        commit = self._source.wait_for_commit(self._next, timeout)
        return commit.chunk_id >= self._next

    def _advance_segment(self) -> bool:
        for ref in self._source.segment_refs():
            if ref.first_offset <= self._ref.first_offset:
                continue
            try:
                fd = os.open(ref.segment_path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = fd
            self._ref = ref
            self._pos = FILE_HEADER_SIZE
            return True
        return False

    def _corrupt(self, reason: object, position: int | None = None) -> CorruptChunkError:
        pos = self._pos if position is None else position
        return CorruptChunkError(f"{self._ref.segment_path} at {pos}: {reason}")


def resolve(source: LogSource, spec: OffsetSpec) -> tuple[SegmentRef, int, int, int]:
    """Where a reader attaches: (segment, file position, chunk id, skip records below)."""
    refs = source.segment_refs()
    commit = source.commit_point()
    if spec.kind == "first":
        first = refs[0]
        return first, FILE_HEADER_SIZE, first.first_offset, 0
    if spec.kind == "next":
        return _at_next(refs, commit)
    if spec.kind == "last":
        for ref in reversed(refs):
            index = IndexView.load(ref.index_path)
            count = index.limit_to(commit.chunk_id)
            for n in range(count - 1, -1, -1):
                record = index.record(n)
                if record.chunk_type == ChunkType.USER:
                    return ref, record.position, record.chunk_id, 0
        return _at_next(refs, commit)
    if spec.kind == "offset":
        offset = spec.value
        if offset >= commit.next_offset:
            ref, pos, chunk_id, _ = _at_next(refs, commit)
            return ref, pos, chunk_id, offset
        if offset <= refs[0].first_offset:
            return refs[0], FILE_HEADER_SIZE, refs[0].first_offset, offset
        ref = [r for r in refs if r.first_offset <= offset][-1]
        index = IndexView.load(ref.index_path)
        below = index.last_at_or_below(offset, index.limit_to(commit.chunk_id))
        if below is None:
            return ref, FILE_HEADER_SIZE, ref.first_offset, offset
        return ref, below.position, below.chunk_id, offset
    # timestamp: first chunk whose timestamp is >= the spec's
    for ref in refs:
        index = IndexView.load(ref.index_path)
        count = index.limit_to(commit.chunk_id)
        if count and index.record(count - 1).timestamp >= spec.value:
            found = index.first_with_timestamp(spec.value, count)
            assert found is not None
            return ref, found.position, found.chunk_id, 0
    return _at_next(refs, commit)


def _at_next(refs: tuple[SegmentRef, ...], commit: CommitPoint) -> tuple[SegmentRef, int, int, int]:
    for ref in refs:
        if ref.first_offset == commit.segment_first_offset:
            return ref, commit.end_position, commit.next_offset, 0
    last = refs[-1]
    return last, FILE_HEADER_SIZE, max(last.first_offset, commit.next_offset), 0
