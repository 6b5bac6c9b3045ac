"""Crash recovery: find (and, when allowed, repair to) the good prefix of a stream log.

* The last segment is scanned chunk by chunk with CRC checks: a torn or corrupt
  tail is cut off, and its index is rebuilt to match exactly.
* Sealed segments (fsynced when they were rolled) get a structural check through
  their index (first and last chunk consistent with the file size); when that fails
  or the index is missing or short, the segment is scanned like the last one and its
  index rebuilt. Damage in a segment ends the log there: later segments go too, so
  offsets stay contiguous ("exactly the good prefix"). Bit rot inside a sealed chunk
  is caught later by readers' CRC checks (a typed error, never served).
* Index files without a segment are deleted; an empty last segment is deleted when
  an earlier segment exists (as Osiris does).
* Tracking state is rebuilt from the last segment: its snapshot, deltas and the
  trailers of user chunks.

With ``repair=False`` nothing is modified (used by ``tierlog dump`` and read-only
views): the result describes the good prefix only.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from tierlog.formats.chunk import decode_header
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import FILE_HEADER_SIZE, SEGMENT_HEADER, IndexRecord
from tierlog.log.errors import NotAStreamError
from tierlog.log.segment_files import (
    ChunkInfo,
    IndexView,
    SegmentRef,
    chunk_info,
    encode_index,
    fsync_dir,
    list_files,
    pread_exact,
    read_header_at,
    scan_segment,
    segment_ref,
)
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.logs import get_logger

log = get_logger(__name__)


@dataclass
class SegmentState:
    """What recovery knows about one segment of the good prefix."""

    ref: SegmentRef
    size: int
    num_chunks: int
    first_chunk: ChunkInfo | None
    last_chunk: ChunkInfo | None


@dataclass
class RecoveredLog:
    """The good prefix of a stream directory and its tracking state."""

    stream_dir: str
    segments: list[SegmentState]
    tracking: TrackingState
    notes: list[str] = field(default_factory=list)

    @property
    def last_chunk(self) -> ChunkInfo | None:
        for seg in reversed(self.segments):
            if seg.last_chunk is not None:
                return seg.last_chunk
        return None

    @property
    def next_offset(self) -> int:
        tail = self.segments[-1]
        if tail.last_chunk is not None:
            return tail.last_chunk.next_offset
        return tail.ref.first_offset

    @property
    def max_epoch(self) -> int:
        return max((s.last_chunk.epoch for s in self.segments if s.last_chunk), default=0)

    @property
    def last_timestamp(self) -> int:
        last = self.last_chunk
        return last.timestamp if last is not None else 0


def recover(stream_dir: str, repair: bool = True) -> RecoveredLog:
    """Validate a stream directory's tail; with ``repair``, cut it back to the good prefix."""
    if not os.path.isdir(stream_dir):
        raise NotAStreamError(f"{stream_dir} is not a directory")
    _, segments, indexes = list_files(stream_dir)
    if not segments:
        raise NotAStreamError(f"{stream_dir} holds no Osiris segment files")
    notes: list[str] = []
    changed = False
    for offset in sorted(indexes - segments):
        path = segment_ref(stream_dir, offset).index_path
        notes.append(f"index without segment: {path}")
        if repair:
            os.unlink(path)
            changed = True
    offsets = sorted(segments)
    states: list[SegmentState] = []
    for i, offset in enumerate(offsets):
        ref = segment_ref(stream_dir, offset)
        is_last = i == len(offsets) - 1
        state = None if is_last else _check_sealed(ref)
        if state is not None:
            states.append(state)
            continue
        scan = scan_segment(ref.segment_path, offset, True, _index_records(ref))
        if not scan.header_ok and (scan.file_size >= FILE_HEADER_SIZE or not is_last):
            if not states:
                raise NotAStreamError(f"{ref.segment_path} is not an Osiris segment file")
            notes.append(f"{ref.segment_path}: bad segment header")
            _drop_from(offsets[i:], stream_dir, repair, notes)
            changed = changed or repair
            break
        valid_end = scan.valid_end if scan.header_ok else FILE_HEADER_SIZE
        state = SegmentState(
            ref,
            valid_end,
            len(scan.chunks),
            scan.chunks[0] if scan.chunks else None,
            scan.chunks[-1] if scan.chunks else None,
        )
        if scan.damage:
            notes.append(f"{ref.segment_path}: {scan.damage}; kept {valid_end} bytes")
        if repair:
            changed = _repair_segment(ref, scan.header_ok, valid_end, scan.chunks) or changed
        states.append(state)
        if scan.damage and not is_last:
            _drop_from(offsets[i + 1 :], stream_dir, repair, notes)
            changed = changed or repair
            break
    while len(states) > 1 and states[-1].num_chunks == 0:
        empty = states.pop()
        notes.append(f"empty last segment removed: {empty.ref.segment_path}")
        if repair:
            _unlink_pair(empty.ref)
            changed = True
    if repair and changed:
        fsync_dir(stream_dir)
    for note in notes:
        log.warning("recovery_note", stream_dir=stream_dir, note=note)
    tracking = recover_tracking(states[-1])
    return RecoveredLog(stream_dir, states, tracking, notes)


