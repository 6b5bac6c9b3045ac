"""The writer's segment files: the list of segments, the active one's open files,
rolling to a new segment, deleting the oldest, and reading bytes back by offset.

Only the writer thread mutates a ``SegmentSet``. Readers in other threads look only
at ``refs``, a tuple the writer replaces atomically.

The active segment's two files are open only while the set is among the
``max_open`` most recently written sets of the process (``ACTIVE_FILES``): a node with
thousands of mostly idle streams holds a bounded number of files, and an idle
stream's files reopen on its next write. Only synced files are closed (an fsync through
a descriptor opened later would not report an earlier writeback error).
"""

from __future__ import annotations

import errno
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from tierlog.formats.chunk import HEADER_SIZE, ChunkHeader, ChunkType, make_header
from tierlog.formats.crc import crc32
from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_FILE_HEADER,
    SEGMENT_HEADER,
    encode_index_record,
)
from tierlog.log.errors import SegmentNotSealedError, StreamExistsError, SyncFailedError
from tierlog.log.segment_files import (
    ASYNC_CRC_MIN_BYTES,
    SegmentChunkInfo,
    SegmentRef,
    crc32_in_background,
    fsync_dir,
    index_chunks,
    read_chunk_bytes,
    read_segment_into,
    segment_ref,
)

if TYPE_CHECKING:
    from tierlog.log.recovery import RecoveredLog

DEFAULT_MAX_OPEN = 4096


