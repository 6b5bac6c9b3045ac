"""The message store: append, read by msg id, ref-counted remove, compaction, recovery.

Files are numbered segments in one directory; ``last_v1_file`` says which numbers are
RabbitMQ v1 ``.rdq`` files (read in place, never written) and which are v2 ``.sqs`` files.
New messages are appended to the newest v2 file as ``MESSAGE_WITH_CHECKSUM`` records.

Removing a message's last reference writes a 5-byte HOLE header over its record (one
``pwrite``, no read), so a file always describes itself: dirty recovery is a scan that finds
exactly the live messages. Compaction moves messages from the end of a file into earlier
holes and truncates; each step leaves a file that scans to the same contents (see
``compact``). A clean close writes the index and ``last_v1_file`` to the clean-shutdown
file, which the next open reads and deletes.

``crash_hook`` (tests) is called with the name of each step of compaction, migration and
recovery right after that step's side effect, so a test can stop the store at every point.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tierlog.formats import msgstore as fmt
from tierlog.formats.ets_file import EtsFileError, MsgLocation, read_msg_locations
from tierlog.formats.msgstore_clean import (
    CleanEntry,
    CleanFileError,
    decode_clean,
    encode_clean,
)
from tierlog.logs import get_logger
from tierlog.msgstore.errors import (
    CorruptSegmentError,
    MixedStoreError,
    MsgNotFoundError,
    MsgStoreConfigError,
    NotADirectoryStoreError,
    StoreClosedError,
)
from tierlog.msgstore.files import (
    CLEAN_FILE,
    RABBIT_CLEAN_FILE,
    RABBIT_INDEX_FILE,
    TMP_SUFFIX,
    V1_EXT,
    V2_EXT,
    file_format,
    filenum_to_name,
    fsync_dir,
    last_v1_file_on_disk,
    list_segments,
    scan_v1_fd,
    scan_v2_fd,
)

log = get_logger(__name__)

COMPACTION_STEPS = (
    "compact.coalesce_holes",
    "compact.fill_holes",
    "compact.fsync_fill",
    "compact.flip_headers",
    "compact.fsync_headers",
    "compact.index_updated",
    "compact.truncate",
)
"""Crash points of one compaction, in order."""


@dataclass(frozen=True)
class MsgStoreConfig:
    """``file_size_limit``: a v2 file is closed for appends once it reaches this size.
    ``sync_writes``: fsync after every write / remove (else only on ``sync`` and close)."""

    file_size_limit: int = 16 * 1024 * 1024
    sync_writes: bool = True

    def __post_init__(self) -> None:
        if not 4096 <= self.file_size_limit <= fmt.MAX_RECORD_SIZE:
            raise MsgStoreConfigError(
                f"file_size_limit must be within 4096..{fmt.MAX_RECORD_SIZE}, "
                f"got {self.file_size_limit}"
            )


class Location:
    """Where a live message is and how many references it has."""

    __slots__ = ("file", "offset", "ref_count", "size")

    def __init__(self, ref_count: int, file: int, offset: int, size: int) -> None:
        self.ref_count = ref_count
        self.file = file
        self.offset = offset
        self.size = size


class FileInfo:
    """Per file: its size (the append position of the current file), the live bytes, and
    the msg ids located in it (so deleting a file drops its index entries at once)."""

    __slots__ = ("live_bytes", "msg_ids", "size", "truncate_unsynced")

    def __init__(self, size: int) -> None:
        self.size = size
        self.live_bytes = 0
        self.msg_ids: set[bytes] = set()
        self.truncate_unsynced = False
        """A compaction's truncation is not fsynced yet: it must be before the file is
        written again (else a durable hole over a moved copy could outlive the truncation
        and let the original, past the intended end, come back)."""


@dataclass(frozen=True)
class CompactionResult:
    file: int
    moved: int
    bytes_moved: int
    bytes_written: int
    size_before: int
    size_after: int


class MessageStore:
    """One message-store directory. Not thread-safe: one owner calls it."""

    def __init__(self, directory: Path, config: MsgStoreConfig) -> None:
        self.directory = directory
        self.config = config
        self.index: dict[bytes, Location] = {}
        self.files: dict[int, FileInfo] = {}
        self.last_v1_file: int | None = None
        self.current_file: int | None = None
        self.recovered_clean = False
        self.v1_liveness_known = True
        self.crash_hook: Callable[[str], None] | None = None
        self.bytes_written = 0
        self._fds: dict[int, int] = {}
        self._closed = False

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: MsgStoreConfig | None = None,
        *,
        crash_hook: Callable[[str], None] | None = None,
    ) -> MessageStore:
        """Open (creating if missing) a store directory: clean recovery from the
        clean-shutdown file when present and valid, otherwise dirty recovery by scanning."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryStoreError(f"{path} is not a directory")
        store = cls(path, config or MsgStoreConfig())
        store.crash_hook = crash_hook
        for name in os.listdir(path):
            if name.endswith(V2_EXT + TMP_SUFFIX):
                os.unlink(path / name)  # an unfinished migration target: never referenced
        try:
            store._check_boundary()
            clean = path / CLEAN_FILE
            if clean.exists():
                try:
                    store._recover_clean(clean.read_bytes())
                    store.recovered_clean = True
                except (CleanFileError, MixedStoreError) as exc:
                    log.warning("msgstore_clean_file_rejected", directory=str(path), error=str(exc))
                    store._reset()
                os.unlink(clean)
                fsync_dir(path)
            if not store.recovered_clean:
                store._recover_dirty()
        except BaseException:
            store._close_fds()
            raise
        v2 = list_segments(path, V2_EXT)
        store.current_file = v2[-1] if v2 else None
        log.info(
            "msgstore_opened",
            directory=str(path),
            clean=store.recovered_clean,
            messages=len(store.index),
            files=len(store.files),
            last_v1_file=store.last_v1_file,
        )
        return store

    def close(self) -> None:
        """fsync every file and write the clean-shutdown file."""
        if self._closed:
            return
        for fd in self._fds.values():
            os.fsync(fd)
        entries = [
            CleanEntry(msg_id, loc.ref_count, loc.file, loc.offset, loc.size)
            for msg_id, loc in self.index.items()
        ]
        data = encode_clean(self.last_v1_file, entries)
        tmp = self.directory / (CLEAN_FILE + TMP_SUFFIX)
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.directory / CLEAN_FILE)
        fsync_dir(self.directory)
        self._close_fds()
        self._closed = True
        log.info("msgstore_closed", directory=str(self.directory), messages=len(self.index))

    def abandon(self) -> None:
        """Close file descriptors without a clean shutdown (what a crash leaves)."""
        self._close_fds()
        self._closed = True

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abandon()

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def _reset(self) -> None:
        self.index.clear()
        self.files.clear()
        self.last_v1_file = None

    def _step(self, name: str) -> None:
        if self.crash_hook is not None:
            self.crash_hook(name)

    # ------------------------------------------------------------------ files

    def path_of(self, file: int) -> Path:
        return self.directory / filenum_to_name(file, self.last_v1_file)

    def _fd(self, file: int) -> int:
        fd = self._fds.get(file)
        if fd is None:
            if self._closed:
                raise StoreClosedError(f"message store {self.directory} is closed")
            writable = file_format(file, self.last_v1_file) == "v2"
            fd = os.open(self.path_of(file), os.O_RDWR if writable else os.O_RDONLY)
            self._fds[file] = fd
        return fd

    def _settled_fd(self, file: int) -> int:
        """The file's descriptor for a write, after making a pending truncation durable."""
        fd = self._fd(file)
        info = self.files[file]
        if info.truncate_unsynced:
            os.fsync(fd)
            info.truncate_unsynced = False
        return fd

    def _drop_fd(self, file: int) -> None:
        fd = self._fds.pop(file, None)
        if fd is not None:
            os.close(fd)

    def next_file_number(self) -> int:
        numbers = list_segments(self.directory, V2_EXT) + list_segments(self.directory, V1_EXT)
        return max(numbers, default=-1) + 1

    def _check_boundary(self) -> None:
        v1 = list_segments(self.directory, V1_EXT)
        v2 = list_segments(self.directory, V2_EXT)
        if v1 and v2 and v2[0] <= v1[-1]:
            raise MixedStoreError(
                f"{self.directory}: {v2[0]}{V2_EXT} is numbered at or below "
                f"{v1[-1]}{V1_EXT} (last_v1_file); the boundary cannot be honoured"
            )

    def _new_v2_file(self) -> int:
        file = self.next_file_number()
        fd = os.open(self.directory / f"{file}{V2_EXT}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.pwrite(fd, fmt.encode_header(), 0)
        os.fsync(fd)
        fsync_dir(self.directory)
        self._fds[file] = fd
        self.files[file] = FileInfo(fmt.HEADER_SIZE)
        self.current_file = file
        log.info("msgstore_file_created", directory=str(self.directory), file=file)
        return file

    # ------------------------------------------------------------------ operations

    def write(self, msg_id: bytes, body: bytes | memoryview) -> None:
        """Store a message, or add a reference if this msg id is already stored."""
        if self._closed:
            raise StoreClosedError(f"message store {self.directory} is closed")
        loc = self.index.get(msg_id)
        if loc is not None:
            loc.ref_count += 1
            return
        record = fmt.encode_message(msg_id, body)
        file = self.current_file
        if file is None or (
            self.files[file].size + len(record) > self.config.file_size_limit
            and self.files[file].size > fmt.HEADER_SIZE
        ):
            file = self._new_v2_file()
        info = self.files[file]
        fd = self._settled_fd(file)
        os.pwrite(fd, record, info.size)
        if self.config.sync_writes:
            os.fdatasync(fd)
        self.index[msg_id] = Location(1, file, info.size, len(record))
        info.msg_ids.add(msg_id)
        info.live_bytes += len(record)
        info.size += len(record)

    def read(self, msg_id: bytes) -> bytes:
        """The body of a live message (for a v1 record: its body bytes as RabbitMQ stored
        them, an Erlang term). Bit flips and misplaced records raise typed errors."""
        loc = self.index.get(msg_id)
        if loc is None:
            raise MsgNotFoundError(f"msg id {msg_id.hex()} is not in {self.directory}")
        data = os.pread(self._fd(loc.file), loc.size, loc.offset)
        if len(data) != loc.size:
            raise fmt.TornRecordError(
                f"{self.path_of(loc.file)}: record at {loc.offset} is cut off "
                f"({len(data)} of {loc.size} bytes)"
            )
        if file_format(loc.file, self.last_v1_file) == "v1":
            return bytes(fmt.decode_v1_record(data, expected_id=msg_id)[1])
        return bytes(fmt.decode_message(data, expected_id=msg_id)[1])

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self.index

    def __len__(self) -> int:
        return len(self.index)

    def msg_ids(self) -> Iterator[bytes]:
        return iter(list(self.index))

    def remove(self, msg_id: bytes) -> None:
        """Drop one reference; the last one turns the record into a HOLE (v2) and deletes
        the index entry at once. A file left without live messages is deleted."""
        loc = self.index.get(msg_id)
        if loc is None:
            raise MsgNotFoundError(f"msg id {msg_id.hex()} is not in {self.directory}")
        loc.ref_count -= 1
        if loc.ref_count > 0:
            return
        if file_format(loc.file, self.last_v1_file) == "v2":
            fd = self._settled_fd(loc.file)
            marker = fmt.hole_marker(loc.size)
            os.pwrite(fd, marker, loc.offset)
            self.bytes_written += len(marker)
            if self.config.sync_writes:
                os.fdatasync(fd)
        del self.index[msg_id]
        info = self.files[loc.file]
        info.msg_ids.discard(msg_id)
        info.live_bytes -= loc.size
        self.delete_file_if_empty(loc.file)

    def sync(self) -> None:
        for fd in self._fds.values():
            os.fdatasync(fd)

    def delete_file_if_empty(self, file: int) -> bool:
        """Delete a file (v1 or v2) that holds no live message, unless it is the current
        append file. Its index entries (none can be live) go with it."""
        info = self.files.get(file)
        if info is None or info.msg_ids or file == self.current_file:
            return False
        path = self.path_of(file)
        self._drop_fd(file)
        os.unlink(path)
        fsync_dir(self.directory)
        del self.files[file]
        if file_format(file, self.last_v1_file) == "v1":
            self.last_v1_file = last_v1_file_on_disk(self.directory)
        log.info("msgstore_file_deleted", directory=str(self.directory), file=file)
        return True

    def compaction_candidates(self) -> list[int]:
        """v2 files (not the current one) whose live bytes are less than half their size."""
        return [
            f
            for f, info in sorted(self.files.items())
            if f != self.current_file
            and file_format(f, self.last_v1_file) == "v2"
            and info.live_bytes * 2 < info.size - fmt.HEADER_SIZE
        ]

    # ------------------------------------------------------------------ compaction

    def compact(self, file: int) -> CompactionResult:
        """Move messages from the end of a v2 file into earlier holes, then truncate.

        Steps (each leaves a file that scans to the same live messages):
        1. a HOLE header at the start of every gap that receives moved messages, so that
           gap is one hole whose inside is never interpreted (every other gap already is
           made of the hole records removals wrote);
        2. per destination gap, one ``pwrite`` of the moved records minus their first
           5 bytes plus the marker of what remains of the gap: all inside the hole;
        3. fsync; 4. per gap, a 5-byte ``pwrite`` that turns the hole's header into the
           first moved record's header, after which a scan sees the moved copies first (a
           scan keeps the first copy of a msg id, so the originals at the end are ignored);
        5. fsync; 6. index update; 7. truncate after the last kept record (not fsynced:
        a lost truncation only leaves second copies that recovery turns into holes).
        No gap is ever zero-filled.
        """
        if file_format(file, self.last_v1_file) != "v2":
            raise MixedStoreError(f"file {file} is a v1 file: v1 files are never written")
        info = self.files[file]
        fd = self._settled_fd(file)
        live = sorted(
            ((self.index[m].offset, self.index[m].size, m) for m in info.msg_ids),
            key=lambda t: t[0],
        )
        moves, truncate_at = plan_compaction(live, fmt.HEADER_SIZE)
        size_before = info.size
        written = 0
        holes = original_gaps(live, fmt.HEADER_SIZE, truncate_at)
        targets = moves_per_hole(moves, holes)
        # 1. one HOLE header over each gap that receives messages: whatever was inside (the
        # hole records removals left) is no longer interpreted. Other gaps already are
        # hole records and stay as they are.
        for start, end, _group in targets:
            marker = fmt.hole_marker(end - start)
            os.pwrite(fd, marker, start)
            written += len(marker)
        self._step("compact.coalesce_holes")
        # 2. fill each destination hole's inside: moved records (minus the first 5 bytes of
        # the first one) and the marker of the rest of the hole, in one pwrite
        flips: list[tuple[int, bytes]] = []
        bytes_moved = 0
        for start, end, group in targets:
            moved = sum(size for (_src, size, _m, _dst) in group)
            tail = fmt.hole_marker(end - start - moved)
            buf = bytearray(moved + len(tail))
            view = memoryview(buf)
            at = 0
            for src, size, _m, _dst in group:
                if os.preadv(fd, [view[at : at + size]], src) != size:
                    raise fmt.TornRecordError(f"{self.path_of(file)}: record at {src} cut off")
                at += size
            view[moved:] = tail
            bytes_moved += moved
            written += os.pwrite(fd, view[fmt.HOLE_MIN :], start + fmt.HOLE_MIN)
            flips.append((start, bytes(view[: fmt.HOLE_MIN])))
        self._step("compact.fill_holes")
        if flips:
            os.fsync(fd)
        self._step("compact.fsync_fill")
        # 4. switch each hole header to its first moved record's header
        for start, head in flips:
            os.pwrite(fd, head, start)
            written += len(head)
        self._step("compact.flip_headers")
        os.fsync(fd)
        self._step("compact.fsync_headers")
        for _src, _size, msg_id, dst in moves:
            self.index[msg_id].offset = dst
        self._step("compact.index_updated")
        # Not fsynced here (RabbitMQ does not sync it either): a truncation lost in a crash
        # leaves the moved originals past the end, second copies that recovery turns into
        # holes. It is made durable before the file's next write (``_settled_fd``).
        os.ftruncate(fd, truncate_at)
        info.size = truncate_at
        info.truncate_unsynced = True
        self._step("compact.truncate")
        self.bytes_written += written
        log.info(
            "msgstore_compacted",
            directory=str(self.directory),
            file=file,
            moved=len(moves),
            size_before=size_before,
            size_after=truncate_at,
        )
        return CompactionResult(file, len(moves), bytes_moved, written, size_before, truncate_at)

    # ------------------------------------------------------------------ recovery

    def _recover_clean(self, data: bytes) -> None:
        state = decode_clean(data)
        if state.last_v1_file != last_v1_file_on_disk(self.directory):
            raise MixedStoreError("clean-shutdown file's last_v1_file does not match the files")
        self.last_v1_file = state.last_v1_file
        self._load_file_sizes()
        for e in state.entries:
            info = self.files.get(e.file)
            if info is None:
                raise MixedStoreError(f"clean-shutdown file names missing file {e.file}")
            self.index[e.msg_id] = Location(e.ref_count, e.file, e.offset, e.total_size)
            info.msg_ids.add(e.msg_id)
            info.live_bytes += e.total_size

    def _load_file_sizes(self) -> None:
        for ext in (V1_EXT, V2_EXT):
            for file in list_segments(self.directory, ext):
                self.files[file] = FileInfo(os.stat(self.directory / f"{file}{ext}").st_size)

    def _recover_dirty(self) -> None:
        """Rebuild the index and ``last_v1_file`` by scanning: v2 files first (a message in
        both a v1 file and a v2 file was migrated: the v2 copy wins), then v1 files with
        liveness from RabbitMQ's index when it was written at a clean shutdown."""
        self.last_v1_file = last_v1_file_on_disk(self.directory)
        self._load_file_sizes()
        duplicates = 0
        for file in list_segments(self.directory, V2_EXT):
            duplicates += self._recover_v2_file(file)
        rabbit = load_rabbit_index(self.directory)
        self.v1_liveness_known = rabbit is not None
        for file in list_segments(self.directory, V1_EXT):
            self._recover_v1_file(file, rabbit)
        log.info(
            "msgstore_recovered_dirty",
            directory=str(self.directory),
            messages=len(self.index),
            duplicates_dropped=duplicates,
            last_v1_file=self.last_v1_file,
            v1_liveness="rabbitmq_index" if rabbit is not None else "unknown",
        )

    def _recover_v2_file(self, file: int) -> int:
        fd = self._fd(file)
        try:
            result = scan_v2_fd(fd)
        except fmt.MsgStoreFormatError as exc:
            raise CorruptSegmentError(f"{self.path_of(file)}: {exc}") from exc
        info = self.files[file]
        duplicates = 0
        for rec in result.records:
            if rec.msg_id is None:
                continue
            if rec.msg_id in self.index:
                # a copy left by a crash during compaction: the first copy is kept and this
                # one becomes a hole so it can never come back
                os.pwrite(fd, fmt.hole_marker(rec.size), rec.position)
                duplicates += 1
                continue
            self.index[rec.msg_id] = Location(1, file, rec.position, rec.size)
            info.msg_ids.add(rec.msg_id)
            info.live_bytes += rec.size
        if result.end < result.file_size or result.end < fmt.HEADER_SIZE:
            end = max(result.end, 0)
            if end < fmt.HEADER_SIZE:
                os.ftruncate(fd, 0)
                os.pwrite(fd, fmt.encode_header(), 0)
                end = fmt.HEADER_SIZE
            else:
                os.ftruncate(fd, end)
            log.warning(
                "msgstore_torn_tail_dropped",
                file=str(self.path_of(file)),
                position=end,
                bytes=result.file_size - end,
            )
            info.size = end
        if duplicates or result.end < result.file_size:
            os.fsync(fd)
        self._step("recover.file_scanned")
        return duplicates

    def _recover_v1_file(self, file: int, rabbit: dict[bytes, MsgLocation] | None) -> None:
        result = scan_v1_fd(self._fd(file))
        info = self.files[file]
        for rec in result.records:
            msg_id = rec.msg_id
            assert msg_id is not None
            if msg_id in self.index:
                continue
            ref_count = 1
            if rabbit is not None:
                loc = rabbit.get(msg_id)
                if (
                    loc is None
                    or loc.ref_count <= 0
                    or loc.file != file
                    or loc.offset != rec.position
                ):
                    continue
                ref_count = loc.ref_count
            self.index[msg_id] = Location(ref_count, file, rec.position, rec.size)
            info.msg_ids.add(msg_id)
            info.live_bytes += rec.size


def load_rabbit_index(directory: Path) -> dict[bytes, MsgLocation] | None:
    """RabbitMQ's index when it was written at a clean shutdown (``clean.dot`` and
    ``msg_store_index.ets`` both present and readable), else None (liveness unknown)."""
    index_path = directory / RABBIT_INDEX_FILE
    if not (directory / RABBIT_CLEAN_FILE).exists() or not index_path.exists():
        return None
    try:
        return read_msg_locations(index_path.read_bytes())
    except EtsFileError as exc:
        log.warning("msgstore_rabbit_index_unreadable", file=str(index_path), error=str(exc))
        return None


def plan_compaction(
    live: list[tuple[int, int, bytes]], start: int
) -> tuple[list[tuple[int, int, bytes, int]], int]:
    """RabbitMQ's compaction plan: move the last message into the first hole before it that
    fits, repeatedly. ``live`` is (offset, size, msg id) by offset; returns the moves
    (source, size, msg id, destination) and the size to truncate the file to."""
    moves: list[tuple[int, int, bytes, int]] = []
    if not live:
        return moves, start
    offset = start
    s, e = 0, len(live) - 1
    while True:
        s_off, s_size, _ = live[s]
        e_off, e_size, e_id = live[e]
        if e_size <= s_off - offset:
            moves.append((e_off, e_size, e_id, offset))
            if s == e:
                return moves, offset + e_size
            offset += e_size
            e -= 1
        elif s == e:
            return moves, s_off + s_size
        else:
            offset = s_off + s_size
            s += 1


def original_gaps(
    live: list[tuple[int, int, bytes]], start: int, truncate_at: int
) -> list[tuple[int, int]]:
    """Gaps between live records as laid out before compaction that begin before
    ``truncate_at`` (a gap may end past it: the last destination gap runs up to the next
    original record)."""
    gaps = []
    cursor = start
    for offset, size, _m in live:
        if cursor >= truncate_at:
            break
        if offset > cursor:
            gaps.append((cursor, offset))
        cursor = offset + size
    return gaps


def moves_per_hole(
    moves: list[tuple[int, int, bytes, int]], holes: list[tuple[int, int]]
) -> list[tuple[int, int, list[tuple[int, int, bytes, int]]]]:
    """Moves grouped by the hole they land in, each group contiguous from the hole start."""
    by_dst = sorted(moves, key=lambda mv: mv[3])
    groups = []
    i = 0
    for start, end in holes:
        group = []
        while i < len(by_dst) and by_dst[i][3] < end:
            group.append(by_dst[i])
            i += 1
        if group:
            if group[0][3] != start:
                raise AssertionError(f"compaction plan: move to {group[0][3]} not at hole {start}")
            groups.append((start, end, group))
    if i != len(by_dst):
        raise AssertionError("compaction plan: a move lands outside every hole")
    return groups
