"""Segment and index files on disk: listing, scanning, index search, raw chunk reads.

Everything here reads with ``os.pread`` on file descriptors, so any number of
threads may use it concurrently with the single writer.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from tierlog.formats.chunk import (
    HEADER_SIZE,
    RESERVED_POS,
    ChunkHeader,
    ChunkType,
    check_crc,
    check_entries,
    decode_header,
    single_entry_body,
)
from tierlog.formats.crc import crc32
from tierlog.formats.errors import FormatError, TruncatedError
from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_FILE_HEADER,
    INDEX_RECORD_SIZE,
    IndexRecord,
    check_index_header,
    check_segment_header,
    index_file_name,
    iter_index_records,
    segment_file_name,
    unpack_index_field,
)
from tierlog.formats.tracking import decode_delta, decode_snapshot
from tierlog.log.errors import ShortReadError

_FILE_NAME = re.compile(r"^([0-9]{20})\.(segment|index)$")
_READ_BLOCK = 1 << 20


class SegmentRef(NamedTuple):
    """A segment's identity: its first offset (the file name) and its two paths."""

    first_offset: int
    segment_path: str
    index_path: str


class SegmentChunkInfo(NamedTuple):
    """Where a chunk is and what it holds (what tiering needs per chunk).

    ``size`` is the whole chunk: header, bloom filter, data and trailer.
    """

    chunk_id: int
    timestamp: int
    epoch: int
    position: int
    size: int
    num_records: int
    chunk_type: int
    data_crc: int

    @property
    def next_offset(self) -> int:
        return self.chunk_id + self.num_records

    @property
    def end_position(self) -> int:
        return self.position + self.size

    def index_record(self) -> IndexRecord:
        return IndexRecord(
            self.chunk_id, self.timestamp, self.epoch, self.position, self.chunk_type
        )


def chunk_info(header: ChunkHeader, position: int) -> SegmentChunkInfo:
    """The SegmentChunkInfo of a decoded header found at ``position``."""
    return SegmentChunkInfo(
        header.chunk_id,
        header.timestamp,
        header.epoch,
        position,
        header.total_size,
        header.num_records,
        header.chunk_type,
        header.data_crc,
    )


ASYNC_CRC_MIN_BYTES = 64 * 1024
"""Chunk data from this size on is worth a CRC in the helper thread (zlib releases the
GIL), overlapping with the caller's I/O; below it the hand-off costs more than it saves."""

_crc_pool: ThreadPoolExecutor | None = None
_crc_pool_lock = threading.Lock()


def crc32_in_background(data: bytes | memoryview) -> Future[int]:
    """``zlib.crc32(data)`` in the process's CRC helper thread. The thread can only start
    once the caller releases the GIL, so call this right before a blocking syscall."""
    global _crc_pool
    with _crc_pool_lock:
        if _crc_pool is None:
            _crc_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierlog-crc")
        pool = _crc_pool
    return pool.submit(crc32, data)


def segment_ref(stream_dir: str, first_offset: int) -> SegmentRef:
    return SegmentRef(
        first_offset,
        os.path.join(stream_dir, segment_file_name(first_offset)),
        os.path.join(stream_dir, index_file_name(first_offset)),
    )


def list_files(stream_dir: str) -> tuple[list[int], set[int], set[int]]:
    """(sorted first offsets of all segment/index files, offsets with a segment, with an index)."""
    segments: set[int] = set()
    indexes: set[int] = set()
    for name in os.listdir(stream_dir):
        match = _FILE_NAME.match(name)
        if not match:
            continue
        offset = int(match.group(1))
        (segments if match.group(2) == "segment" else indexes).add(offset)
    return sorted(segments | indexes), segments, indexes


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read exactly ``size`` bytes at ``position`` (short only at end of file)."""
    data = os.pread(fd, size, position)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_chunk_bytes(segment_path: str, position: int, size: int) -> bytes:
    """A chunk's raw bytes (header to trailer) with one pread."""
    fd = os.open(segment_path, os.O_RDONLY)
    try:
        data = pread_exact(fd, size, position)
    finally:
        os.close(fd)
    if len(data) != size:
        raise TruncatedError(f"{segment_path}: chunk at {position} is shorter than {size} bytes")
    return data


def read_segment_into(segment_path: str, position: int, buf: memoryview) -> None:
    """Fill ``buf`` with the segment's bytes from ``position`` (one preadv, no copy)."""
    fd = os.open(segment_path, os.O_RDONLY)
    try:
        got = os.preadv(fd, [buf], position)
    finally:
        os.close(fd)
    if got != len(buf):
        raise ShortReadError(
            f"{segment_path}: short read of {got} of {len(buf)} bytes at {position}"
        )


class ScanResult(NamedTuple):
    """The valid prefix of a segment file and why the scan stopped."""

    chunks: list[SegmentChunkInfo]
    valid_end: int
    file_size: int
    header_ok: bool
    damage: str | None


