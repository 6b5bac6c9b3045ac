"""Compaction of a v2 segment: messages move from the end of the file into earlier holes,
gaps stay holes (a 5-byte header, never a zero-fill), the file is truncated.

The plan is RabbitMQ's (``rabbit_msg_store:do_compact_file``); the write order makes every
step crash-safe (``compact_file``). ``COMPACTION_STEPS`` names the crash points.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tierlog.formats import msgstore as fmt
from tierlog.formats.errors import TornRecordError
from tierlog.logs import get_logger
from tierlog.msgstore.errors import MixedStoreError
from tierlog.msgstore.files import file_format
from tierlog.msgstore.port import StoreFiles

log = get_logger(__name__)

COMPACTION_STEPS = (
    "compact.fill_holes",
    "compact.fsync_fill",
    "compact.flip_headers",
    "compact.fsync_headers",
    "compact.index_updated",
    "compact.truncate",
)
"""Crash points of one compaction, in order."""


@dataclass(frozen=True)
class CompactionResult:
    file: int
    moved: int
    bytes_moved: int
    bytes_written: int
    size_before: int
    size_after: int


def compact_file(store: StoreFiles, file: int) -> CompactionResult:
    """Move messages from the end of a v2 file into earlier holes, then truncate.

    Every gap is already one hole on disk (removals merge holes), so the inside of a gap
    is never interpreted. Steps (each leaves a file that scans to the same live messages,
    whichever unsynced writes a crash loses):
    1. per destination gap, one ``pwrite`` of the moved records minus their first
       5 bytes plus the marker of what remains of the gap: all inside the hole;
    2. fsync; 3. per gap, a 5-byte ``pwrite`` that turns the hole's header into the
       first moved record's header, after which a scan sees the moved copies first (a
       scan keeps the first copy of a msg id, so the originals at the end are ignored);
    4. fsync; 5. index update; 6. truncate after the last kept record (not fsynced:
       a lost truncation only leaves second copies that recovery turns into holes).
    No gap is ever zero-filled.
    """
    if file_format(file, store.last_v1_file) != "v2":
        raise MixedStoreError(f"file {file} is a v1 file: v1 files are never written")
    info = store.files[file]
    fd = store.write_fd(file)
    live = sorted(
        ((store.index[m].offset, store.index[m].size, m) for m in info.msg_ids),
        key=lambda t: t[0],
    )
    moves, truncate_at = plan_compaction(live, fmt.HEADER_SIZE)
    size_before = info.size
    written = 0
    holes = original_gaps(live, fmt.HEADER_SIZE, truncate_at)
    targets = moves_per_hole(moves, holes)
    # 1. fill each destination hole's inside: moved records (minus the first 5 bytes of
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
                raise TornRecordError(f"{store.path_of(file)}: record at {src} cut off")
            at += size
        view[moved:] = tail
        bytes_moved += moved
        written += os.pwrite(fd, view[fmt.HOLE_MIN :], start + fmt.HOLE_MIN)
        flips.append((start, bytes(view[: fmt.HOLE_MIN])))
    store.crash_point("compact.fill_holes")
    if flips:
        os.fsync(fd)
    store.crash_point("compact.fsync_fill")
    # 3. switch each hole header to its first moved record's header
    for start, head in flips:
        os.pwrite(fd, head, start)
        written += len(head)
    store.crash_point("compact.flip_headers")
    os.fsync(fd)
    store.crash_point("compact.fsync_headers")
    for _src, _size, msg_id, dst in moves:
        store.index[msg_id].offset = dst
    store.crash_point("compact.index_updated")
    # Not fsynced here (RabbitMQ does not sync it either): a truncation lost in a crash
    # leaves the moved originals past the end, second copies that recovery turns into
    # holes. It is made durable before the file's next write (``write_fd``).
    os.ftruncate(fd, truncate_at)
    info.size = truncate_at
    info.truncate_unsynced = True
    info.set_holes(
        [(store.index[m].offset, store.index[m].size) for m in info.msg_ids],
        fmt.HEADER_SIZE,
        truncate_at,
    )
    store.crash_point("compact.truncate")
    store.bytes_written += written
    log.info(
        "msgstore_compacted",
        directory=str(store.directory),
        file=file,
        moved=len(moves),
        size_before=size_before,
        size_after=truncate_at,
    )
    return CompactionResult(file, len(moves), bytes_moved, written, size_before, truncate_at)


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
