"""The writer's segment files: the list of segments, the active one's open files,
rolling to a new segment, deleting the oldest, and reading bytes back by offset.

Only the writer thread mutates a ``SegmentSet``. Readers in other threads look only
at ``refs``, a tuple the writer replaces atomically.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from tierlog.formats.chunk import HEADER_SIZE, ChunkHeader, ChunkType, make_header
from tierlog.formats.crc import crc32
from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_HEADER,
    SEGMENT_HEADER,
    encode_index_record,
)
from tierlog.log.errors import SegmentNotSealedError, SyncFailedError
from tierlog.log.segment_files import (
    ASYNC_CRC_MIN_BYTES,
    ChunkInfo,
    SegmentRef,
    crc32_in_background,
    fsync_dir,
    index_chunks,
    read_chunk_bytes,
    read_segment_into,
    segment_ref,
)

INDEX_RECORD_SIZE = 29


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
        self.sync_failed: OSError | None = None
        active = segments[-1]
        self.seg_fd = os.open(active.ref.segment_path, os.O_RDWR)
        self.idx_fd = os.open(active.ref.index_path, os.O_RDWR)
        os.lseek(self.seg_fd, active.size, os.SEEK_SET)
        os.lseek(self.idx_fd, 0, os.SEEK_END)

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
    ) -> ChunkHeader:
        """Write a chunk at the end of the active segment and its index record."""
        active = self.segments[-1]
        position = active.size
        tail = [data, trailer] if trailer else [data]
        if len(data) >= ASYNC_CRC_MIN_BYTES and crc32 is zlib.crc32:
            # Slow (zlib) CRC: compute it in the helper thread while the data (after a
            # 48-byte gap) goes to the file; the header follows. Readers and recovery never
            # look past the commit. With ISA-L the CRC costs less than the thread hop, so
            # the whole chunk goes out in one pwritev below.
            crc = crc32_in_background(data)
            pwrite_all(self.seg_fd, tail, position + HEADER_SIZE)
            header = make_header(
                chunk_type,
                chunk_id,
                epoch,
                timestamp,
                data,
                num_entries,
                num_records,
                len(trailer),
                data_crc=crc.result(),
            )
            pwrite_all(self.seg_fd, [header.encode()], position)
        else:
            header = make_header(
                chunk_type, chunk_id, epoch, timestamp, data, num_entries, num_records, len(trailer)
            )
            pwrite_all(self.seg_fd, [header.encode(), *tail], position)
        record = encode_index_record(chunk_id, timestamp, epoch, position, chunk_type)
        write_all(self.idx_fd, [record], INDEX_RECORD_SIZE)
        active.size += header.total_size
        active.num_chunks += 1
        active.next_offset = header.next_offset
        return header

    def sync_data(self) -> None:
        """fdatasync the active segment. After a failure the kernel may have dropped the
        dirty pages and a later fsync can succeed without them, so the log refuses all
        further work (``SyncFailedError``, ``sync_failed`` set) until it is closed and
        reopened: recovery then finds what really reached the disk."""
        try:
            os.fdatasync(self.seg_fd)
        except OSError as exc:
            self.sync_failed = exc
            raise SyncFailedError(f"{self.stream_dir}: fdatasync failed: {exc!r}") from exc

    def close(self, sync: bool = True) -> None:
        """Close the files, fsyncing the index first unless a sync already failed."""
        if sync:
            os.fsync(self.idx_fd)
        os.close(self.seg_fd)
        os.close(self.idx_fd)

    def roll(self, first_offset: int, data_pending: bool) -> None:
        """Seal the active segment (fsync its data when ``data_pending`` and its index)
        and start a new empty one at ``first_offset``."""
        if data_pending:
            self.sync_data()
        os.fsync(self.idx_fd)
        ref = segment_ref(self.stream_dir, first_offset)
        create_segment_files(ref)
        fsync_dir(self.stream_dir)
        os.close(self.seg_fd)
        os.close(self.idx_fd)
        self.seg_fd = os.open(ref.segment_path, os.O_RDWR)
        self.idx_fd = os.open(ref.index_path, os.O_RDWR)
        os.lseek(self.seg_fd, 0, os.SEEK_END)
        os.lseek(self.idx_fd, 0, os.SEEK_END)
        self.segments.append(OpenSegment(ref, FILE_HEADER_SIZE, 0, first_offset))
        self.refs = tuple(s.ref for s in self.segments)

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

    def chunks(self, first_offset: int, up_to_chunk_id: int) -> list[ChunkInfo]:
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


def create_segment_files(ref: SegmentRef) -> None:
    """Create a segment's index and segment files with their headers (fsynced)."""
    for path, header in ((ref.index_path, INDEX_HEADER), (ref.segment_path, SEGMENT_HEADER)):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, header)
            os.fsync(fd)
        finally:
            os.close(fd)


def write_all(fd: int, parts: list[bytes | memoryview], total: int) -> None:
    written = os.writev(fd, parts)
    if written == total:
        return
    rest = b"".join(parts)[written:]
    while rest:
        n = os.write(fd, rest)
        rest = rest[n:]


def pwrite_all(fd: int, parts: list[bytes | memoryview], position: int) -> None:
    written = os.pwritev(fd, parts, position)
    total = sum(map(len, parts))
    if written == total:
        return
    rest = memoryview(b"".join(parts))[written:]
    position += written
    while rest:
        n = os.pwrite(fd, rest, position)
        rest = rest[n:]
        position += n
