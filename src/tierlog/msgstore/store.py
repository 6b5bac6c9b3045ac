"""The message store: append, read by msg id, ref-counted remove, compaction, recovery.

Files are numbered segments in one directory; ``last_v1_file`` says which numbers are
RabbitMQ v1 ``.rdq`` files (read in place, never written) and which are v2 ``.sqs`` files.
New messages are appended to the newest v2 file as ``MESSAGE_WITH_CHECKSUM`` records.

Removing a message's last reference writes one 5-byte HOLE header over its record merged
with the holes next to it (one ``pwrite``, no read), so a file always describes itself
(dirty recovery is a scan that finds exactly the live messages) and every gap is one hole.
Compaction (``tierlog.msgstore.compaction``) moves messages from the end of a file into
earlier holes and truncates; each step leaves a file that scans to the same contents.
A clean close writes the index and ``last_v1_file`` to the clean-shutdown file, which the
next open reads and deletes.

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
from tierlog.formats.errors import CleanFileError, TornRecordError
from tierlog.formats.msgstore_clean import CleanEntry, encode_clean
from tierlog.logs import get_logger
from tierlog.msgstore.compaction import CompactionResult, compact_file
from tierlog.msgstore.errors import (
    MixedStoreError,
    MsgNotFoundError,
    MsgStoreConfigError,
    NotADirectoryStoreError,
    StoreClosedError,
)
from tierlog.msgstore.files import (
    CLEAN_FILE,
    TMP_SUFFIX,
    V1_EXT,
    V2_EXT,
    file_format,
    filenum_to_name,
    fsync_dir,
    last_v1_file_on_disk,
    list_segments,
)
from tierlog.msgstore.index import FileInfo, Location
from tierlog.msgstore.recovery import recover_clean, recover_dirty

log = get_logger(__name__)


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
                    recover_clean(store, clean.read_bytes())
                    store.recovered_clean = True
                except (CleanFileError, MixedStoreError) as exc:
                    log.warning("msgstore_clean_file_rejected", directory=str(path), error=str(exc))
                    store._reset()
                os.unlink(clean)
                fsync_dir(path)
            if not store.recovered_clean:
                recover_dirty(store)
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

    def crash_point(self, name: str) -> None:
        if self.crash_hook is not None:
            self.crash_hook(name)

    # ------------------------------------------------------------------ files

    def path_of(self, file: int) -> Path:
        return self.directory / filenum_to_name(file, self.last_v1_file)

    def file_fd(self, file: int) -> int:
        fd = self._fds.get(file)
        if fd is None:
            if self._closed:
                raise StoreClosedError(f"message store {self.directory} is closed")
            writable = file_format(file, self.last_v1_file) == "v2"
            fd = os.open(self.path_of(file), os.O_RDWR if writable else os.O_RDONLY)
            self._fds[file] = fd
        return fd

    def write_fd(self, file: int) -> int:
        """The file's descriptor for a write, after making a pending truncation durable."""
        fd = self.file_fd(file)
        info = self.files[file]
        if info.truncate_unsynced:
            os.fsync(fd)
            info.truncate_unsynced = False
        return fd

    def close_fd(self, file: int) -> None:
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
        fd = self.write_fd(file)
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
        data = os.pread(self.file_fd(loc.file), loc.size, loc.offset)
        if len(data) != loc.size:
            raise TornRecordError(
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
        info = self.files[loc.file]
        if file_format(loc.file, self.last_v1_file) == "v2":
            fd = self.write_fd(loc.file)
            # one header over the record and the holes next to it: the gap stays one hole
            start, end = info.add_hole(loc.offset, loc.offset + loc.size)
            marker = fmt.hole_marker(end - start)
            os.pwrite(fd, marker, start)
            self.bytes_written += len(marker)
            if self.config.sync_writes:
                os.fdatasync(fd)
        del self.index[msg_id]
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
        self.close_fd(file)
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

    def compact(self, file: int) -> CompactionResult:
        """Compact a v2 file (see ``tierlog.msgstore.compaction``)."""
        return compact_file(self, file)
