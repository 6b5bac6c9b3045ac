"""Where a given chunk of a local log ends, and the last user chunk up to it: what a
cluster node needs to turn a commit chunk id (the cluster commit) into the commit point
readers attach at, and into the answers ``next`` / ``last`` resolve to. Index lookups
and one header read; no chunk data is read.
"""

from __future__ import annotations

import bisect
import os

from tierlog.formats.chunk import HEADER_SIZE, ChunkType, decode_header
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import (
    INDEX_RECORD_SIZE,
    decode_index_record,
    index_record_count,
    index_record_position,
)
from tierlog.log.commit_point import CommitPoint
from tierlog.log.reader import LogSource
from tierlog.log.segment_files import IndexView, SegmentRef, pread_exact

NO_CHUNK = -1


def chunk_end(source: LogSource, chunk_id: int) -> CommitPoint | None:
    """The commit point that ends right after local chunk ``chunk_id`` (its segment, the
    file position after it, the offset after it); None when the log does not hold a
    chunk with that id. A binary search of one index file, one header read."""
    refs = source.segment_refs()
    i = bisect.bisect_right([r.first_offset for r in refs], chunk_id) - 1
    if i < 0:
        return None
    ref = refs[i]
    try:
        position = _index_position(ref, chunk_id)
        if position is None:
            return None
        fd = os.open(ref.segment_path, os.O_RDONLY)
        try:
            header = decode_header(pread_exact(fd, HEADER_SIZE, position))
        finally:
            os.close(fd)
    except (OSError, FormatError):
        return None
    if header.chunk_id != chunk_id:
        return None
    return CommitPoint(chunk_id, header.next_offset, ref.first_offset, position + header.total_size)


def _index_position(ref: SegmentRef, chunk_id: int) -> int | None:
    """File position of chunk ``chunk_id`` in the segment (its index record), or None."""
    fd = os.open(ref.index_path, os.O_RDONLY)
    try:
        count = index_record_count(os.fstat(fd).st_size)
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            found = int.from_bytes(pread_exact(fd, 8, index_record_position(mid)), "big")
            if found < chunk_id:
                lo = mid + 1
            else:
                hi = mid
        if lo >= count:
            return None
        raw = pread_exact(fd, INDEX_RECORD_SIZE, index_record_position(lo))
        if len(raw) < INDEX_RECORD_SIZE:
            return None
        record = decode_index_record(raw)
        return record.position if record.chunk_id == chunk_id else None
    finally:
        os.close(fd)


def last_user_chunk(source: LogSource, through: int) -> int:
    """The id of the last user chunk at or before chunk ``through`` held locally
    (``NO_CHUNK`` when there is none): where ``last`` attaches."""
    for ref in reversed(source.segment_refs()):
        if ref.first_offset > through:
            continue
        try:
            index = IndexView.load(ref.index_path)
        except (OSError, FormatError):
            return NO_CHUNK
        for n in range(index.limit_to(through) - 1, -1, -1):
            record = index.record(n)
            if record.chunk_type == ChunkType.USER:
                return int(record.chunk_id)
    return NO_CHUNK
