"""Cutting a log's suffix on disk, crash-safely, through an intent file.

A replica cuts the uncommitted divergent suffix its new leader does not hold. The cut
touches several files (later segments deleted, the kept segment and its index cut
short), so it is made atomic by a write-ahead intent: ``truncate.intent`` (written to a
temporary name, fsynced, renamed, directory fsynced) names the last chunk id to keep;
then the files are cut; then the intent is removed. Recovery completes a pending intent
before it looks at the segments (``complete_pending_truncation``), and the cut is
idempotent, so a crash at any step leaves the old log (intent not yet durable) or the
new one (intent durable), never a mix. Intent layout (16 bytes, big-endian)::

    "TLTR" | keep-through chunk id i64 (-1: cut every chunk) | CRC-32 of the first 12 u32
"""

from __future__ import annotations

import contextlib
import os
import struct

from tierlog.formats.chunk import decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_RECORD_SIZE,
    IndexRecord,
    decode_index_record,
    index_record_count,
    index_record_position,
)
from tierlog.log.errors import TruncationIntentError
from tierlog.log.segment_files import fsync_dir, list_files, pread_exact, segment_ref

INTENT_FILE = "truncate.intent"
_INTENT = struct.Struct(">4sq")
_CRC = struct.Struct(">I")
_MAGIC = b"TLTR"


def intent_path(stream_dir: str) -> str:
    return os.path.join(stream_dir, INTENT_FILE)


def write_intent(stream_dir: str, keep_through: int) -> None:
    body = _INTENT.pack(_MAGIC, keep_through)
    raw = body + _CRC.pack(crc32(body))
    path = intent_path(stream_dir)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if os.write(fd, raw) != len(raw):
            raise OSError(f"{tmp}: short write")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(stream_dir)


def read_intent(stream_dir: str) -> int | None:
    """The pending truncation's keep-through chunk id, or None."""
    path = intent_path(stream_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read(64)
    except FileNotFoundError:
        return None
    if len(raw) != _INTENT.size + _CRC.size:
        raise TruncationIntentError(f"{path}: {len(raw)} bytes")
    magic, keep_through = _INTENT.unpack_from(raw)
    (crc,) = _CRC.unpack_from(raw, _INTENT.size)
    if magic != _MAGIC or crc != crc32(raw[: _INTENT.size]) or keep_through < -1:
        raise TruncationIntentError(f"{path}: does not decode")
    return int(keep_through)


def remove_intent(stream_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(intent_path(stream_dir))
    fsync_dir(stream_dir)


def complete_pending_truncation(stream_dir: str) -> int | None:
    """Finish a truncation a crash interrupted (recovery calls this first); returns the
    keep-through chunk id it applied, or None when nothing was pending."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(intent_path(stream_dir) + ".tmp")  # never renamed: never decided
    keep_through = read_intent(stream_dir)
    if keep_through is None:
        return None
    cut_files(stream_dir, keep_through)
    remove_intent(stream_dir)
    return keep_through


def cut_files(stream_dir: str, keep_through: int) -> None:
    """Remove every chunk with an id above ``keep_through`` from the segment files:
    later segments are deleted (newest first), the segment holding ``keep_through`` and
    its index are cut after it. The first segment always stays (emptied if need be), so
    the directory remains a stream. Idempotent: safe to repeat after a crash."""
    _, segments, indexes = list_files(stream_dir)
    offsets = sorted(segments)
    changed = False
    for offset in sorted(segments | indexes, reverse=True):
        if offset > keep_through and offsets and offset != offsets[0]:
            ref = segment_ref(stream_dir, offset)
            for path in (ref.index_path, ref.segment_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    changed = True
    if changed:
        fsync_dir(stream_dir)
    kept = [o for o in offsets if o <= keep_through] or offsets[:1]
    if kept:
        _cut_segment(stream_dir, kept[-1], keep_through)


def _cut_segment(stream_dir: str, first_offset: int, keep_through: int) -> None:
    """Cut one segment (and its index) after chunk ``keep_through``. The cut position
    comes from the index when it still has the first cut chunk's record, else from the
    last kept chunk's header (the index may already be cut by an interrupted attempt)."""
    ref = segment_ref(stream_dir, first_offset)
    idx = os.open(ref.index_path, os.O_RDWR)
    seg = os.open(ref.segment_path, os.O_RDWR)
    try:
        count = index_record_count(os.fstat(idx).st_size)
        keep = _records_through(idx, count, keep_through)
        if keep < count:
            cut_at = _record(idx, keep).position
        elif keep == 0:
            cut_at = FILE_HEADER_SIZE
        else:
            last = _record(idx, keep - 1)
            try:
                header = decode_header(pread_exact(seg, 48, last.position))
                cut_at = last.position + header.total_size
            except FormatError:
                cut_at = os.fstat(seg).st_size  # torn after the kept chunk: recovery cuts it
        if os.fstat(seg).st_size > cut_at:
            os.ftruncate(seg, cut_at)
            os.fsync(seg)
        index_end = index_record_position(keep)
        if os.fstat(idx).st_size != index_end:
            os.ftruncate(idx, index_end)
            os.fsync(idx)
    finally:
        os.close(seg)
        os.close(idx)


def _record(fd: int, n: int) -> IndexRecord:
    return decode_index_record(pread_exact(fd, INDEX_RECORD_SIZE, index_record_position(n)))


def _records_through(fd: int, count: int, keep_through: int) -> int:
    """How many leading index records have a chunk id <= ``keep_through`` (binary
    search with one pread per probe)."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        if _record(fd, mid).chunk_id <= keep_through:
            lo = mid + 1
        else:
            hi = mid
    return lo
