"""The stream log: one writer appending Osiris chunks, many concurrent readers.

Threading: all mutating calls (append, store_offset, sync, maybe_sync, restart_at,
delete_segment, close) must come from one writer thread. Readers in other threads
only pread files and look at two values the writer replaces atomically: the tuple
of segments and the commit point. The commit point only ever covers fsynced chunks.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from tierlog.formats.chunk import (
    HEADER_SIZE,
    MAX_ENTRIES_PER_CHUNK,
    SUB_BATCH_HEADER_SIZE,
    ChunkType,
    Entry,
    RecordSizeError,
    SubBatch,
    count_entry_data,
    encode_entries,
    encode_records,
    encode_uniform_records,
    make_header,
    simple_entry,
)
from tierlog.formats.crc import crc32
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_HEADER,
    SEGMENT_HEADER,
    encode_index_record,
)
from tierlog.formats.tracking import MAX_ID_BYTES, encode_delta
from tierlog.log.commit import CommitPoint
from tierlog.log.config import LogConfig
from tierlog.log.errors import (
    InvalidAppendError,
    LogClosedError,
    OffsetReuseError,
    RecordTooLargeError,
    SegmentNotSealedError,
    StaleEpochError,
    StreamExistsError,
    SyncFailedError,
)
from tierlog.log.names import stream_dir_name
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.recovery import RecoveredLog, recover
from tierlog.log.segment_files import (
    ASYNC_CRC_MIN_BYTES,
    ChunkInfo,
    SegmentRef,
    crc32_in_background,
    fsync_dir,
    index_chunks,
    read_chunk_bytes,
    segment_ref,
)
from tierlog.log.tracking import TrackingState

log = logging.getLogger(__name__)

_MAX_U64 = 2**64 - 1
_U32 = struct.Struct(">I")


class SegmentInfo(NamedTuple):
    """A segment as listed for tiering and retention."""

    first_offset: int
    segment_path: str
    index_path: str
    size: int
    num_chunks: int
    next_offset: int
    sealed: bool


class AppendResult(NamedTuple):
    """What one append did.

    ``first_offset`` / ``last_offset`` are the offsets given to the first and last
    written record (None when everything was a duplicate); ``chunk_ids`` the chunks
    written. ``written`` / ``dropped`` are the publishing ids kept and dropped as
    duplicates (empty without a producer). Dropped ids are confirmed once the
    producer's last recorded chunk, ``dedup_chunk_id``, is committed.
    """

    first_offset: int | None
    last_offset: int | None
    chunk_ids: tuple[int, ...]
    written: tuple[int, ...]
    dropped: tuple[int, ...]
    dedup_chunk_id: int | None


@dataclass
class _Segment:
    ref: SegmentRef
    size: int
    num_chunks: int
    next_offset: int


CommitListener = Callable[[CommitPoint], None]


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
        self._epoch = config.epoch
        self._max_epoch = max(max_epoch, config.epoch)
        self._segments = [
            _Segment(
                s.ref,
                s.size,
                s.num_chunks,
                s.last_chunk.next_offset if s.last_chunk else s.ref.first_offset,
            )
            for s in recovered.segments
        ]
        self._first_timestamp = next(
            (s.first_chunk.timestamp for s in recovered.segments if s.first_chunk), 0
        )
        self._tracking = recovered.tracking
        last = recovered.last_chunk
        self._next_offset = recovered.next_offset
        self._last_timestamp = recovered.last_timestamp
        self._last_chunk_id = last.chunk_id if last else -1
        active = self._segments[-1]
        self._seg_fd = os.open(active.ref.segment_path, os.O_RDWR)
        self._idx_fd = os.open(active.ref.index_path, os.O_RDWR)
        os.lseek(self._seg_fd, active.size, os.SEEK_SET)
        os.lseek(self._idx_fd, 0, os.SEEK_END)
        os.fsync(self._seg_fd)
        self._written = CommitPoint(
            self._last_chunk_id, self._next_offset, active.ref.first_offset, active.size
        )
        self._commit = self._written
        self._segment_refs: tuple[SegmentRef, ...] = tuple(s.ref for s in self._segments)
        self._trusted_from = active.ref.first_offset  # recovery CRC-checked the tail segment
        self._cond = threading.Condition()
        self._listeners: list[CommitListener] = []
        self._last_sync = time.monotonic()
        self._closed = False
        self._sync_failed: OSError | None = None
        self.duplicates_dropped = 0
        self.recovery_notes = tuple(recovered.notes)

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
        dir_name = stream_dir_name(vhost, name, created_ns)
        os.makedirs(data_dir, exist_ok=True)
        stream_dir = os.path.join(data_dir, dir_name)
        try:
            os.mkdir(stream_dir)
        except FileExistsError:
            raise StreamExistsError(f"{stream_dir} already exists") from None
        _create_segment_files(segment_ref(stream_dir, 0))
        fsync_dir(stream_dir)
        fsync_dir(data_dir)
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
        """Fsync (committing everything written) and close the files."""
        if self._closed:
            return
        if self._sync_failed is None:
            self.sync()
            os.fsync(self._idx_fd)
        os.close(self._seg_fd)
        os.close(self._idx_fd)
        self._closed = True
        with self._cond:
            self._cond.notify_all()

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
        return self._epoch

    @property
    def max_epoch(self) -> int:
        """The largest epoch in the log (never above the writer's)."""
        return self._max_epoch

    @property
    def next_offset(self) -> int:
        """The offset the next chunk will get (written, not necessarily committed)."""
        return self._next_offset

    @property
    def first_offset(self) -> int:
        """The first offset held locally (the first segment's first chunk)."""
        return self._segments[0].ref.first_offset

    @property
    def last_chunk_id(self) -> int:
        """The last written chunk's id (-1 when the log is empty)."""
        return self._last_chunk_id

    @property
    def committed(self) -> CommitPoint:
        """The current commit point (safe to read from any thread)."""
        return self._commit

    @property
    def committed_chunk_id(self) -> int:
        return self._commit.chunk_id

    @property
    def committed_offset(self) -> int:
        """The last committed offset (-1 when nothing is committed)."""
        return self._commit.next_offset - 1

    @property
    def closed(self) -> bool:
        return self._closed

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        """The current segments (safe to read from any thread)."""
        return self._segment_refs

    def commit_point(self) -> CommitPoint:
        return self._commit

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
        self._check_open()
        gate = getattr(self, "_append_gate", None)
        if gate is not None:
            gate()  # may raise BackPressureError: nothing is written
        entries = list(entries)
        if producer is None and publishing_ids is None:
            encoded = self._encode_plain(entries)
            if encoded is not None:  # the common case: plain records, one chunk
                info = self._write_chunk(ChunkType.USER, encoded, len(entries), len(entries), b"")
                self._after_write()
                return AppendResult(
                    info.chunk_id, self._next_offset - 1, (info.chunk_id,), (), (), None
                )
        plain = self._check_sizes(entries)
        written: tuple[int, ...] = ()
        dropped: tuple[int, ...] = ()
        producer_id: bytes | None = None
        ids: list[int] = []
        if producer is not None:
            producer_id = _tracking_id(producer, "producer name")
            if publishing_ids is None or len(publishing_ids) != len(entries):
                raise InvalidAppendError("publishing_ids must give one id per entry")
            entries, ids, dropped_list = self._deduplicate(producer_id, entries, publishing_ids)
            written, dropped = tuple(ids), tuple(dropped_list)
            self.duplicates_dropped += len(dropped_list)
        elif publishing_ids is not None:
            raise InvalidAppendError("publishing_ids need a producer")
        chunk_ids: list[int] = []
        first: int | None = None
        for lo, hi in self._split(entries, plain):
            group = entries[lo:hi]
            trailer = b""
            if producer_id is not None:
                trailer = encode_delta(sequences={producer_id: ids[hi - 1]})
            if plain:
                data, num_entries, num_records = encode_records(group), len(group), len(group)  # type: ignore[arg-type]
            else:
                data, num_entries, num_records = encode_entries(group)
            info = self._write_chunk(ChunkType.USER, data, num_entries, num_records, trailer)
            if producer_id is not None:
                self._tracking.sequences[producer_id] = (info.chunk_id, ids[hi - 1])
            chunk_ids.append(info.chunk_id)
            if first is None:
                first = info.chunk_id
        self._after_write()
        dedup_chunk = None
        if producer_id is not None and producer_id in self._tracking.sequences:
            dedup_chunk = self._tracking.sequences[producer_id][0]
        return AppendResult(
            first,
            self._next_offset - 1 if chunk_ids else None,
            tuple(chunk_ids),
            written,
            dropped,
            dedup_chunk,
        )

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
        the caller splits.

        Deduplication is the caller's: with ``producer``, the entries are the ones left
        after dropping publishing ids not above ``producer_sequence(producer)``, and
        ``last_publishing_id`` is the largest id among them. The chunk's trailer records
        it as the producer's new sequence (as Osiris does), and tracking follows. The
        log refuses (InvalidAppendError, nothing written) a batch whose lowest id,
        ``first_publishing_id`` (default ``last_publishing_id``), is not above the
        producer's sequence. ``written`` / ``dropped`` of the result are empty (the
        caller has the ids); ``dedup_chunk_id`` is the chunk written.
        """
        self._check_open()
        producer_id: bytes | None = None
        if producer is not None:
            producer_id = _tracking_id(producer, "producer name")
            if last_publishing_id is None:
                raise InvalidAppendError("a producer's batch needs last_publishing_id")
            first = last_publishing_id if first_publishing_id is None else first_publishing_id
            for pid in (first, last_publishing_id):
                if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= _MAX_U64:
                    raise InvalidAppendError(f"publishing id {pid!r} is not a u64")
            if first > last_publishing_id:
                raise InvalidAppendError("first_publishing_id is above last_publishing_id")
            known = self._tracking.sequences.get(producer_id)
            if known is not None and first <= known[1]:
                raise InvalidAppendError(
                    f"publishing id {first} is not above the producer's sequence {known[1]}"
                )
        elif first_publishing_id is not None or last_publishing_id is not None:
            raise InvalidAppendError("publishing ids need a producer")
        if not 1 <= num_entries <= MAX_ENTRIES_PER_CHUNK or num_records < 1:
            raise InvalidAppendError(
                f"{num_entries} entries / {num_records} records do not make a chunk"
            )
        limit = self._config.max_chunk_bytes
        if len(data) > limit:
            raise InvalidAppendError(f"{len(data)} bytes of entries exceed one chunk ({limit})")
        try:
            records = count_entry_data(
                data, num_entries, self._config.max_record_bytes, limit - SUB_BATCH_HEADER_SIZE
            )
        except RecordSizeError as exc:
            raise RecordTooLargeError(str(exc)) from exc
        except FormatError as exc:
            raise InvalidAppendError(f"entry data: {exc}") from exc
        if records != num_records:
            raise InvalidAppendError(f"entries hold {records} records, not {num_records}")
        gate = getattr(self, "_append_gate", None)
        if gate is not None:
            gate()  # may raise BackPressureError: nothing is written
        trailer = b""
        if producer_id is not None:
            assert last_publishing_id is not None
            trailer = encode_delta(sequences={producer_id: last_publishing_id})
        info = self._write_chunk(ChunkType.USER, data, num_entries, num_records, trailer)
        if producer_id is not None:
            assert last_publishing_id is not None
            self._tracking.sequences[producer_id] = (info.chunk_id, last_publishing_id)
        self._after_write()
        return AppendResult(
            info.chunk_id,
            info.chunk_id + num_records - 1,
            (info.chunk_id,),
            (),
            (),
            info.chunk_id if producer_id is not None else None,
        )

    def append_records(self, records: Sequence[bytes]) -> int:
        """Fast path: append plain records as one chunk; returns its chunk id.

        Same limits as ``append`` (falls back to it when the batch must be split).
        """
        self._check_open()
        n = len(records)
        if not n:
            raise InvalidAppendError("empty batch")
        longest = max(map(len, records))
        total = sum(map(len, records)) + 4 * n
        if (
            longest > self._config.max_record_bytes
            or total > self._config.max_chunk_bytes
            or n > MAX_ENTRIES_PER_CHUNK
        ):
            result = self.append(records)
            assert result.first_offset is not None
            return result.first_offset
        info = self._write_chunk(ChunkType.USER, encode_records(records), n, n, b"")
        self._after_write()
        return info.chunk_id

    def _encode_plain(self, entries: list[Entry]) -> bytes | None:
        """The chunk data of plain records fitting one chunk, or None (the general path
        then splits, checks types and raises the right errors)."""
        try:
            lengths = list(map(len, entries))  # type: ignore[arg-type]
        except TypeError:  # a SubBatch (or something else without a length)
            return None
        n = len(lengths)
        if not n or n > MAX_ENTRIES_PER_CHUNK:
            return None
        uniform = lengths.count(lengths[0]) == n
        longest = lengths[0] if uniform else max(lengths)
        total = n * lengths[0] if uniform else sum(lengths)
        if longest > self._config.max_record_bytes or total + 4 * n > self._config.max_chunk_bytes:
            return None
        try:
            if uniform:
                return encode_uniform_records(entries, lengths[0])  # type: ignore[arg-type]
            prefixes = map(_U32.pack, lengths)
            return b"".join(itertools.chain.from_iterable(zip(prefixes, entries, strict=True)))  # type: ignore[arg-type]
        except TypeError:  # not bytes-like
            return None

    def _check_sizes(self, entries: list[Entry]) -> bool:
        """Check entry types and sizes; True when all entries are plain ``bytes``."""
        if not entries:
            raise InvalidAppendError("empty batch")
        limit = self._config.max_record_bytes
        if set(map(type, entries)) == {bytes}:
            longest = max(map(len, entries))  # type: ignore[arg-type]
            if longest > limit:
                raise RecordTooLargeError(f"record of {longest} bytes exceeds {limit}")
            return True
        sub_limit = self._config.max_chunk_bytes - SUB_BATCH_HEADER_SIZE
        for entry in entries:
            if isinstance(entry, SubBatch):
                if len(entry.data) > sub_limit:
                    raise RecordTooLargeError(
                        f"sub-batch of {len(entry.data)} bytes exceeds {sub_limit}"
                    )
            elif isinstance(entry, bytes | bytearray | memoryview):
                if len(entry) > limit:
                    raise RecordTooLargeError(f"record of {len(entry)} bytes exceeds {limit}")
            else:
                raise InvalidAppendError(f"entries must be bytes or SubBatch, not {type(entry)}")
        return False

    def _deduplicate(
        self, producer_id: bytes, entries: list[Entry], publishing_ids: Sequence[int]
    ) -> tuple[list[Entry], list[int], list[int]]:
        known = self._tracking.sequences.get(producer_id)
        last = known[1] if known else -1
        kept: list[Entry] = []
        kept_ids: list[int] = []
        dropped: list[int] = []
        for entry, pid in zip(entries, publishing_ids, strict=True):
            if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= _MAX_U64:
                raise InvalidAppendError(f"publishing id {pid!r} is not a u64")
            if pid > last:
                kept.append(entry)
                kept_ids.append(pid)
                last = pid
            else:
                dropped.append(pid)
        return kept, kept_ids, dropped

    def _split(self, entries: list[Entry], plain: bool) -> list[tuple[int, int]]:
        """Index ranges of entries forming chunks within max_chunk_bytes and 65535 entries."""
        if not entries:
            return []
        limit = self._config.max_chunk_bytes
        n = len(entries)
        if plain and n <= MAX_ENTRIES_PER_CHUNK and sum(map(len, entries)) + 4 * n <= limit:  # type: ignore[arg-type]
            return [(0, n)]
        sizes = [
            SUB_BATCH_HEADER_SIZE + len(e.data) if isinstance(e, SubBatch) else 4 + len(e)
            for e in entries
        ]
        if sum(sizes) <= limit and len(entries) <= MAX_ENTRIES_PER_CHUNK:
            return [(0, len(entries))]
        ranges: list[tuple[int, int]] = []
        lo = 0
        acc = 0
        for i, size in enumerate(sizes):
            if i > lo and (acc + size > limit or i - lo >= MAX_ENTRIES_PER_CHUNK):
                ranges.append((lo, i))
                lo, acc = i, 0
            acc += size
        ranges.append((lo, len(entries)))
        return ranges

    # ----------------------------------------------------------------- tracking

    def store_offset(self, consumer: str | bytes, offset: int) -> int:
        """Store a consumer's offset (a tracking delta chunk); returns that chunk's id."""
        self._check_open()
        ident = _tracking_id(consumer, "consumer name")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= _MAX_U64:
            raise InvalidAppendError(f"offset {offset!r} is not a u64")
        data = simple_entry(encode_delta(offsets={ident: offset}))
        info = self._write_chunk(ChunkType.TRACKING_DELTA, data, 1, 1, b"")
        self._tracking.offsets[ident] = offset
        self._after_write()
        return info.chunk_id

    def query_offset(self, consumer: str | bytes) -> int | None:
        """A consumer's stored offset, or None."""
        return self._tracking.offsets.get(_tracking_id(consumer, "consumer name"))

    def producer_sequence(self, producer: str | bytes) -> int | None:
        """A producer's last written publishing id, or None."""
        known = self._tracking.sequences.get(_tracking_id(producer, "producer name"))
        return known[1] if known else None

    def tracking_snapshot(self) -> bytes:
        """All tracking state in Osiris's snapshot encoding (tiering stores / restores it)."""
        return self._tracking.to_bytes()

    # ----------------------------------------------------------------- commit

    def sync(self) -> CommitPoint:
        """Fsync the active segment now and commit everything written."""
        self._check_open()
        if self._written != self._commit:
            self._fdatasync()
            self._publish(self._written)
        self._last_sync = time.monotonic()
        return self._commit

    def _fdatasync(self) -> None:
        """fdatasync the active segment. After a failure the kernel may have dropped the
        dirty pages and a later fsync can succeed without them, so the log refuses all
        further work (``SyncFailedError``) until it is closed and reopened: recovery then
        finds what really reached the disk."""
        try:
            os.fdatasync(self._seg_fd)
        except OSError as exc:
            self._sync_failed = exc
            raise SyncFailedError(f"{self._dir}: fdatasync failed: {exc!r}") from exc

    def maybe_sync(self, now: float | None = None) -> bool:
        """Drive the ``interval`` cadence: fsync if the interval has passed and data waits.

        ``now`` is a ``time.monotonic()`` value. Returns True when it synced.
        """
        if self._config.fsync != "interval" or self._written == self._commit:
            return False
        now = time.monotonic() if now is None else now
        if (now - self._last_sync) * 1000.0 >= self._config.fsync_interval_ms:
            self.sync()
            return True
        return False

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call ``listener(commit_point)`` (in the writer thread) whenever the commit advances."""
        self._listeners.append(listener)

    def remove_commit_listener(self, listener: CommitListener) -> None:
        self._listeners.remove(listener)

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        """Block until the committed next offset exceeds ``next_offset`` (or timeout/close)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._commit.next_offset > next_offset or self._closed, timeout
            )
            return self._commit

    def _publish(self, point: CommitPoint) -> None:
        with self._cond:
            self._commit = point
            self._cond.notify_all()
        for listener in list(self._listeners):
            try:
                listener(point)
            except Exception:
                log.exception("commit listener %r failed", listener)

    def _after_write(self) -> None:
        if self._config.fsync == "chunk":
            self.sync()
        elif self._config.fsync == "interval":
            self.maybe_sync()

    # ----------------------------------------------------------------- chunk writing

    def _write_chunk(
        self,
        chunk_type: ChunkType,
        data: bytes | memoryview,
        num_entries: int,
        num_records: int,
        trailer: bytes,
    ) -> ChunkInfo:
        active = self._segments[-1]
        if (
            active.size >= self._config.max_segment_bytes and active.num_chunks >= 2
        ) or active.num_chunks >= self._config.max_segment_chunks:
            self._roll(self._next_offset)
            if not self._tracking.is_empty():
                self._write_snapshot_chunk()
            active = self._segments[-1]
        chunk_id = self._next_offset
        timestamp = max(time.time_ns() // 1_000_000, self._last_timestamp)
        position = active.size
        tail = [data, trailer] if trailer else [data]
        if len(data) >= ASYNC_CRC_MIN_BYTES and crc32 is zlib.crc32:
            # Slow (zlib) CRC: compute it in the helper thread while the data (after a
            # 48-byte gap) goes to the file; the header follows. Readers and recovery never
            # look past the commit. With ISA-L the CRC costs less than the thread hop, so
            # the whole chunk goes out in one pwritev below.
            crc = crc32_in_background(data)
            _pwrite_all(self._seg_fd, tail, position + HEADER_SIZE)
            header = make_header(
                chunk_type,
                chunk_id,
                self._epoch,
                timestamp,
                data,
                num_entries,
                num_records,
                len(trailer),
                data_crc=crc.result(),
            )
            _pwrite_all(self._seg_fd, [header.encode()], position)
        else:
            header = make_header(
                chunk_type,
                chunk_id,
                self._epoch,
                timestamp,
                data,
                num_entries,
                num_records,
                len(trailer),
            )
            _pwrite_all(self._seg_fd, [header.encode(), *tail], position)
        _write_all(
            self._idx_fd,
            [encode_index_record(chunk_id, timestamp, self._epoch, position, chunk_type)],
            29,
        )
        active.size += header.total_size
        active.num_chunks += 1
        active.next_offset = header.next_offset
        self._next_offset = header.next_offset
        self._last_timestamp = timestamp
        self._last_chunk_id = chunk_id
        if self._first_timestamp == 0:
            self._first_timestamp = timestamp
        self._written = CommitPoint(
            chunk_id, header.next_offset, active.ref.first_offset, active.size
        )
        return ChunkInfo(
            chunk_id,
            timestamp,
            self._epoch,
            position,
            header.total_size,
            num_records,
            int(chunk_type),
            header.data_crc,
        )

    def set_append_gate(self, gate: Callable[[], None] | None) -> None:
        """Install a check run before every append (tiering's back-pressure): it raises
        ``BackPressureError`` to refuse the append before anything is written."""
        self._append_gate = gate

    def set_stream_first_offset(self, offset: int) -> None:
        """Tell the log where the whole stream (all tiers) starts.

        Osiris drops consumer offsets below the log's first offset from tracking
        snapshots; with a remote tier the stream starts earlier than the local log, so
        the tierer sets this and snapshots keep offsets down to it.
        """
        self._stream_first = offset

    def _write_snapshot_chunk(self) -> ChunkInfo:
        floor = self.first_offset
        stream_first = getattr(self, "_stream_first", None)
        if stream_first is not None:
            floor = min(floor, stream_first)
        body = self._tracking.snapshot(floor, self._first_timestamp, self._config.max_producers)
        return self._write_chunk(ChunkType.TRACKING_SNAPSHOT, simple_entry(body), 1, 1, b"")

    def _roll(self, first_offset: int) -> None:
        """Seal the active segment (fsync, commit) and start a new one at ``first_offset``."""
        if self._written != self._commit:
            self._fdatasync()
        os.fsync(self._idx_fd)
        ref = segment_ref(self._dir, first_offset)
        _create_segment_files(ref)
        fsync_dir(self._dir)
        os.close(self._seg_fd)
        os.close(self._idx_fd)
        self._seg_fd = os.open(ref.segment_path, os.O_RDWR)
        self._idx_fd = os.open(ref.index_path, os.O_RDWR)
        os.lseek(self._seg_fd, 0, os.SEEK_END)
        os.lseek(self._idx_fd, 0, os.SEEK_END)
        self._segments.append(_Segment(ref, FILE_HEADER_SIZE, 0, first_offset))
        self._segment_refs = tuple(s.ref for s in self._segments)
        if self._written != self._commit:
            self._publish(self._written)
            self._last_sync = time.monotonic()

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
        self._check_open()
        if next_offset < self._next_offset:
            raise OffsetReuseError(
                f"restart at {next_offset} would reuse offsets below {self._next_offset}"
            )
        if epoch <= self._max_epoch:
            raise StaleEpochError(f"restart epoch {epoch} must exceed {self._max_epoch}")
        tracking = TrackingState.from_bytes(tracking_snapshot)
        active = self._segments[-1]
        empty_active = active.num_chunks == 0
        if empty_active and active.ref.first_offset == next_offset:
            pass  # the empty active segment already starts there
        else:
            self._roll(next_offset)
        if empty_active and len(self._segments) > 1 and self._segments[-2] is active:
            self._segments.pop(-2)
            for path in (active.ref.index_path, active.ref.segment_path):
                os.unlink(path)
            self._segment_refs = tuple(s.ref for s in self._segments)
        self._next_offset = next_offset
        self._epoch = epoch
        self._max_epoch = epoch
        # timestamps never go back across the restart: the remote tail may be newer
        self._last_timestamp = max(self._last_timestamp, last_timestamp)
        self._tracking = tracking
        self._write_snapshot_chunk()
        fsync_dir(self._dir)
        self.sync()

    def list_segments(self) -> list[SegmentInfo]:
        """All local segments, oldest first; the last one is active (not sealed)."""
        last = len(self._segments) - 1
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
            for i, s in enumerate(self._segments)
        ]

    def segment_chunks(self, first_offset: int) -> list[ChunkInfo]:
        """The chunk index of a segment (committed chunks only for the active one)."""
        seg = self._find_segment(first_offset)
        chunks = index_chunks(seg.ref.segment_path, seg.ref.index_path)
        commit = self._commit
        return [c for c in chunks if c.chunk_id <= commit.chunk_id]

    def read_chunk_bytes(self, first_offset: int, position: int, size: int) -> bytes:
        """A chunk's raw bytes from segment ``first_offset`` (os.pread)."""
        return read_chunk_bytes(self._find_segment(first_offset).ref.segment_path, position, size)

    def delete_segment(self, first_offset: int) -> None:
        """Delete a sealed segment (local retention decides which; never the active one).

        Only the oldest segment may go, so the local log stays one contiguous range.
        """
        self._check_open()
        seg = self._find_segment(first_offset)
        if seg is self._segments[-1]:
            raise SegmentNotSealedError(f"segment {first_offset} is the active segment")
        if seg is not self._segments[0]:
            raise SegmentNotSealedError(f"segment {first_offset} is not the oldest segment")
        self._segments.pop(0)
        self._segment_refs = tuple(s.ref for s in self._segments)
        os.unlink(seg.ref.index_path)
        os.unlink(seg.ref.segment_path)
        fsync_dir(self._dir)

    def _find_segment(self, first_offset: int) -> _Segment:
        for seg in self._segments:
            if seg.ref.first_offset == first_offset:
                return seg
        raise KeyError(f"no segment starts at {first_offset}")

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self._dir} is closed")
        if self._sync_failed is not None:
            raise SyncFailedError(
                f"{self._dir}: an earlier fdatasync failed ({self._sync_failed!r}); reopen the "
                "log (recovery) before writing more"
            )


def _tracking_id(name: str | bytes, what: str) -> bytes:
    ident = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    if not ident or len(ident) > MAX_ID_BYTES:
        raise InvalidAppendError(f"{what} must be 1..255 bytes")
    return ident


def _write_all(fd: int, parts: list[bytes | memoryview], total: int) -> None:
    written = os.writev(fd, parts)
    if written == total:
        return
    rest = b"".join(parts)[written:]
    while rest:
        n = os.write(fd, rest)
        rest = rest[n:]


def _pwrite_all(fd: int, parts: list[bytes | memoryview], position: int) -> None:
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


def _create_segment_files(ref: SegmentRef) -> None:
    for path, header in ((ref.index_path, INDEX_HEADER), (ref.segment_path, SEGMENT_HEADER)):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, header)
            os.fsync(fd)
        finally:
            os.close(fd)