class ActiveFileCache:
    """The sets whose active files are open, least recently used first, at most
    ``max_open`` of them. A set in use (its lock held by its writer) is never closed."""

    def __init__(self, max_open: int = DEFAULT_MAX_OPEN) -> None:
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: OrderedDict[SegmentSet, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def used(self, owner: SegmentSet) -> None:
        """``owner`` (holding its lock) has its files open and just used them."""
        with self._lock:
            lru = self._open
            if owner in lru:
                lru.move_to_end(owner)
                return
            lru[owner] = None
            skipped = []
            while len(lru) > self.max_open:
                victim, _ = lru.popitem(last=False)
                if victim is owner or not victim._release_files():
                    skipped.append(victim)  # in use right now: keep it open
                    if len(skipped) >= len(lru) + 1:
                        break
            for victim in skipped:
                lru[victim] = None
                lru.move_to_end(victim, last=False)

    def forget(self, owner: SegmentSet) -> None:
        with self._lock:
            self._open.pop(owner, None)


ACTIVE_FILES = ActiveFileCache()


class SegmentInfo(NamedTuple):
    """A segment as listed for tiering and retention."""

    first_offset: int
    segment_path: str
    index_path: str
    size: int
    num_chunks: int
    next_offset: int
    sealed: bool


@dataclass
class OpenSegment:
    """What the writer tracks about one segment of its log."""

    ref: SegmentRef
    size: int
    num_chunks: int
    next_offset: int


class SegmentSet:
    """A stream directory's segments, oldest first; the last one is active (open)."""

    def __init__(self, stream_dir: str, segments: list[OpenSegment]) -> None:
        self.stream_dir = stream_dir
        self.segments = segments
        self.refs: tuple[SegmentRef, ...] = tuple(s.ref for s in segments)
        self._seg_fd = -1
        self._idx_fd = -1
        self._files_lock = threading.Lock()  # held by the writer while it uses the files
        self._dirty = False  # data written since the last fdatasync: never evicted then
        self.sync_failed: OSError | None = None

    @classmethod
    def recovered(cls, recovered: RecoveredLog) -> SegmentSet:
        """The segments recovery found in a stream directory, opened for writing."""
        return cls(
            recovered.stream_dir,
            [
                OpenSegment(
                    s.ref,
                    s.size,
                    s.num_chunks,
                    s.last_chunk.next_offset if s.last_chunk else s.ref.first_offset,
                )
                for s in recovered.segments
            ],
        )

    def __hash__(self) -> int:
        return id(self)

    def _open_files(self) -> None:
        """Open the active segment's files (lock held) unless they are open."""
        if self._seg_fd < 0:
            ref = self.segments[-1].ref
            seg_fd = os.open(ref.segment_path, os.O_RDWR)
            try:
                idx_fd = os.open(ref.index_path, os.O_RDWR)
            except BaseException:
                os.close(seg_fd)
                raise
            os.lseek(idx_fd, 0, os.SEEK_END)
            self._seg_fd, self._idx_fd = seg_fd, idx_fd
        ACTIVE_FILES.used(self)

    def _release_files(self) -> bool:
        """Close the files if nobody uses them now (the cache evicts); False if busy."""
        if not self._files_lock.acquire(blocking=False):
            return False
        try:
            if self._dirty:
                # an fsync through a descriptor opened later would not report a
                # writeback error of these pages: keep it open until it is synced
                return False
            self._close_files()
            return True
        finally:
            self._files_lock.release()

    def _close_files(self) -> None:
        if self._seg_fd >= 0:
            seg_fd, idx_fd = self._seg_fd, self._idx_fd
            self._seg_fd = self._idx_fd = -1
            try:
                os.close(seg_fd)
            finally:
                os.close(idx_fd)

    @property
    def active(self) -> OpenSegment:
        return self.segments[-1]

    def append_chunk(
        self,
        chunk_type: ChunkType,
        chunk_id: int,
        epoch: int,
        timestamp: int,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        trailer: bytes,
        bloom: bytes = b"",
    ) -> ChunkHeader:
        """Write a chunk at the end of the active segment and its index record (``bloom``:
        the chunk's bloom filter, between the header and the data, as osiris writes it)."""
        with self._files_lock:
            self._open_files()
            return self._append_chunk(
                chunk_type,
                chunk_id,
                epoch,
                timestamp,
                data,
                num_entries,
                num_records,
                trailer,
                bloom,
            )

    def _append_chunk(
        self,
        chunk_type: ChunkType,
        chunk_id: int,
        epoch: int,
        timestamp: int,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        trailer: bytes,
        bloom: bytes = b"",
    ) -> ChunkHeader:
        active = self.segments[-1]
        position = active.size
        tail = [data, trailer] if trailer else [data]
        if bloom:
            tail.insert(0, bloom)
        pending = None
        if len(data) >= ASYNC_CRC_MIN_BYTES and crc32 is zlib.crc32:
            # Slow (zlib) CRC: compute it in the helper thread while the data (after a
            # 48-byte gap) goes to the file; the header follows. Readers and recovery never
            # look past the commit. With ISA-L the CRC costs less than the thread hop, so
            # the whole chunk goes out in one pwritev below.
            pending = crc32_in_background(data)
            pwrite_all(self._seg_fd, tail, position + HEADER_SIZE)
        header = make_header(
            chunk_type,
            chunk_id,
            epoch,
            timestamp,
            data,
            num_entries,
            num_records,
            len(trailer),
            len(bloom),
            data_crc=None if pending is None else pending.result(),
        )
        if pending is None:
            pwrite_all(self._seg_fd, [header.encode(), *tail], position)
        else:
            pwrite_all(self._seg_fd, [header.encode()], position)
        record = encode_index_record(chunk_id, timestamp, epoch, position, chunk_type)
        write_all(self._idx_fd, [record])
        self._dirty = True
        active.size += header.total_size
        active.num_chunks += 1
        active.next_offset = header.next_offset
        return header

    def append_raw(self, chunks: list[memoryview], records: list[bytes], next_offset: int) -> None:
        """Write whole chunks verbatim at the end of the active segment and their index
        records (the acceptor path: a replica copies its leader's bytes)."""
        with self._files_lock:
            self._open_files()
            active = self.segments[-1]
            size = sum(map(len, chunks))
            self._dirty = True
            try:
                pwrite_all(self._seg_fd, chunks, active.size)
                write_all(self._idx_fd, records)
            except OSError as exc:
                # part of it may be in the files: nothing more until recovery (reopen)
                self.sync_failed = exc
                raise SyncFailedError(f"{self.stream_dir}: write failed: {exc!r}") from exc
            active.size += size
            active.num_chunks += len(chunks)
            active.next_offset = next_offset

    def restart_empty(self, first_offset: int) -> None:
        """Move the only segment, empty, to start at ``first_offset`` (a late joiner's
        first chunk): the new files are created and made durable before the old ones
        go, and recovery drops an empty segment that has a successor."""
        if len(self.segments) != 1 or self.segments[0].num_chunks:
            raise SegmentNotSealedError("only an empty log's segment can be moved")
        old = self.segments[0]
        with self._files_lock:
            ref = segment_ref(self.stream_dir, first_offset)
            create_segment_files(ref)
            fsync_dir(self.stream_dir)
            self._close_files()
            for path in (old.ref.index_path, old.ref.segment_path):
                os.unlink(path)
            fsync_dir(self.stream_dir)
            self.segments[0] = OpenSegment(ref, FILE_HEADER_SIZE, 0, first_offset)
            self.refs = (ref,)
            self._open_files()

    def sync_data(self) -> None:
        """fdatasync the active segment. After a failure the kernel may have dropped the
        dirty pages and a later fsync can succeed without them, so the log refuses all
        further work (``SyncFailedError``, ``sync_failed`` set) until it is closed and
        reopened: recovery then finds what really reached the disk."""
        with self._files_lock:
            self._open_files()
            try:
                os.fdatasync(self._seg_fd)
            except OSError as exc:
                self.sync_failed = exc
                raise SyncFailedError(f"{self.stream_dir}: fdatasync failed: {exc!r}") from exc
            self._dirty = False

    def sync_all(self) -> None:
        """fsync the active segment file (data and metadata)."""
        with self._files_lock:
            self._open_files()
            os.fsync(self._seg_fd)

    def close(self, sync: bool = True) -> None:
        """Close the files, fsyncing the index first unless a sync already failed."""
        with self._files_lock:
            try:
                if sync:
                    self._open_files()
                    os.fsync(self._idx_fd)
            finally:
                ACTIVE_FILES.forget(self)
                self._close_files()

    def roll(self, first_offset: int, data_pending: bool) -> None:
        """Seal the active segment (fsync its data when ``data_pending`` and its index)
        and start a new empty one at ``first_offset``."""
        with self._files_lock:
            self._open_files()
            if data_pending:
                try:
                    os.fdatasync(self._seg_fd)
                except OSError as exc:
                    self.sync_failed = exc
                    raise SyncFailedError(f"{self.stream_dir}: fdatasync failed: {exc!r}") from exc
                self._dirty = False
            os.fsync(self._idx_fd)
            ref = segment_ref(self.stream_dir, first_offset)
            create_segment_files(ref)
            fsync_dir(self.stream_dir)
            self._close_files()
            self.segments.append(OpenSegment(ref, FILE_HEADER_SIZE, 0, first_offset))
            self.refs = tuple(s.ref for s in self.segments)
            self._open_files()

    def drop_empty_sealed(self, segment: OpenSegment) -> None:
        """Remove ``segment`` (empty, just sealed by a roll) from disk and the list."""
        if len(self.segments) > 1 and self.segments[-2] is segment:
            self.segments.pop(-2)
            for path in (segment.ref.index_path, segment.ref.segment_path):
                os.unlink(path)
            self.refs = tuple(s.ref for s in self.segments)

    def delete_oldest(self, first_offset: int) -> None:
        """Delete the oldest segment; never the active one (the log stays contiguous)."""
        seg = self.find(first_offset)
        if seg is self.segments[-1]:
            raise SegmentNotSealedError(f"segment {first_offset} is the active segment")
        if seg is not self.segments[0]:
            raise SegmentNotSealedError(f"segment {first_offset} is not the oldest segment")
        self.segments.pop(0)
        self.refs = tuple(s.ref for s in self.segments)
        os.unlink(seg.ref.index_path)
        os.unlink(seg.ref.segment_path)
        fsync_dir(self.stream_dir)

    def find(self, first_offset: int) -> OpenSegment:
        for seg in self.segments:
            if seg.ref.first_offset == first_offset:
                return seg
        raise KeyError(f"no segment starts at {first_offset}")

    def infos(self) -> list[SegmentInfo]:
        last = len(self.segments) - 1
        return [
            SegmentInfo(
                s.ref.first_offset,
                s.ref.segment_path,
                s.ref.index_path,
                s.size,
                s.num_chunks,
                s.next_offset,
                i != last,
            )
            for i, s in enumerate(self.segments)
        ]

    def chunks(self, first_offset: int, up_to_chunk_id: int) -> list[SegmentChunkInfo]:
        """The chunk index of a segment, chunks up to ``up_to_chunk_id`` only."""
        ref = self.find(first_offset).ref
        return [
            c
            for c in index_chunks(ref.segment_path, ref.index_path)
            if c.chunk_id <= up_to_chunk_id
        ]

    def read_bytes(self, first_offset: int, position: int, size: int) -> bytes:
        return read_chunk_bytes(self.find(first_offset).ref.segment_path, position, size)

    def read_into(self, first_offset: int, position: int, buf: memoryview) -> None:
        read_segment_into(self.find(first_offset).ref.segment_path, position, buf)


def segment_full(size: int, num_chunks: int, max_bytes: int, max_chunks: int) -> bool:
    """Whether a segment of ``size`` bytes holding ``num_chunks`` chunks is full, so the
    next chunk starts a new one. The one roll rule: the writer and the acceptor path
    both ask it before every chunk, so replicas roll at the same chunk as the leader."""
    return (size >= max_bytes and num_chunks >= 2) or num_chunks >= max_chunks


def create_stream_dir(stream_dir: str) -> None:
    """Make a new stream directory with an empty first segment, durably (the directory
    and its parent fsynced); ``StreamExistsError`` when it already exists."""
    parent = os.path.dirname(os.path.abspath(stream_dir))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(stream_dir)
    except FileExistsError:
        raise StreamExistsError(f"{stream_dir} already exists") from None
    create_segment_files(segment_ref(stream_dir, 0))
    fsync_dir(stream_dir)
    fsync_dir(parent)


def create_segment_files(ref: SegmentRef) -> None:
    """Create a segment's index and segment files with their headers (fsynced)."""
    for path, header in ((ref.index_path, INDEX_FILE_HEADER), (ref.segment_path, SEGMENT_HEADER)):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, header)
            os.fsync(fd)
        finally:
            os.close(fd)


