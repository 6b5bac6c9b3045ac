"""Finding a chunk in one tier without reading chunk bytes: which chunk holds an offset,
which is the last user chunk, which is the first at a timestamp, where local data resumes.

Attaching a reader (an offset spec to a chunk id) and choosing a tier both need these
answers, and both must get them from indexes only: the local segments' index files and
the remote fragments' indexes. Kept apart from the reader so the lookups stay plain
functions of (log or manifest, offset) that say in one place what each tier holds.
"""

from __future__ import annotations

import bisect
import os

import numpy as np

from tierlog.formats.chunk import HEADER_SIZE, ChunkType, decode_header
from tierlog.formats.errors import FormatError
from tierlog.log.reader import LogSource
from tierlog.log.segment_files import IndexView, SegmentRef, pread_exact
from tierlog.read.errors import OffsetUnavailableError
from tierlog.read.manifest_source import ManifestSource
from tierlog.remote.errors import OffsetBeyondEndError
from tierlog.remote.manifest_tree import ManifestTree

# -- the local tier -----------------------------------------------------------------------


def local_gap_resumes(local: LogSource, n: int) -> int | None:
    """Where local data resumes when offset ``n`` falls in a gap between local segments
    (the log was restarted past the remote tail): local segments are a set of ranges,
    and the offsets between them are served by the remote tier or not at all."""
    refs = local.segment_refs()
    i = bisect.bisect_right([r.first_offset for r in refs], n) - 1
    if i < 0 or i + 1 >= len(refs):
        return None
    end = _segment_end(refs[i])
    if end is None or n < end:
        return None
    return refs[i + 1].first_offset


def _segment_end(ref: SegmentRef) -> int | None:
    """The offset after a sealed segment's last chunk (None when it cannot be read)."""
    try:
        index = IndexView.load(ref.index_path)
        if index.count == 0:
            return ref.first_offset
        last = index.record(index.count - 1)
        fd = os.open(ref.segment_path, os.O_RDONLY)
        try:
            header = decode_header(pread_exact(fd, HEADER_SIZE, last.position))
        finally:
            os.close(fd)
    except (OSError, FormatError):
        return None
    return header.next_offset


def local_chunk_containing(local: LogSource | None, n: int) -> int | None:
    """The committed local chunk holding offset ``n`` (None: not held locally)."""
    if local is None:
        return None
    refs = local.segment_refs()
    commit = local.commit_point()
    if not refs[0].first_offset <= n < commit.next_offset:
        return None
    ref = [r for r in refs if r.first_offset <= n][-1]
    if local_gap_resumes(local, n) is not None:
        return None  # between local segments: only the remote tier holds it
    try:
        index = IndexView.load(ref.index_path)
    except FileNotFoundError:
        return None
    below = index.last_at_or_below(n, index.limit_to(commit.chunk_id))
    return ref.first_offset if below is None else below.chunk_id


def local_last_user(local: LogSource | None, first: int) -> int | None:
    """The last committed local user chunk at or after ``first``."""
    if local is None:
        return None
    commit = local.commit_point()
    for ref in reversed(local.segment_refs()):
        try:
            index = IndexView.load(ref.index_path)
        except FileNotFoundError:
            return None
        for n in range(index.limit_to(commit.chunk_id) - 1, -1, -1):
            record = index.record(n)
            if record.chunk_id < first:
                return None
            if record.chunk_type == ChunkType.USER:
                return record.chunk_id
    return None


def local_first_at(local: LogSource | None, ts: int, first: int) -> int | None:
    """The first committed local chunk with a timestamp ``>= ts`` (not below ``first``)."""
    if local is None:
        return None
    commit = local.commit_point()
    for ref in local.segment_refs():
        try:
            index = IndexView.load(ref.index_path)
        except FileNotFoundError:
            continue
        count = index.limit_to(commit.chunk_id)
        if count and index.record(count - 1).timestamp >= ts:
            found = index.first_with_timestamp(ts, count)
            assert found is not None
            return max(found.chunk_id, first)
    return None


# -- the remote tier ----------------------------------------------------------------------


def _remote_tree(manifest: ManifestSource, offset: int) -> ManifestTree:
    tree = manifest.tree()
    return manifest.refresh() if offset >= tree.next_offset else tree


def remote_chunk_containing(manifest: ManifestSource | None, n: int) -> int:
    """The remote chunk holding offset ``n``; ``OffsetUnavailableError`` if none does."""
    if manifest is None:
        raise OffsetUnavailableError(f"offset {n} is not held locally and there is no manifest")
    tree = _remote_tree(manifest, n)
    try:
        loc = manifest.locate_offset(tree, n)
    except OffsetBeyondEndError as exc:
        raise OffsetUnavailableError(f"offset {n} is in neither tier") from exc
    index = manifest.fragment_index(loc)
    i = index.find_offset(n)
    assert i is not None
    return int(index.records["chunk_id"][i])


def remote_last_user(manifest: ManifestSource | None, local_first: int | None) -> int | None:
    """The last remote user chunk below ``local_first`` (the whole tier when None)."""
    if manifest is None:
        return None
    tree = manifest.tree()
    top = tree.next_offset if local_first is None else min(tree.next_offset, local_first)
    at = top - 1
    while at >= tree.first_offset and not tree.is_empty:
        loc = manifest.locate_offset(tree, at)
        index = manifest.fragment_index(loc)
        records = index.records
        users = np.nonzero((records["chunk_type"] == ChunkType.USER) & (records["chunk_id"] <= at))[
            0
        ]
        if len(users):
            return int(records["chunk_id"][users[-1]])
        at = loc.entry.first_offset - 1
    return None


def remote_first_at(manifest: ManifestSource, ts: int) -> int | None:
    """The first remote chunk with a timestamp ``>= ts`` (None: none in the tier)."""
    tree = manifest.tree()
    if tree.is_empty:
        return None
    loc = manifest.locate_timestamp(tree, ts)
    if loc is None:
        return None
    index = manifest.fragment_index(loc)
    i = index.find_timestamp(ts)
    if i is None:
        return loc.next_offset if loc.next_offset < tree.next_offset else None
    return int(index.records["chunk_id"][i])
