"""The stream log: one writer appending Osiris chunks, many concurrent readers.

``StreamLog`` is the facade over the parts of a writable log: its segment files
(``segments``), the one append path with deduplication and chunk splitting
(``append``), fsync batching and the commit point (``batching``), and tracking.

Threading: all mutating calls (append, store_offset, sync, maybe_sync, restart_at,
delete_segment, close) must come from one writer thread. Readers in other threads
only pread files and look at two values the writer replaces atomically: the tuple
of segments and the commit point. The commit point only ever covers fsynced chunks.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

from tierlog.formats.chunk import ChunkType, Entry, simple_entry
from tierlog.formats.tracking import encode_delta
from tierlog.log import acceptor, member_epoch
from tierlog.log.append import (
    MAX_U64,
    Appender,
    AppendResult,
    BatchProgress,
    EncodedBatch,
    tracking_id,
)
from tierlog.log.batching import CommitBatcher, CommitListener
from tierlog.log.commit_point import CommitPoint
from tierlog.log.config import LogConfig
from tierlog.log.damage import LostRange, read_lost_range
from tierlog.log.epoch_history import EpochHistory, EpochRangeTuple
from tierlog.log.errors import (
    InvalidAppendError,
    LogClosedError,
    OffsetReuseError,
    StaleEpochError,
    SyncFailedError,
)
from tierlog.log.names import stream_dir_name
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.recovery import RecoveredLog, recover
from tierlog.log.segment_files import (
    SegmentChunkInfo,
    SegmentRef,
    fsync_dir,
)
from tierlog.log.segments import SegmentInfo, SegmentSet, create_stream_dir, segment_full
from tierlog.log.tail import LogTail
from tierlog.log.tracking import TrackingState

__all__ = [
    "AppendResult",
    "BatchProgress",
    "CommitListener",
    "EncodedBatch",
    "SegmentInfo",
    "StreamLog",
]


class StreamLog:
    """An Osiris-format stream log in one directory, opened for writing."""

    def __init__(self, stream_dir: str, config: LogConfig, recovered: RecoveredLog) -> None:
        self._dir = stream_dir
        self._config = config
        max_epoch = recovered.max_epoch
        if config.epoch < max_epoch:
            raise StaleEpochError(
                f"{stream_dir}: writer epoch {config.epoch} is below epoch {max_epoch} on disk"
            )
        self._tail = LogTail.recovered(recovered, config.epoch, max(max_epoch, config.epoch))
        self._segments = SegmentSet.recovered(recovered)
        self._tracking = recovered.tracking
        self._segments.sync_all()
        self._commits = CommitBatcher(config, self._tail_point(), self._segments.sync_data)
        active = self._segments.active
        self._trusted_from = active.ref.first_offset  # recovery CRC-checked the tail segment
        self._closed = False
        self._stream_first: int | None = None
        self._appender = Appender(self, config)
        self.recovery_notes = tuple(recovered.notes)
        self._history = EpochHistory.load(self._segments.refs)
        self._tiered_next: int | None = None
        self._span_cursors: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self.lost_range: LostRange | None = read_lost_range(stream_dir)  # reads, appends refused

    # ----------------------------------------------------------------- lifecycle

    @classmethod
    def create(
        cls,
        data_dir: str,
        vhost: str,
        name: str,
        config: LogConfig | None = None,
        created_ns: int | None = None,
    ) -> StreamLog:
        """Create a new stream directory ``{vhost}_{name}_{created_ns}`` under ``data_dir``."""
        config = config or LogConfig()
        stream_dir = os.path.join(data_dir, stream_dir_name(vhost, name, created_ns))
        create_stream_dir(stream_dir)
        return cls.open(stream_dir, config)

    @classmethod
    def open(
        cls, stream_dir: str, config: LogConfig | None = None, *, adopt_disk_epoch: bool = False
    ) -> StreamLog:
        """Open an existing stream directory for writing, running crash recovery first.

        With ``adopt_disk_epoch`` the writer's epoch is max(configured, largest on disk):
        a single-node server whose log was restarted past the remote tail (with a raised
        epoch) must reopen it; without it a lower configured epoch is a deposed writer.
        """
        config = config or LogConfig()
        recovered = recover(stream_dir, repair=True)
        if adopt_disk_epoch and recovered.max_epoch > config.epoch:
            config = replace(config, epoch=recovered.max_epoch)
        return cls(stream_dir, config, recovered)

    def close(self) -> None:
        """Fsync (committing everything written) and close the files. After a failed
        fdatasync nothing more is synced: recovery at the next open finds what reached
        the disk."""
        if self._closed:
            return
        synced = self._segments.sync_failed is None
        if synced:
            self._commits.sync_to_disk()  # in either sync mode
        self._segments.close(sync=synced)
        self._closed = True
        self._commits.close()

    def __enter__(self) -> StreamLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- properties

    @property
    def stream_dir(self) -> str:
        return self._dir

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def epoch(self) -> int:
        """The epoch new chunks are written with."""
        return self._tail.epoch

    @property
    def max_epoch(self) -> int:
        """The largest epoch in the log (never above the writer's)."""
        return self._tail.max_epoch

    @property
    def next_offset(self) -> int:
        """The offset the next chunk will get (written, not necessarily committed)."""
        return self._tail.next_offset

    @property
    def first_offset(self) -> int:
        """The first offset held locally (the first segment's first chunk)."""
        return self._segments.segments[0].ref.first_offset

    @property
    def last_chunk_id(self) -> int:
        """The last written chunk's id (-1 when the log is empty)."""
        return self._tail.last_chunk_id

    @property
    def committed(self) -> CommitPoint:
        """The current commit point (safe to read from any thread)."""
        return self._commits.committed

    @property
    def committed_chunk_id(self) -> int:
        return self._commits.committed.chunk_id

    @property
    def committed_offset(self) -> int:
        """The last committed offset (-1 when nothing is committed)."""
        return self._commits.committed.next_offset - 1

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def duplicates_dropped(self) -> int:
        """Entries dropped as duplicates (``append``, ``append_batches``) since opened."""
        return self._appender.duplicates_dropped

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        """The current segments (safe to read from any thread)."""
        return self._segments.refs

    def commit_point(self) -> CommitPoint:
        return self._commits.committed

    def trusted_from(self) -> int:
        """Chunk ids from here on were CRC-checked at open or written by this process."""
        return self._trusted_from

    def reader(
        self,
        spec: OffsetSpec | None = None,
        *,
        verify_crc: bool | Literal["always"] = True,
        user_only: bool = True,
    ) -> LogReader:
        """A reader of this log's committed chunks (use it from any one thread)."""
        return LogReader(self, spec, verify_crc=verify_crc, user_only=user_only)

    # ----------------------------------------------------------------- appends

    def append(
        self,
        entries: Sequence[Entry],
        producer: str | bytes | None = None,
        publishing_ids: Sequence[int] | None = None,
    ) -> AppendResult:
        """Append a batch as one chunk (several if it exceeds ``max_chunk_bytes``).

        With ``producer``, each entry has a publishing id; ids not above the
        producer's last one (including earlier ones in this batch) are dropped and
        counted. Entries over ``max_record_bytes`` raise RecordTooLargeError before
        anything is written.
        """
        return self._appender.append(entries, producer, publishing_ids)

    def append_encoded(
        self,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        *,
        producer: str | bytes | None = None,
        first_publishing_id: int | None = None,
        last_publishing_id: int | None = None,
    ) -> AppendResult:
        """Append already-encoded Osiris entry data (a chunk's data section) as one chunk.

        This is what a stream-protocol Publish carries, so the server writes it without
        re-encoding: the entries are walked once (they must exactly fill ``data``, number
        ``num_entries`` and hold ``num_records`` records; simple entries within
        ``max_record_bytes``, sub-batches within ``max_chunk_bytes - 11``) and the CRC is
        computed once. ``data`` must fit one chunk (``max_chunk_bytes``, 65535 entries):
        ``append_batches`` splits.

        Deduplication is the caller's: with ``producer``, the entries are the ones left
        after dropping publishing ids not above ``producer_sequence(producer)``, and
        ``last_publishing_id`` is the largest id among them. The chunk's trailer records
        it as the producer's new sequence (as Osiris does), and tracking follows. The
        log refuses (InvalidAppendError, nothing written) a batch whose lowest id,
        ``first_publishing_id`` (default ``last_publishing_id``), is not above the
        producer's sequence. ``written`` / ``dropped`` of the result are empty (the
        caller has the ids); ``dedup_chunk_id`` is the chunk written.
        """
        return self._appender.append_encoded(
            data, num_entries, num_records, producer, first_publishing_id, last_publishing_id
        )

    def append_batches(
        self,
        batches: Sequence[EncodedBatch],
        producer: str | None = None,
        progress: BatchProgress | None = None,
    ) -> BatchProgress:
        """Append a run of pre-encoded batches (Publish frames) of one producer, or of
        none, as few chunks as fit; duplicates are dropped here (see ``Appender``).

        ``progress`` (returned) counts chunks written, duplicates dropped and batches
        written; pass one in to know how far a run got when this raises.
        """
        progress = progress if progress is not None else BatchProgress()
        self._appender.append_batches(batches, producer, progress)
        return progress

    def append_records(self, records: Sequence[bytes]) -> int:
        """Fast path: append plain records as one chunk; returns its chunk id.

        Same limits as ``append`` (split like it when the batch does not fit a chunk).
        """
        return self._appender.append_records(records)

    def set_append_gate(self, gate: Callable[[], None] | None) -> None:
        """Install a check run before every append (tiering's back-pressure): it raises
        ``BackPressureError`` to refuse the append before anything is written."""
        self._appender.gate = gate

    # The chunk sink of the append path (``append.ChunkSink``), writer thread only.

    def check_open(self) -> None:
        """Before any chunk is written: open, healthy, no offsets lost (no reuse of them)."""
        self._check_usable()
        if self.lost_range is not None:
            raise self.lost_range.error(f"{self._dir}: appends refused")

    def _check_usable(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self._dir} is closed")
        failed = self._segments.sync_failed
        if failed is not None:
            raise SyncFailedError(
                f"{self._dir}: an earlier fdatasync failed ({failed!r}); reopen the "
                "log (recovery) before writing more"
            )

    def producer_last(self, producer_id: bytes) -> int:
        known = self._tracking.sequences.get(producer_id)
        return known[1] if known else -1

    def producer_chunk(self, producer_id: bytes) -> int | None:
        known = self._tracking.sequences.get(producer_id)
        return known[0] if known else None

    def write_user_chunk(
        self,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        producer_id: bytes | None,
        sequence: int,
        bloom: bytes = b"",
    ) -> int:
        trailer = b"" if producer_id is None else encode_delta(sequences={producer_id: sequence})
        info = self._write_chunk(ChunkType.USER, data, num_entries, num_records, trailer, bloom)
        if producer_id is not None:
            self._tracking.sequences[producer_id] = (info.chunk_id, sequence)
        return info.chunk_id

    def after_write(self) -> None:
        self._commits.after_write()

    # ----------------------------------------------------------------- tracking

    def store_offset(self, consumer: str | bytes, offset: int) -> int:
        """Store a consumer's offset (a tracking delta chunk); returns that chunk's id."""
        self.check_open()
        ident = tracking_id(consumer, "consumer name")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_U64:
            raise InvalidAppendError(f"offset {offset!r} is not a u64")
        data = simple_entry(encode_delta(offsets={ident: offset}))
        info = self._write_chunk(ChunkType.TRACKING_DELTA, data, 1, 1, b"")
        self._tracking.offsets[ident] = offset
        self._commits.after_write()
        return info.chunk_id

    def query_offset(self, consumer: str | bytes) -> int | None:
        """A consumer's stored offset, or None."""
        return self._tracking.offsets.get(tracking_id(consumer, "consumer name"))

    def producer_sequence(self, producer: str | bytes) -> int | None:
        """A producer's last written publishing id, or None."""
        known = self._tracking.sequences.get(tracking_id(producer, "producer name"))
        return known[1] if known else None

    def tracking_snapshot(self) -> bytes:
        """All tracking state in Osiris's snapshot encoding (tiering stores / restores it)."""
        return self._tracking.to_bytes()

    def set_stream_first_offset(self, offset: int) -> None:
        """Tell the log where the whole stream (all tiers) starts.

        Osiris drops consumer offsets below the log's first offset from tracking
        snapshots; with a remote tier the stream starts earlier than the local log, so
        the tierer sets this and snapshots keep offsets down to it.
        """
        self._stream_first = offset

    # ----------------------------------------------------------------- commit

    def sync(self) -> CommitPoint:
        """Fsync the active segment now and commit everything written."""
        self._check_usable()
        return self._commits.sync()

    def sync_to_disk(self) -> CommitPoint:
        """Fdatasync the active segment (in either sync mode) and commit everything
        written."""
        self._check_usable()
        return self._commits.sync_to_disk()

    def set_sync_mode(self, mode: str) -> None:
        """Confirm after fdatasync (``fsync``) or once written to the OS (``os``) from
        the next commit on (the stream's settings changed)."""
        self._commits.set_sync_mode(mode)

    @property
    def sync_mode(self) -> str:
        """``fsync`` (commit after fdatasync) or ``os`` (commit once written)."""
        return self._commits.sync_mode

    def fits_active_segment(self, data_bytes: int, chunks: int) -> bool:
        """True when ``chunks`` more chunks holding ``data_bytes`` of entries (plus
        headers and a trailer each) cannot roll the active segment: such appends are a
        ``pwritev`` each, with no fsync of a sealed segment."""
        active = self._segments.active
        config = self._config
        return (
            active.size + data_bytes + chunks * 512 < config.max_segment_bytes
            and active.num_chunks + chunks < config.max_segment_chunks
        )

    def durable_point(self) -> CommitPoint:
        """The last chunk known to be fdatasynced (trails the commit point only in
        ``os`` sync mode)."""
        return self._commits.durable

    def maybe_sync(self, now: float | None = None) -> bool:
        """Drive the ``interval`` cadence: fsync if the interval has passed and data waits.

        ``now`` is a ``time.monotonic()`` value. Returns True when it synced.
        """
        return self._commits.maybe_sync(now)

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call ``listener(commit_point)`` (in the writer thread) whenever the commit advances."""
        self._commits.add_listener(listener)

    def remove_commit_listener(self, listener: CommitListener) -> None:
        self._commits.remove_listener(listener)

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        """Block until the committed next offset exceeds ``next_offset`` (or timeout/close)."""
        return self._commits.wait_for_commit(next_offset, timeout)

    # ----------------------------------------------------------------- chunk writing

    def _write_chunk(
        self,
        chunk_type: ChunkType,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        trailer: bytes,
        bloom: bytes = b"",
    ) -> SegmentChunkInfo:
        segments, config, tail = self._segments, self._config, self._tail
        active = segments.active
        if segment_full(
            active.size, active.num_chunks, config.max_segment_bytes, config.max_segment_chunks
        ):
            self.roll(tail.next_offset)
            if not self._tracking.is_empty():
                self.write_snapshot_chunk()
            active = segments.active
        chunk_id = tail.next_offset
        epoch = tail.epoch
        timestamp = max(time.time_ns() // 1_000_000, tail.last_timestamp)
        position = active.size
        header = segments.append_chunk(
            chunk_type, chunk_id, epoch, timestamp, data, num_entries, num_records, trailer, bloom
        )
        tail.wrote(chunk_id, header.next_offset, timestamp, epoch, timestamp)
        self._history.add(epoch, chunk_id)
        self._commits.written = CommitPoint(
            chunk_id, header.next_offset, active.ref.first_offset, active.size
        )
        return SegmentChunkInfo(
            chunk_id,
            timestamp,
            epoch,
            position,
            header.total_size,
            num_records,
            int(chunk_type),
            header.data_crc,
        )

    def write_snapshot_chunk(self) -> SegmentChunkInfo:
        """Write a tracking snapshot chunk (writer thread; a roll's first chunk, a new
        epoch's first chunk)."""
        floor = self.first_offset
        if self._stream_first is not None:
            floor = min(floor, self._stream_first)
        body = self._tracking.snapshot(
            floor, self._tail.first_timestamp, self._config.max_producers
        )
        return self._write_chunk(ChunkType.TRACKING_SNAPSHOT, simple_entry(body), 1, 1, b"")

    def roll(self, first_offset: int) -> None:
        """Seal the active segment (fsync, commit) and start a new one at ``first_offset``."""
        self._segments.roll(first_offset, self._commits.not_durable)
        self._commits.synced_by_roll()

    # ----------------------------------------------------------------- restart / retention

    def restart_at(
        self, next_offset: int, epoch: int, tracking_snapshot: bytes, last_timestamp: int = 0
    ) -> None:
        """Continue in a new segment at ``next_offset`` with a higher ``epoch``.

        Used when the remote tier is ahead of the local log: offsets below
        ``next_offset`` are never handed out again, and tracking is replaced by
        ``tracking_snapshot`` (Osiris snapshot encoding). The new segment starts with
        a snapshot chunk carrying the new epoch, fsynced before this returns.
        """
        self.check_open()
        if next_offset < self._tail.next_offset:
            raise OffsetReuseError(
                f"restart at {next_offset} would reuse offsets below {self._tail.next_offset}"
            )
        if epoch <= self._tail.max_epoch:
            raise StaleEpochError(f"restart epoch {epoch} must exceed {self._tail.max_epoch}")
        tracking = TrackingState.from_bytes(tracking_snapshot)
        active = self._segments.active
        empty_active = active.num_chunks == 0
        if empty_active and active.ref.first_offset == next_offset:
            pass  # the empty active segment already starts there
        else:
            self.roll(next_offset)
        if empty_active:
            self._segments.drop_empty_sealed(active)
        self._tail.next_offset = next_offset
        self._tail.epoch = epoch
        self._tail.max_epoch = epoch
        # timestamps never go back across the restart: the remote tail may be newer
        self._tail.last_timestamp = max(self._tail.last_timestamp, last_timestamp)
        self._tracking = tracking
        self.write_snapshot_chunk()
        fsync_dir(self._dir)
        self.sync_to_disk()

    def list_segments(self) -> list[SegmentInfo]:
        """All local segments, oldest first; the last one is active (not sealed)."""
        return self._segments.infos()

    def segment_chunks(self, first_offset: int) -> list[SegmentChunkInfo]:
        """The chunk index of a segment (committed chunks only for the active one)."""
        return self._segments.chunks(first_offset, self._commits.committed.chunk_id)

    def read_chunk_bytes(self, first_offset: int, position: int, size: int) -> bytes:
        """A chunk's raw bytes from segment ``first_offset`` (os.pread)."""
        return self._segments.read_bytes(first_offset, position, size)

    def read_segment_into(self, first_offset: int, position: int, buf: memoryview) -> None:
        """Fill ``buf`` with bytes of segment ``first_offset`` from ``position`` (one
        os.preadv straight into the caller's buffer; ShortReadError on a short read).

        This is how the tierer reads chunk ranges: through the log, never by path.
        """
        self._segments.read_into(first_offset, position, buf)

    def delete_segment(self, first_offset: int) -> None:
        """Delete a sealed segment (local retention decides which; never the active one).

        Only the oldest segment may go, so the local log stays one contiguous range.
        """
        self._check_usable()
        self._segments.delete_oldest(first_offset)

    # ----------------------------------------------------------------- replication
    # The acceptor path (``acceptor``): what a cluster member needs from its log.

    @classmethod
    def create_follower(
        cls, stream_dir: str, config: LogConfig | None = None, first_chunk: bytes | None = None
    ) -> StreamLog:
        """Create an empty replica log in ``stream_dir`` (the stream's incarnation
        directory, the same name on every member). With ``first_chunk`` (a leader's
        tracking-snapshot chunk) the log starts at its offset; without, the first
        accepted chunk decides (offset 0, or a snapshot past it for a late joiner)."""
        create_stream_dir(stream_dir)
        log = cls.open(stream_dir, config, adopt_disk_epoch=True)
        if first_chunk is not None:
            try:
                log.accept_chunks(first_chunk)
                log.sync_to_disk()
            except BaseException:
                log.close()
                raise
        return log

    # The acceptor's follower sink (``acceptor.FollowerSink``), writer thread only: the
    # log's own parts, which the acceptor changes through their methods and ``tail``.

    @property
    def log_tail(self) -> LogTail:
        return self._tail

    @property
    def segments(self) -> SegmentSet:
        return self._segments

    @property
    def commits(self) -> CommitBatcher:
        return self._commits

    @property
    def history(self) -> EpochHistory:
        return self._history

    @property
    def tracking(self) -> TrackingState:
        return self._tracking

    @property
    def tiered_offset(self) -> int | None:
        """What ``set_tiered_offset`` last said (None before)."""
        return self._tiered_next

    @property
    def span_cursors(self) -> OrderedDict[int, tuple[int, int]]:
        """``chunk_span``'s remembered positions (next chunk id -> index record)."""
        return self._span_cursors

    def reload(self) -> None:
        """Re-read the log's state from its files (recovery of the last segment) after a
        cut or a failed write; the writer's epoch stays."""
        recovered = recover(self._dir, repair=True)
        self._segments = SegmentSet.recovered(recovered)
        self._commits.rebind(self._segments.sync_data)
        self._tracking = recovered.tracking
        self._tail = LogTail.recovered(recovered, self._tail.epoch, recovered.max_epoch)
        self._history = EpochHistory.load(self._segments.refs)
        self._commits.rewind(self._tail_point())
        self._span_cursors.clear()

    def _tail_point(self) -> CommitPoint:
        return self._tail.commit_point(self._segments.active)

    def accept_chunks(self, data: bytes | memoryview, *, segment_start: bool = False) -> int:
        """Append a leader's whole chunks verbatim (``acceptor.accept_chunks``); returns
        the new next offset. Written, not fsynced: ``sync_to_disk()`` then
        ``durable_point().chunk_id`` is what a member reports as written.
        ``segment_start``: the first chunk starts one of the leader's segments."""
        return acceptor.accept_chunks(self, data, segment_start=segment_start)

    def recover_after_failure(self) -> int:
        """After a failed write or fdatasync: recover the files in place and accept writes
        again (``acceptor.recover_after_failure``); returns the new next offset."""
        return acceptor.recover_after_failure(self)

    @property
    def write_failed(self) -> bool:
        """A write or fdatasync failed: nothing more is written until recovery."""
        return self._segments.sync_failed is not None

    def truncate_after(self, keep_through_chunk_id: int) -> int:
        """Cut every chunk after ``keep_through_chunk_id`` (-1: all), crash-safely and
        fsynced; returns the new next offset (``acceptor.truncate_after``)."""
        return acceptor.truncate_after(self, keep_through_chunk_id)

    def start_epoch(self, epoch: int) -> int:
        """A new leader's first write: from now on chunks carry ``epoch``; writes the
        epoch's first chunk, a tracking snapshot, and returns its chunk id."""
        return acceptor.start_epoch(self, epoch)

    def epoch_history(self) -> tuple[EpochRangeTuple, ...]:
        """``(epoch, first chunk id, last chunk id)`` per epoch, oldest first (written
        chunks; the cluster layer turns them into ``EpochRange``s)."""
        return self._history.ranges()

    def tail(self) -> tuple[int, int]:
        """(epoch of the last written chunk, its chunk id); ``(0, -1)`` when empty."""
        return self._history.tail()

    def chunk_span(self, from_offset: int, max_bytes: int) -> acceptor.ChunkSpan | None:
        """Raw chunks for a fetch answer: a segment path and byte range to ``sendfile``
        (``acceptor.chunk_span``). Safe from any thread."""
        return acceptor.chunk_span(self, from_offset, max_bytes)

    def set_tiered_offset(self, next_offset: int) -> None:
        """The remote tier durably holds every offset below ``next_offset``: truncation
        refuses to cut there (``TruncateBelowTieredError``)."""
        self._tiered_next = next_offset

    def remote_position(self) -> tuple[int, int] | None:
        """``(stream first offset, tiered offset)`` as the tierer last told this log
        (``set_stream_first_offset``, ``set_tiered_offset``); None before it did. A
        leader sends it to its members, which free local segments below it."""
        tiered = self._tiered_next
        if tiered is None:
            return None
        first = self._stream_first if self._stream_first is not None else 0
        return min(first, tiered), tiered

    def read_member_epoch(self) -> int:
        """The highest epoch this member has seen for the stream: the persisted one, and
        never below the highest epoch in the log (a lost file cannot lower the fence
        below what the chunks prove). ``MemberEpochCorruptError`` if the file is bad."""
        return max(member_epoch.read_member_epoch(self._dir), self._history.tail()[0])

    def persist_member_epoch(self, epoch: int) -> None:
        """fsync ``epoch`` as the highest seen (atomic replace) before answering it."""
        member_epoch.persist_member_epoch(self._dir, epoch)