def _iov_max() -> int:
    """The most buffers one ``writev``/``pwritev`` takes (Linux: 1024; more is EINVAL)."""
    try:
        limit = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        limit = -1
    return limit if limit > 0 else 1024


IOV_MAX = _iov_max()
"""Buffers per write call at most: a replica appends thousands of chunks in one go."""
WRITE_CALL_BYTES = 64 << 20
"""Bytes per write call at most (Linux writes at most ~2 GiB per call anyway; a bound
keeps each call, and the bytes at stake in one short write, small)."""


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write every byte of ``parts`` at the file position of ``fd``, in as few
    ``writev`` calls as the iovec and byte limits allow, continuing after short writes."""
    _write_parts(fd, parts, None)


def pwrite_all(fd: int, parts: Sequence[bytes | memoryview], position: int) -> None:
    """Write every byte of ``parts`` at ``position`` of ``fd``, in as few ``pwritev``
    calls as the iovec and byte limits allow, continuing after short writes."""
    _write_parts(fd, parts, position)


def _rest(parts: Sequence[bytes | memoryview], written: int) -> list[bytes | memoryview]:
    """What of ``parts`` is left after the first ``written`` bytes."""
    for i, part in enumerate(parts):
        if written < len(part):
            return [memoryview(part)[written:], *parts[i + 1 :]]
        written -= len(part)
    return []


def _write_parts(
    fd: int,
    parts: Sequence[bytes | memoryview],
    position: int | None,
    max_parts: int | None = None,
    max_bytes: int | None = None,
) -> int:
    """The one vectored write loop: calls of at most ``max_parts`` buffers (IOV_MAX) and
    about ``max_bytes`` bytes (WRITE_CALL_BYTES; one buffer larger than that is sliced);
    a short write continues where the kernel stopped. Returns the bytes written. A call
    that writes nothing raises ``OSError(EIO)`` rather than looping."""
    max_parts = IOV_MAX if max_parts is None else max_parts
    max_bytes = WRITE_CALL_BYTES if max_bytes is None else max_bytes
    count = len(parts)
    total = sum(map(len, parts))
    if count <= max_parts and total <= max_bytes:  # the usual case: one call, all written
        n = os.writev(fd, parts) if position is None else os.pwritev(fd, parts, position)
        if n == total:
            return n
        if n <= 0 and total:
            raise OSError(errno.EIO, "a vectored write wrote nothing")
        # a short write: the loop continues from where it stopped
        rest = _rest(parts, n)
        return n + _write_loop(
            fd, rest, None if position is None else position + n, max_parts, max_bytes
        )
    return _write_loop(fd, parts, position, max_parts, max_bytes)


def _write_loop(
    fd: int,
    parts: Sequence[bytes | memoryview],
    position: int | None,
    max_parts: int,
    max_bytes: int,
) -> int:
    """Calls of at most ``max_parts`` buffers and about ``max_bytes`` bytes until every
    byte of ``parts`` is written; returns the bytes written."""
    count = len(parts)
    i = 0  # the first part not wholly written
    head: bytes | memoryview | None = None  # what is left of part i after a short write
    done = 0
    while i < count:
        batch: list[bytes | memoryview] = []
        size = 0
        j = i
        while j < count and len(batch) < max_parts:
            part = head if (j == i and head is not None) else parts[j]
            n = len(part)
            if not n:
                j += 1
                continue
            if batch and size + n > max_bytes:
                break
            if n > max_bytes:  # alone in its call, sliced
                part = memoryview(part)[:max_bytes]
                n = max_bytes
            batch.append(part)
            size += n
            j += 1
            if size >= max_bytes:
                break
        if not size:  # only empty parts were left
            return done
        if position is None:
            n = os.writev(fd, batch)
        else:
            n = os.pwritev(fd, batch, position)
            position += n
        if n <= 0:
            raise OSError(errno.EIO, "a vectored write wrote nothing")
        done += n
        # step over the parts this call wrote; keep the rest of a part cut short
        while n:
            part = head if head is not None else parts[i]
            if n >= len(part):
                n -= len(part)
                i += 1
                head = None
            else:
                head = memoryview(part)[n:]
                n = 0
        while i < count and head is None and not len(parts[i]):
            i += 1
    return done
