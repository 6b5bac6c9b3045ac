"""The acceptor path: a replica's log takes its leader's chunks verbatim.

A replica never creates chunks or epochs of its own: it appends the exact bytes the
leader wrote (``accept_chunks``), so segment and index files are byte-identical across
members. That holds because every member starts its segments at the same chunk (the
same roll rule, ``segments.segment_full``, asked before every chunk with the stream's
own segment limits, which every member has) and writes index records for the same
positions. A late joiner starts its first segment where one of the leader's segments
starts (the leader writes a tracking snapshot first after a roll whenever tracking is
not empty), so from there on its files match too.

Other members' logs may disagree with the leader's after a failover; the cluster
decides what is a divergent uncommitted suffix and the log cuts it
(``truncate_after``, crash-safe through ``truncation``'s intent file).

The leader side reads raw chunk ranges for a fetch with ``chunk_span``: a segment path,
a byte range and the chunk ids in it, which the transport sends with ``sendfile``
without touching each chunk in Python.

Every function here runs in the log's writer thread (``chunk_span`` in any thread: it
reads only files and the atomically replaced written point).
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections import OrderedDict
from typing import NamedTuple, Protocol

import numpy as np

from tierlog.formats.chunk import HEADER_SIZE, ChunkHeader, ChunkType, decode_header
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import (
    INDEX_RECORD_DTYPE,
    INDEX_RECORD_SIZE,
    encode_index_record,
    index_record_count,
    index_record_position,
)
from tierlog.log.batching import CommitBatcher
from tierlog.log.commit_point import CommitPoint
from tierlog.log.config import LogConfig
from tierlog.log.epoch_history import EpochHistory
from tierlog.log.errors import (
    AcceptError,
    BadChunkError,
    ChunkGapError,
    ChunkNotLocalError,
    ChunkOverlapError,
    LateJoinError,
    LogClosedError,
    OlderEpochChunkError,
    StaleEpochError,
    SyncFailedError,
    TruncateBelowTieredError,
)
from tierlog.log.segment_files import SegmentChunkInfo, pread_exact, validate_chunk
from tierlog.log.segments import SegmentSet, segment_full
from tierlog.log.tail import NO_CHUNK, LogTail
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.log.truncation import cut_files, remove_intent, write_intent

SPAN_RECORDS = 4096  # index records read per chunk_span call at most
_CURSORS = 64  # remembered "next chunk id -> index record" positions per log


class ChunkSpan(NamedTuple):
    """Whole consecutive chunks of one segment file, for a fetch answer.

    ``length`` bytes from ``position`` of ``segment_path``; chunks ``first_chunk_id``
    .. ``last_chunk_id`` (``chunk_count`` of them); ``next_offset`` follows the last.
    """

    segment_path: str
    position: int
    length: int
    first_chunk_id: int
    last_chunk_id: int
    next_offset: int
    chunk_count: int


class FollowerSink(Protocol):
    """What the acceptor path needs of a writable log (``StreamLog`` is one), in the
    writer thread: the log's own parts, which the acceptor changes through their methods
    and the shared ``LogTail``, never by reaching into the log; ``reload`` re-reads the
    log's state from its files after a cut or a failed write."""

    @property
    def stream_dir(self) -> str: ...
    @property
    def config(self) -> LogConfig: ...
    @property
    def closed(self) -> bool: ...
    @property
    def log_tail(self) -> LogTail: ...
    @property
    def segments(self) -> SegmentSet: ...
    @property
    def commits(self) -> CommitBatcher: ...
    @property
    def history(self) -> EpochHistory: ...
    @property
    def tracking(self) -> TrackingState: ...
    @property
    def tiered_offset(self) -> int | None: ...
    @property
    def span_cursors(self) -> OrderedDict[int, tuple[int, int]]: ...
    def check_open(self) -> None: ...
    def roll(self, first_offset: int) -> None: ...
    def write_snapshot_chunk(self) -> SegmentChunkInfo: ...
    def after_write(self) -> None: ...
    def reload(self) -> None: ...


# --------------------------------------------------------------------- accepting


