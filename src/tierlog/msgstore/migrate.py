"""The N+X migration: every remaining v1 ``.rdq`` file becomes a fresh v2 ``.sqs`` file.

Per v1 file, in ascending order: its live records are re-encoded as checksummed v2 records
into ``<n>.sqs.tmp`` (``n`` = the next unused file number) and fsynced; the file is renamed
to ``<n>.sqs`` and the directory fsynced; the index entries are switched to it; the ``.rdq``
is deleted and the directory fsynced; ``last_v1_file`` becomes the highest remaining
``.rdq`` (none at the end). A crash at any step recovers to a consistent store: a leftover
``.tmp`` is never referenced and is deleted on open; a message present in both the ``.rdq``
and the new ``.sqs`` is taken from the ``.sqs`` (dirty recovery scans v2 first), and the
next migration finds nothing left to copy from that ``.rdq`` and deletes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tierlog.formats import msgstore as fmt
from tierlog.logs import get_logger
from tierlog.msgstore.files import TMP_SUFFIX, V1_EXT, V2_EXT, fsync_dir, list_segments
from tierlog.msgstore.index import FileInfo
from tierlog.msgstore.port import StoreFiles

log = get_logger(__name__)

MIGRATION_STEPS = (
    "migrate.tmp_written",
    "migrate.renamed",
    "migrate.index_swapped",
    "migrate.v1_deleted",
)
"""Crash points of migrating one v1 file, in order."""


@dataclass(frozen=True)
class MigrationResult:
    v1_files: int
    messages: int
    bytes_read: int
    bytes_written: int


def migrate_v1(store: StoreFiles) -> MigrationResult:
    """Migrate every ``.rdq`` file of ``store`` to v2 and set ``last_v1_file`` to none."""
    files = messages = bytes_read = bytes_written = 0
    for v1_file in list_segments(store.directory, V1_EXT):
        moved, read, written = _migrate_one(store, v1_file)
        files += 1
        messages += moved
        bytes_read += read
        bytes_written += written
    store.last_v1_file = None
    log.info(
        "msgstore_migrated",
        directory=str(store.directory),
        v1_files=files,
        messages=messages,
        bytes_written=bytes_written,
    )
    return MigrationResult(files, messages, bytes_read, bytes_written)


def _migrate_one(store: StoreFiles, v1_file: int) -> tuple[int, int, int]:
    directory = store.directory
    info = store.files.get(v1_file)
    live = sorted(
        ((store.index[m].offset, store.index[m].size, m) for m in (info.msg_ids if info else ())),
    )
    v1_fd = os.open(directory / f"{v1_file}{V1_EXT}", os.O_RDONLY)
    new_file = store.next_file_number()
    placed: list[tuple[bytes, int, int]] = []
    read = written = 0
    try:
        if live:
            parts = [fmt.encode_header()]
            position = fmt.HEADER_SIZE
            for offset, size, msg_id in live:
                data = os.pread(v1_fd, size, offset)
                read += len(data)
                _, body = fmt.decode_v1_record(data, expected_id=msg_id)
                record = fmt.encode_message(msg_id, body)
                parts.append(record)
                placed.append((msg_id, position, len(record)))
                position += len(record)
            blob = b"".join(parts)
            tmp = directory / f"{new_file}{V2_EXT}{TMP_SUFFIX}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)
            written = len(blob)
            store.crash_point("migrate.tmp_written")
            os.rename(tmp, directory / f"{new_file}{V2_EXT}")
            fsync_dir(directory)
            store.crash_point("migrate.renamed")
            new_info = FileInfo(len(blob))
            for msg_id, position, size in placed:
                loc = store.index[msg_id]
                loc.file, loc.offset, loc.size = new_file, position, size
                new_info.msg_ids.add(msg_id)
                new_info.live_bytes += size
            store.files[new_file] = new_info
            if store.current_file is None:
                store.current_file = new_file
            store.crash_point("migrate.index_swapped")
    finally:
        os.close(v1_fd)
    store.close_fd(v1_file)
    os.unlink(directory / f"{v1_file}{V1_EXT}")
    fsync_dir(directory)
    store.files.pop(v1_file, None)
    remaining = list_segments(directory, V1_EXT)
    store.last_v1_file = remaining[-1] if remaining else None
    store.crash_point("migrate.v1_deleted")
    log.info(
        "msgstore_v1_file_migrated",
        directory=str(directory),
        v1_file=v1_file,
        v2_file=new_file if live else None,
        messages=len(live),
    )
    return len(live), read, written
