"""Crash recovery: find (and, when allowed, repair to) the good prefix of a stream log.

The rule is that confirmed data is never cut, renumbered or deleted by recovery:

* A chunk is trustworthy when its CRC is good and its header is continuous with its
  neighbours (chunk id = previous id + previous record count, epoch and timestamp not
  decreasing, lengths within the file); the Osiris CRC covers entry data only.
* An index only points into its segment and never vetoes a trustworthy chunk: when it
  disagrees with the segment, it is rebuilt from the segment. That holds for the active
  segment's last chunk too, which has no right neighbour: its CRC-good header continues
  the log (chunk id, epoch and timestamp not below its predecessor's, the epoch no higher
  than the predecessor's or the index record's), so a flipped bit in its index record
  costs nothing. A chunk type that disagrees with the index is taken from the header
  when the chunk's data cannot be read as the index's type (the index record is what
  flipped); only when it reads as both is the type ambiguous (damage).
* Sealed segments (fsynced when they were rolled) get a structural check through
  their index (records in order, first and last chunk consistent with the file size
  and the last chunk's record count with the next segment's first offset);
  when that fails the segment is scanned chunk by chunk and its index rebuilt.
* Only a torn tail of the *last* segment may be cut: damage there with nothing
  trustworthy after it (a write the crash interrupted). Any other damage (in a sealed
  segment, or followed by trustworthy chunks) raises ``DamagedSegmentError`` naming the
  file and range and modifies nothing: the caller repairs it from a healthy copy (the
  remote tier, ``damage.patch_segment``) or refuses the stream and moves the file aside
  (``damage.quarantine``); a stream directory holding a moved-aside file stays refused.
  Bit rot inside a sealed chunk whose index passes the structural check is caught later
  by readers' CRC checks (a typed error, never served).
* Header fields outside the CRC with no neighbour to corroborate them are checked
  against the index record, which repeats chunk id, timestamp, epoch, position and
  chunk type: the chunk type of every chunk of a scanned segment, the whole record for
  a sealed segment's first and last chunk. A disagreement the log cannot settle is
  damage (repair from the remote tier, else refuse), never a silent choice. A chunk at
  the end of the log that failed validation but is whole, named by its index record
  and CRC-good is no torn write (a header field such as the type or a count is wrong):
  refused, not cut. Chunks in the
  middle of a sealed segment are not read on open; readers check each one they reach
  (a chunk they would skip as tracking must parse as tracking, see ``reader``).
* Osiris itself (``osiris_log``) has no header CRC either and checks less: on recovery
  it walks the last index backwards and keeps the last record whose chunk lies within
  the segment and passes the data CRC (the type and counts are not compared); its
  readers match the magic/version and the expected chunk id, and take the chunk type
  on trust (a reader of user data skips any non-user chunk unread). So a type flip in
  RabbitMQ's own log drops the chunk silently; tierlog refuses it instead.
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

from tierlog.formats.chunk import (
    CHUNK_TYPE_POS,
    HEADER_SIZE,
    ChunkHeader,
    ChunkType,
    check_crc,
    decode_header,
)
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import FILE_HEADER_SIZE, SEGMENT_HEADER, IndexRecord
from tierlog.log.damage import refuse_quarantined
from tierlog.log.errors import DamagedSegmentError, NotAStreamError
from tierlog.log.segment_files import (
    IndexView,
    ScanResult,
    SegmentChunkInfo,
    SegmentRef,
    chunk_info,
    encode_index,
    fsync_dir,
    list_files,
    pread_exact,
    read_header_at,
    scan_segment,
    segment_ref,
    validate_chunk,
)
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.log.truncation import complete_pending_truncation
from tierlog.logs import get_logger

log = get_logger(__name__)


@dataclass
class SegmentState:
    """What recovery knows about one segment of the good prefix."""

    ref: SegmentRef
    size: int
    num_chunks: int
    first_chunk: SegmentChunkInfo | None
    last_chunk: SegmentChunkInfo | None


@dataclass
class RecoveredLog:
    """The good prefix of a stream directory and its tracking state."""

    stream_dir: str
    segments: list[SegmentState]
    tracking: TrackingState
    notes: list[str] = field(default_factory=list)

    @property
    def last_chunk(self) -> SegmentChunkInfo | None:
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
    """Validate a stream directory; with ``repair``, cut a torn tail and rebuild indexes.

    Raises ``DamagedSegmentError`` (changing nothing in the damaged segment) for damage
    that may not be cut, and for a directory holding a moved-aside segment.
    """
    if not os.path.isdir(stream_dir):
        raise NotAStreamError(f"{stream_dir} is not a directory")
    refuse_quarantined(stream_dir)
    if repair:
        complete_pending_truncation(stream_dir)
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
        next_segment = None if is_last else offsets[i + 1]
        state = None if next_segment is None else _check_sealed(ref, next_segment)
        if state is not None:
            states.append(state)
            continue
        scan = scan_segment(ref.segment_path, offset, True)
        if not scan.header_ok:
            if is_last and scan.file_size < FILE_HEADER_SIZE and states:
                # crashed while creating the segment: nothing was ever written to it
                notes.append(f"{ref.segment_path}: torn segment header")
                if repair:
                    _unlink_pair(ref)
                    changed = True
                break
            if not states and scan.file_size < FILE_HEADER_SIZE and is_last:
                pass  # a stream created but never written: rewrite the header below
            elif not states and is_last:
                raise NotAStreamError(f"{ref.segment_path} is not an Osiris segment file")
            else:
                raise _damage(ref, scan.damage or "bad segment header", 0, offset, next_segment)
        _check_chunk_types(ref, scan.chunks, next_segment)
        if scan.damage is None and scan.chunks:
            previous = scan.chunks[-2] if len(scan.chunks) > 1 else None
            if previous is None and states:
                previous = states[-1].last_chunk
            _check_last_chunk(ref, scan.chunks[-1], next_segment, previous)
        if scan.damage:
            expected_id = scan.chunks[-1].next_offset if scan.chunks else offset
            trusted_after = _trusted_chunk_after(ref, scan.valid_end, expected_id)
            if trusted_after is None and _written_whole_chunk(ref, scan.valid_end, expected_id):
                trusted_after = next_segment
                if trusted_after is None:
                    raise _damage(ref, scan.damage, scan.valid_end, expected_id, None)
            if not is_last or trusted_after is not None:
                end = next_segment if trusted_after is None else trusted_after
                raise _damage(ref, scan.damage, scan.valid_end, _scan_next(scan, offset), end)
            notes.append(
                f"{ref.segment_path}: torn tail ({scan.damage}); kept {scan.valid_end} bytes"
            )
        valid_end = scan.valid_end if scan.header_ok else FILE_HEADER_SIZE
        state = SegmentState(
            ref,
            valid_end,
            len(scan.chunks),
            scan.chunks[0] if scan.chunks else None,
            scan.chunks[-1] if scan.chunks else None,
        )
        if repair:
            changed = _repair_segment(ref, scan.header_ok, valid_end, scan.chunks) or changed
        states.append(state)
    if not states:
        raise NotAStreamError(f"{stream_dir} holds no Osiris segment files")
    while len(states) > 1 and states[0].num_chunks == 0:
        # a late joiner's empty first segment, moved by a crash-interrupted restart
        empty = states.pop(0)
        notes.append(f"empty first segment removed: {empty.ref.segment_path}")
        if repair:
            _unlink_pair(empty.ref)
            changed = True
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


def _scan_next(scan: ScanResult, segment_first_offset: int) -> int:
    """The first offset the damage may affect. A header field outside the CRC that breaks
    continuity (timestamp, epoch) implicates both neighbours, so the last chunk that
    passed is included."""
    return scan.chunks[-1].chunk_id if scan.chunks else segment_first_offset


def _damage(
    ref: SegmentRef, why: str, position: int, first: int, end: int | None
) -> DamagedSegmentError:
    where = f"[{first}, {end})" if end is not None else f"[{first}, end of segment)"
    return DamagedSegmentError(
        f"{ref.segment_path}: damage at byte {position} ({why}); offsets {where} are not "
        "trustworthy and may not be cut",
        segment_path=ref.segment_path,
        segment_first_offset=ref.first_offset,
        position=position,
        first_offset=first,
        end_offset=end,
    )


def _check_chunk_types(
    ref: SegmentRef, chunks: list[SegmentChunkInfo], next_segment: int | None
) -> None:
    """The chunk type is outside the CRC and no neighbour corroborates it: where the index
    names another type for the same chunk and the chunk's data also reads as that type,
    neither copy can be trusted over the other. Data that does not read as the index's
    type says the index record flipped: the index is rebuilt from the header."""
    by_position = {r.position: r for r in _index_records(ref) or []}
    for chunk in chunks:
        record = by_position.get(chunk.position)
        if (
            record is not None
            and record.chunk_id == chunk.chunk_id
            and record.chunk_type != chunk.chunk_type
        ):
            if not _reads_as(ref, chunk, record.chunk_type):
                log.warning(
                    "index_record_disagrees",
                    segment=ref.segment_path,
                    chunk_id=chunk.chunk_id,
                    field="chunk_type",
                    kept="chunk header",
                )
                continue
            raise _damage(
                ref,
                f"chunk {chunk.chunk_id} type {chunk.chunk_type} disagrees with its index "
                f"record ({record.chunk_type})",
                chunk.position,
                chunk.chunk_id,
                chunk.next_offset,
            )


def _reads_as(ref: SegmentRef, chunk: SegmentChunkInfo, chunk_type: int) -> bool:
    """Whether the chunk's bytes validate when read as ``chunk_type`` (its data CRC,
    entries and, for tracking types, tracking content)."""
    fd = os.open(ref.segment_path, os.O_RDONLY)
    try:
        raw = bytearray(pread_exact(fd, chunk.size, chunk.position))
    finally:
        os.close(fd)
    if len(raw) != chunk.size:
        return False
    raw[CHUNK_TYPE_POS] = chunk_type & 0xFF
    try:
        validate_chunk(decode_header(raw), memoryview(raw))
    except FormatError:
        return False
    return True


def _check_last_chunk(
    ref: SegmentRef,
    last: SegmentChunkInfo,
    next_segment: int | None,
    previous: SegmentChunkInfo | None,
) -> None:
    """Corroborate the header fields outside the CRC (timestamp, epoch) of a segment's
    last chunk. A sealed segment's has a right neighbour, the next segment's first chunk;
    where that does not corroborate it and its index record disagrees, neither copy can be
    trusted over the other: damage. The log's last chunk has no right neighbour: its
    header continued the log (the scan checked chunk id, epoch and timestamp against its
    predecessor, ``previous``), so it is kept and its index record rebuilt, unless its
    epoch is above both its predecessor's and its index record's (an epoch the log never
    had: the header flipped, and a writer would adopt it)."""
    if next_segment is None:
        record = next((r for r in _index_records(ref) or [] if r.position == last.position), None)
        if record is None or record == last.index_record():
            return
        known_epoch = max(record.epoch, previous.epoch if previous is not None else 0)
        continues = previous is None or (
            last.chunk_id == previous.next_offset
            and last.epoch >= previous.epoch
            and last.timestamp >= previous.timestamp
        )
        if continues and last.epoch <= known_epoch:
            log.warning(
                "index_record_disagrees",
                segment=ref.segment_path,
                chunk_id=last.chunk_id,
                index_record=str(tuple(record)),
                kept="chunk header",
            )
            return
        raise _damage(
            ref,
            f"chunk {last.chunk_id} header disagrees with its index record",
            last.position,
            last.chunk_id,
            last.next_offset,
        )
    if next_segment is not None:
        neighbour = _first_header(segment_ref(os.path.dirname(ref.segment_path), next_segment))
        if (
            neighbour is not None
            and last.next_offset == next_segment == neighbour.chunk_id
            and last.epoch <= neighbour.epoch
            and last.timestamp <= neighbour.timestamp
        ):
            return
    records = _index_records(ref) or []
    record = next((r for r in records if r.position == last.position), None)
    # the type was settled by _check_chunk_types
    if record is not None and record._replace(chunk_type=last.chunk_type) != last.index_record():
        raise _damage(
            ref,
            f"chunk {last.chunk_id} header disagrees with its index record",
            last.position,
            last.chunk_id,
            next_segment if next_segment is not None else last.next_offset,
        )


def _first_header(ref: SegmentRef) -> ChunkHeader | None:
    try:
        fd = os.open(ref.segment_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return read_header_at(fd, FILE_HEADER_SIZE)
    except FormatError:
        return None
    finally:
        os.close(fd)


def _trusted_chunk_after(ref: SegmentRef, damaged_at: int, expected_id: int) -> int | None:
    """The chunk id of a trustworthy chunk at or after the damage at ``damaged_at``, if any.

    The candidates are the position right after the damaged chunk (when its header
    still gives its length) and every position the index names beyond the damage: the
    index may help find data, never hide it. A write interrupted by a crash leaves
    nothing trustworthy behind it; anything else is damage to confirmed data.
    """
    fd = os.open(ref.segment_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        # The damaged chunk itself first: when it validates on its own, only its continuity
        # with the chunk before failed (a header field outside the CRC), which a torn write
        # cannot cause.
        candidates: list[int] = [damaged_at]
        try:
            header = read_header_at(fd, damaged_at)
            candidates.append(damaged_at + header.total_size)
        except FormatError:
            pass
        records = _index_records(ref) or []
        candidates.extend(r.position for r in records if r.position > damaged_at)
        for position in sorted(set(candidates)):
            if position + HEADER_SIZE > size:
                continue
            try:
                header = read_header_at(fd, position)
                if position + header.total_size > size:
                    continue
                validate_chunk(header, memoryview(pread_exact(fd, header.total_size, position)))
            except FormatError:
                continue
            # the questionable range ends after the damaged chunk, or where trust resumes
            if position == damaged_at:
                return max(header.next_offset, expected_id + header.num_records)
            return header.chunk_id
        return None
    finally:
        os.close(fd)


def _written_whole_chunk(ref: SegmentRef, position: int, expected_id: int) -> bool:
    """Whether the chunk at ``position``, which failed validation, is nevertheless a whole
    written chunk: its index record names it (same position and chunk id), it lies wholly
    in the file and its data CRC matches (read with the chunk type its index record names
    when the header's type byte disagrees or is unknown); only a header field outside
    the CRC (chunk type, entry or record count) is then wrong. A write a crash
    interrupted cannot leave that behind, so it is damage to confirmed data and may not
    be cut as a torn tail."""
    record = next((r for r in _index_records(ref) or [] if r.position == position), None)
    if record is None or record.chunk_id != expected_id:
        return False
    fd = os.open(ref.segment_path, os.O_RDONLY)
    try:
        raw = bytearray(pread_exact(fd, HEADER_SIZE, position))
        if len(raw) != HEADER_SIZE:
            return False
        raw[CHUNK_TYPE_POS] = record.chunk_type  # the header's may be unknown
        header = decode_header(raw)
        if header.chunk_id != expected_id:
            return False
        chunk = pread_exact(fd, header.total_size, position)
        if len(chunk) != header.total_size:
            return False
        check_crc(header, chunk[header.data_start : header.data_start + header.data_length])
    except FormatError:
        return False
    finally:
        os.close(fd)
    return True


def _index_records(ref: SegmentRef) -> list[IndexRecord] | None:
    """The existing index records of a segment (None when unreadable) for cross-checks."""
    try:
        return list(IndexView.load(ref.index_path))
    except (OSError, FormatError):
        return None


def _check_sealed(ref: SegmentRef, next_segment: int) -> SegmentState | None:
    """Cheap structural check of a sealed segment through its index; None if it fails.

    The first and last chunk headers must equal their index records (chunk id, timestamp,
    epoch, position and chunk type: the fields outside the data CRC) and the last chunk
    must end the file and continue into the next segment (its record count). Chunks in
    between are not read here (that would be a pread per chunk of every sealed segment
    on every open): readers check each one they reach below ``trusted_from`` (data CRC,
    chunk id continuity, and a chunk skipped as tracking must parse as tracking)."""
    try:
        index = IndexView.load(ref.index_path)
        size = os.path.getsize(ref.segment_path)
    except (OSError, FormatError):
        return None
    if index.count == 0 or len(index.buf) != FILE_HEADER_SIZE + index.count * 29:
        return None
    if not _records_in_order(index, size):
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
    if last.position + last_header.total_size != size or last_info.next_offset != next_segment:
        return None
    return SegmentState(
        ref,
        size,
        index.count,
        first_info,
        last_info,
    )


def _records_in_order(index: IndexView, size: int) -> bool:
    """Every record of the index is ordered and inside the file (in memory, no reads):
    chunk ids and positions strictly increasing, timestamps and epochs not decreasing,
    known chunk types."""
    prev: IndexRecord | None = None
    for record in index:
        if record.chunk_type > ChunkType.TRACKING_SNAPSHOT or record.position >= size:
            return False
        if prev is not None and (
            record.chunk_id <= prev.chunk_id
            or record.position <= prev.position
            or record.timestamp < prev.timestamp
            or record.epoch < prev.epoch
        ):
            return False
        prev = record
    return True


def _repair_segment(
    ref: SegmentRef, header_ok: bool, valid_end: int, chunks: list[SegmentChunkInfo]
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
            header = decode_header(pread_exact(fd, HEADER_SIZE, pos))
            replay_chunk(tracking, header, pos, read)
            pos += header.total_size
    finally:
        os.close(fd)
    return tracking