def accept_chunks(
    log: FollowerSink, data: bytes | memoryview, *, segment_start: bool = False
) -> int:
    """Append whole Osiris chunks verbatim; returns the log's new next offset.

    Each chunk must decode, lie wholly in ``data``, have a valid data CRC, entries and
    tracking content, zero reserved bytes, continue the log exactly (its id is the
    log's next offset), carry an epoch not below the log's last one and a timestamp not
    below the last one (what recovery trusts). An empty log also takes a first chunk
    past its next offset (a late joiner) when it is a tracking snapshot, or when the
    leader says it starts one of its segments (``segment_start``: a segment that does
    not start with a snapshot began while tracking was empty): its segment moves to
    start there. Before each chunk the one roll rule decides whether a new
    segment starts, exactly as on the leader. Tracking chunks and user-chunk trailers
    update tracking as on the leader.

    The chunks are written, not fsynced: call ``sync_to_disk`` before reporting them
    written. Refusals are ``AcceptError`` subclasses; chunks before the refused one
    are written (``error.next_offset`` says how far).
    """
    log.check_open()
    view = memoryview(data).cast("B")
    size = len(view)
    segments = log.segments
    config = log.config
    tail = log.log_tail
    pos = 0
    batch: list[memoryview] = []
    records: list[bytes] = []
    active = segments.active
    batch_size = 0
    next_offset = tail.next_offset
    last_epoch = log.history.tail()[0]
    last_timestamp = tail.last_timestamp
    try:
        while pos < size:
            if size - pos < HEADER_SIZE:
                raise BadChunkError(f"{size - pos} bytes after the last whole chunk", next_offset)
            try:
                header = decode_header(view, pos)
            except FormatError as exc:
                raise BadChunkError(f"chunk header at {pos}: {exc}", next_offset) from exc
            end = pos + header.total_size
            if end > size:
                raise BadChunkError(f"chunk {header.chunk_id} is cut short", next_offset)
            chunk = view[pos:end]
            empty_log = tail.last_chunk_id == NO_CHUNK and not batch
            if header.chunk_id != next_offset:
                if header.chunk_id < next_offset:
                    raise ChunkOverlapError(
                        f"chunk {header.chunk_id} is before the next offset {next_offset}",
                        next_offset,
                    )
                if not empty_log:
                    raise ChunkGapError(
                        f"chunk {header.chunk_id} leaves a gap after {next_offset}", next_offset
                    )
                if header.chunk_type != ChunkType.TRACKING_SNAPSHOT and not (
                    segment_start and pos == 0
                ):
                    raise LateJoinError(
                        f"an empty log at {next_offset} cannot start at chunk "
                        f"{header.chunk_id}: neither a tracking snapshot nor a segment start",
                        next_offset,
                    )
            if header.epoch < last_epoch:
                raise OlderEpochChunkError(
                    f"chunk {header.chunk_id} of epoch {header.epoch} after epoch {last_epoch}",
                    next_offset,
                )
            if header.timestamp < last_timestamp:
                raise BadChunkError(
                    f"chunk {header.chunk_id} timestamp {header.timestamp} goes back",
                    next_offset,
                )
            if bytes(chunk[45:48]) != b"\x00\x00\x00":
                raise BadChunkError(f"chunk {header.chunk_id} reserved bytes", next_offset)
            try:
                validate_chunk(header, chunk)
            except FormatError as exc:
                raise BadChunkError(f"chunk {header.chunk_id}: {exc}", next_offset) from exc
            if header.chunk_id != next_offset:  # a late joiner's first chunk
                segments.restart_empty(header.chunk_id)
                tail.next_offset = next_offset = header.chunk_id
                log.commits.rewind(
                    CommitPoint(NO_CHUNK, next_offset, next_offset, segments.active.size)
                )
                active = segments.active
            if segment_full(
                active.size + batch_size,
                active.num_chunks + len(batch),
                config.max_segment_bytes,
                config.max_segment_chunks,
            ):
                _flush(log, batch, records)
                batch_size = 0
                log.roll(header.chunk_id)
                active = segments.active
            records.append(
                encode_index_record(
                    header.chunk_id,
                    header.timestamp,
                    header.epoch,
                    active.size + batch_size,
                    header.chunk_type,
                )
            )
            batch.append(chunk)
            batch_size += len(chunk)
            next_offset = header.next_offset
            last_epoch = header.epoch
            last_timestamp = header.timestamp
            pos = end
    except AcceptError:
        _flush(log, batch, records)
        raise
    _flush(log, batch, records)
    return tail.next_offset


def _flush(log: FollowerSink, batch: list[memoryview], records: list[bytes]) -> None:
    """Write the pending chunks of the active segment and apply them to the log's state."""
    if not batch:
        return
    segments = log.segments
    active = segments.active
    last = decode_header(batch[-1])
    segments.append_raw(batch, records, last.next_offset)
    history = log.history
    tracking = log.tracking
    first_timestamp = 0
    for chunk in batch:
        header = decode_header(chunk)
        history.add(header.epoch, header.chunk_id)
        if header.chunk_type != ChunkType.USER or header.trailer_length:
            _replay(tracking, header, chunk)
        first_timestamp = first_timestamp or header.timestamp
    log.log_tail.wrote(last.chunk_id, last.next_offset, last.timestamp, last.epoch, first_timestamp)
    log.commits.written = CommitPoint(
        last.chunk_id, last.next_offset, active.ref.first_offset, active.size
    )
    batch.clear()
    records.clear()