def _index_records(ref: SegmentRef) -> list[IndexRecord] | None:
    """The existing index records of a segment (None when unreadable) for cross-checks."""
    try:
        return list(IndexView.load(ref.index_path))
    except (OSError, FormatError):
        return None


def _check_sealed(ref: SegmentRef) -> SegmentState | None:
    """Cheap structural check of a sealed segment through its index; None if it fails."""
    try:
        index = IndexView.load(ref.index_path)
        size = os.path.getsize(ref.segment_path)
    except (OSError, FormatError):
        return None
    if index.count == 0 or len(index.buf) != FILE_HEADER_SIZE + index.count * 29:
        return None
    first = index.record(0)
    last = index.record(index.count - 1)
    if first.position != FILE_HEADER_SIZE or first.chunk_id != ref.first_offset:
        return None
    fd = os.open(ref.segment_path, os.O_RDONLY)
    try:
        if pread_exact(fd, FILE_HEADER_SIZE, 0) != SEGMENT_HEADER:
            return None
        first_header = read_header_at(fd, first.position)
        last_header = read_header_at(fd, last.position)
    except FormatError:
        return None
    finally:
        os.close(fd)
    first_info = chunk_info(first_header, first.position)
    last_info = chunk_info(last_header, last.position)
    if first_info.index_record() != first or last_info.index_record() != last:
        return None
    if last.position + last_header.total_size != size:
        return None
    return SegmentState(
        ref,
        size,
        index.count,
        first_info,
        last_info,
    )


def _repair_segment(
    ref: SegmentRef, header_ok: bool, valid_end: int, chunks: list[ChunkInfo]
) -> bool:
    """Truncate the segment to its good prefix and make its index match; True if changed."""
    changed = False
    fd = os.open(ref.segment_path, os.O_RDWR)
    try:
        if not header_ok:
            os.ftruncate(fd, 0)
            os.pwrite(fd, SEGMENT_HEADER, 0)
            changed = True
        elif os.fstat(fd).st_size != valid_end:
            os.ftruncate(fd, valid_end)
            changed = True
        if changed:
            os.fsync(fd)
    finally:
        os.close(fd)
    expected = encode_index(chunks)
    try:
        with open(ref.index_path, "rb") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    if current != expected:
        tmp = ref.index_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(expected)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ref.index_path)
        changed = True
    return changed


def _drop_from(offsets: list[int], stream_dir: str, repair: bool, notes: list[str]) -> None:
    for offset in offsets:
        ref = segment_ref(stream_dir, offset)
        notes.append(f"segment after damage removed: {ref.segment_path}")
        if repair:
            _unlink_pair(ref)


def _unlink_pair(ref: SegmentRef) -> None:
    for path in (ref.index_path, ref.segment_path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def recover_tracking(state: SegmentState) -> TrackingState:
    """Rebuild tracking from one segment's chunks (its good prefix), as Osiris does."""
    tracking = TrackingState()
    if state.num_chunks == 0:
        return tracking
    fd = os.open(state.ref.segment_path, os.O_RDONLY)

    def read(position: int, length: int) -> bytes:
        return pread_exact(fd, length, position)

    try:
        pos = FILE_HEADER_SIZE
        while pos < state.size:
            header = decode_header(pread_exact(fd, 48, pos))
            replay_chunk(tracking, header, pos, read)
            pos += header.total_size
    finally:
        os.close(fd)
    return tracking