def scan_segment(
    path: str,
    first_offset: int,
    verify_crc: bool = True,
) -> ScanResult:
    """Walk a segment's chunks from the start; stop at the first invalid one.

    A chunk is valid when its header decodes, it lies wholly inside the file, its
    chunk id continues the previous chunk (the first one equals the file name's
    offset) and neither its epoch nor its timestamp goes down (header fields outside
    the CRC are trusted only when continuous with their neighbours). With ``verify_crc``
    its data CRC must match, its entries must exactly fill the data and add up to its
    record count, its tracking content (tracking chunks, user-chunk trailers) must
    decode and its reserved header bytes must be zero. The index file plays no part:
    it only points into the segment and never vetoes a chunk that is trustworthy.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        head = pread_exact(fd, FILE_HEADER_SIZE, 0)
        try:
            check_segment_header(head)
        except FormatError as exc:
            return ScanResult([], 0, size, False, f"segment header: {exc}")
        chunks: list[SegmentChunkInfo] = []
        pos = FILE_HEADER_SIZE
        expected = first_offset
        epoch = 0
        timestamp = -(1 << 63)
        damage: str | None = None
        buf = b""
        buf_pos = 0
        while pos < size:
            if pos + HEADER_SIZE > buf_pos + len(buf):
                buf = pread_exact(fd, _READ_BLOCK, pos)
                buf_pos = pos
            try:
                header = decode_header(buf, pos - buf_pos)
            except FormatError as exc:
                damage = f"chunk header at {pos}: {exc}"
                break
            end = pos + header.total_size
            if end > size:
                damage = f"chunk {header.chunk_id} at {pos} runs past the end of the file"
                break
            if header.chunk_id != expected:
                damage = f"chunk id {header.chunk_id} at {pos}, expected {expected}"
                break
            if header.epoch < epoch:
                damage = f"chunk {header.chunk_id} epoch {header.epoch} below {epoch}"
                break
            if header.timestamp < timestamp:
                damage = f"chunk {header.chunk_id} timestamp {header.timestamp} below {timestamp}"
                break
            info = chunk_info(header, pos)
            if buf[pos - buf_pos + RESERVED_POS : pos - buf_pos + HEADER_SIZE] != bytes(3):
                damage = f"chunk {header.chunk_id} at {pos} has non-zero reserved bytes"
                break
            if verify_crc:
                if end > buf_pos + len(buf):
                    buf = pread_exact(fd, max(_READ_BLOCK, header.total_size), pos)
                    buf_pos = pos
                try:
                    validate_chunk(header, memoryview(buf)[pos - buf_pos : end - buf_pos])
                except FormatError as exc:
                    damage = f"chunk {header.chunk_id} at {pos}: {exc}"
                    break
            chunks.append(info)
            expected = header.next_offset
            epoch = header.epoch
            timestamp = header.timestamp
            pos = end
        return ScanResult(chunks, pos, size, True, damage)
    finally:
        os.close(fd)


def validate_chunk(header: ChunkHeader, chunk: memoryview) -> None:
    """Full validation of one chunk's bytes: CRC, entry structure, tracking content."""
    start = header.data_start
    data = chunk[start : start + header.data_length]
    check_crc(header, data)
    check_entries(data, header.num_entries, header.num_records)
    if header.chunk_type == ChunkType.TRACKING_SNAPSHOT:
        decode_snapshot(single_entry_body(data, header.num_entries))
    elif header.chunk_type == ChunkType.TRACKING_DELTA:
        decode_delta(single_entry_body(data, header.num_entries))
    elif header.trailer_length:
        decode_delta(chunk[start + header.data_length :])


def read_header_at(fd: int, position: int) -> ChunkHeader:
    """Decode the chunk header at ``position`` of an open segment."""
    return decode_header(pread_exact(fd, HEADER_SIZE, position))


def index_chunks(segment_path: str, index_path: str) -> list[SegmentChunkInfo]:
    """All chunks of a segment, from its index plus one header read per chunk."""
    records = list(iter_index_records(read_file(index_path)))
    fd = os.open(segment_path, os.O_RDONLY)
    try:
        return [chunk_info(read_header_at(fd, r.position), r.position) for r in records]
    finally:
        os.close(fd)


def encode_index(chunks: list[SegmentChunkInfo]) -> bytes:
    """A whole index file for ``chunks``."""
    return INDEX_FILE_HEADER + b"".join(c.index_record().encode() for c in chunks)


class IndexView:
    """The whole records of an index file's bytes, for binary and backward searches."""

    __slots__ = ("buf", "count")

    def __init__(self, buf: bytes) -> None:
        check_index_header(buf)
        self.buf = buf
        self.count = (len(buf) - FILE_HEADER_SIZE) // INDEX_RECORD_SIZE
        # all-zero records (never valid) end the usable part
        while self.count and self.record(self.count - 1) == IndexRecord(0, 0, 0, 0, 0):
            self.count -= 1

    @classmethod
    def load(cls, index_path: str) -> IndexView:
        return cls(read_file(index_path))

    def record(self, n: int) -> IndexRecord:
        return unpack_index_field(self.buf, n)

    def __iter__(self) -> Iterator[IndexRecord]:
        for n in range(self.count):
            yield self.record(n)

    def limit_to(self, max_chunk_id: int) -> int:
        """Number of leading records whose chunk id is <= ``max_chunk_id``."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.record(mid).chunk_id <= max_chunk_id:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def last_at_or_below(self, offset: int, count: int) -> IndexRecord | None:
        """The last of the first ``count`` records whose chunk id is <= ``offset``."""
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.record(mid).chunk_id <= offset:
                lo = mid + 1
            else:
                hi = mid
        return self.record(lo - 1) if lo else None

    def first_with_timestamp(self, timestamp: int, count: int) -> IndexRecord | None:
        """The first of the first ``count`` records whose timestamp is >= ``timestamp``."""
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.record(mid).timestamp < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return self.record(lo) if lo < count else None


def fsync_dir(path: str) -> None:
    """Make file creations and deletions in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: str, raw: bytes) -> None:
    """Write ``raw`` to ``path`` atomically and durably: a fsynced temporary file renamed
    over it, then the directory fsynced (a crash leaves the old or the new content)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if os.write(fd, raw) != len(raw):
            raise OSError(f"{tmp}: short write")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