def _replay(tracking: TrackingState, header: ChunkHeader, chunk: memoryview) -> None:
    replay_chunk(tracking, header, 0, lambda p, n: chunk[p : p + n])


# --------------------------------------------------------------------- epochs


def start_epoch(log: FollowerSink, epoch: int) -> int:
    """Begin writing in ``epoch`` (a new leader): every following chunk carries it, and
    the first is a tracking snapshot, written now; returns its chunk id. Refuses an
    epoch below the log's highest (``StaleEpochError``)."""
    log.check_open()
    tail = log.log_tail
    if epoch < tail.max_epoch:
        raise StaleEpochError(f"epoch {epoch} is below epoch {tail.max_epoch} in the log")
    tail.epoch = tail.max_epoch = epoch
    info = log.write_snapshot_chunk()
    log.after_write()
    return info.chunk_id


# --------------------------------------------------------------------- truncation


def truncate_after(log: FollowerSink, keep_through: int) -> int:
    """Cut every chunk after chunk id ``keep_through`` (``-1``: every chunk), durably and
    crash-safely; returns the new next offset. Refuses (``TruncateBelowTieredError``) to
    cut offsets the remote tier durably holds (``set_tiered_offset``)."""
    log.check_open()
    if keep_through >= log.log_tail.last_chunk_id:
        return log.log_tail.next_offset
    new_next = _next_offset_after(log, keep_through)
    tiered = log.tiered_offset
    if tiered is not None and new_next < tiered:
        raise TruncateBelowTieredError(
            f"{log.stream_dir}: cutting after chunk {keep_through} would cut offsets from "
            f"{new_next}, below {tiered} which the remote tier holds"
        )
    stream_dir = log.stream_dir
    log.commits.sync_to_disk()  # what stays is durable before anything is cut
    log.segments.close(sync=True)
    write_intent(stream_dir, keep_through)
    cut_files(stream_dir, keep_through)
    remove_intent(stream_dir)
    log.reload()
    return log.log_tail.next_offset


def _next_offset_after(log: FollowerSink, keep_through: int) -> int:
    """The next offset of the log cut after ``keep_through``."""
    refs = log.segments.refs
    if keep_through < refs[0].first_offset:
        return refs[0].first_offset
    firsts = [r.first_offset for r in refs]
    ref = refs[bisect.bisect_right(firsts, keep_through) - 1]
    fd = os.open(ref.index_path, os.O_RDONLY)
    seg = os.open(ref.segment_path, os.O_RDONLY)
    try:
        count = index_record_count(os.fstat(fd).st_size)
        raw = pread_exact(fd, count * INDEX_RECORD_SIZE, index_record_position(0))
        table = np.frombuffer(raw, INDEX_RECORD_DTYPE, count)
        keep = int(np.searchsorted(table["chunk_id"], keep_through, side="right"))
        if keep == 0:
            return ref.first_offset
        header = decode_header(pread_exact(seg, HEADER_SIZE, int(table["position"][keep - 1])))
        return header.next_offset
    finally:
        os.close(seg)
        os.close(fd)


# --------------------------------------------------------------------- failed writes


def recover_after_failure(log: FollowerSink) -> int:
    """Make a log whose write or fdatasync failed writable again, in place: what this
    process believed it wrote is forgotten, recovery reads what the files hold (a torn
    tail is cut, an index that disagrees is rebuilt), the active segment is fsynced, and
    from then on written, committed and durable are that prefix. Returns the new next
    offset. The ``StreamLog`` object stays the same, so everything holding it (the
    member's readers, the replication hub) sees the recovered log, as after a cut.

    Before recovery reads, the files' cached pages are dropped where the kernel allows:
    after a failed writeback a page may stay in the cache, marked clean, with bytes the
    disk never got; recovery must judge the disk, not the cache. Raises (``OSError``,
    ``SyncFailedError``) while the disk still refuses; call again later."""
    if log.closed:
        raise LogClosedError(f"{log.stream_dir} is closed")
    old = log.segments
    if old.sync_failed is None:  # any failed write: nothing more until recovered
        old.sync_failed = OSError("recovering after a failed write")
    with contextlib.suppress(OSError):  # the descriptors are gone either way
        old.close(sync=False)
    _drop_cached_pages(old.active.ref.segment_path, old.active.ref.index_path)
    log.reload()
    segments = log.segments
    try:
        segments.sync_all()
    except OSError as exc:
        segments.sync_failed = exc
        raise SyncFailedError(f"{log.stream_dir}: fsync after recovery failed: {exc!r}") from exc
    return log.log_tail.next_offset


def _drop_cached_pages(*paths: str) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass  # best effort: not every platform or filesystem drops pages
        finally:
            os.close(fd)


# --------------------------------------------------------------------- fetch spans


def chunk_span(log: FollowerSink, from_offset: int, max_bytes: int) -> ChunkSpan | None:
    """Whole chunks from chunk id ``from_offset`` in one segment file, at most
    ``max_bytes`` of them (at least one chunk), among the chunks written so far; None
    when ``from_offset`` is the next offset (nothing to send yet). Any thread."""
    written = log.commits.written
    if from_offset >= written.next_offset:
        if from_offset == written.next_offset:
            return None
        raise ChunkNotLocalError(f"chunk {from_offset} is past the log's end")
    refs = log.segments.refs
    firsts = [r.first_offset for r in refs]
    i = bisect.bisect_right(firsts, from_offset) - 1
    if i < 0:
        raise ChunkNotLocalError(f"chunk {from_offset} is below the local log")
    ref = refs[i]
    cursors = log.span_cursors
    fd = os.open(ref.index_path, os.O_RDONLY)
    try:
        count = index_record_count(os.fstat(fd).st_size)
        cursor = cursors.get(from_offset)
        if cursor is not None and cursor[0] == ref.first_offset:
            n = cursor[1]
        else:
            n = _find_record(fd, count, from_offset)
        if n >= count:
            raise ChunkNotLocalError(f"chunk {from_offset} is not a chunk of the local log")
        want = min(count - n, SPAN_RECORDS, max(1, max_bytes // HEADER_SIZE) + 1)
        raw = pread_exact(fd, want * INDEX_RECORD_SIZE, index_record_position(n))
    finally:
        os.close(fd)
    table = np.frombuffer(raw, INDEX_RECORD_DTYPE, len(raw) // INDEX_RECORD_SIZE)
    ids = table["chunk_id"].astype(np.int64)
    if not len(ids) or int(ids[0]) != from_offset:
        raise ChunkNotLocalError(f"chunk {from_offset} is not a chunk of the local log")
    usable = int(np.searchsorted(ids, written.chunk_id, side="right"))
    positions = table["position"][:usable].astype(np.int64)
    in_written_segment = ref.first_offset == written.segment_first_offset
    if usable < len(ids):
        segment_end = int(table["position"][usable])  # the next chunk starts there
    elif in_written_segment:
        segment_end = written.end_position
    else:
        segment_end = os.path.getsize(ref.segment_path)  # sealed
    ends = np.append(positions[1:], segment_end)
    start = int(positions[0])
    fits = int(np.searchsorted(ends - start, max_bytes, side="right"))
    take = max(1, min(fits, usable))
    end = int(ends[take - 1])
    last_id = int(ids[take - 1])
    if take < len(ids):
        next_offset = int(ids[take])
    else:
        seg = os.open(ref.segment_path, os.O_RDONLY)
        try:
            last_header = decode_header(pread_exact(seg, HEADER_SIZE, int(positions[take - 1])))
        finally:
            os.close(seg)
        next_offset = last_header.next_offset
    cursors[next_offset] = (ref.first_offset, n + take)
    while len(cursors) > _CURSORS:
        cursors.popitem(last=False)
    return ChunkSpan(ref.segment_path, start, end - start, from_offset, last_id, next_offset, take)


def _find_record(fd: int, count: int, chunk_id: int) -> int:
    """The index of the record with ``chunk_id`` (binary search, one pread per probe);
    ``count`` when there is none."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        raw = pread_exact(fd, 8, index_record_position(mid))
        if int.from_bytes(raw, "big") < chunk_id:
            lo = mid + 1
        else:
            hi = mid
    if lo < count and int.from_bytes(pread_exact(fd, 8, index_record_position(lo)), "big") == (
        chunk_id
    ):
        return lo
    return count


__all__ = [
    "AcceptError",
    "ChunkNotLocalError",
    "ChunkSpan",
    "FollowerSink",
    "accept_chunks",
    "chunk_span",
    "recover_after_failure",
    "start_epoch",
    "truncate_after",
]
