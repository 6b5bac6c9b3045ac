"""Damaged local files: moved aside (never deleted) or patched with a healthy copy.

A segment that recovery may not cut is either rewritten with the identical bytes of a
healthy copy (chunks are verbatim in the remote tier) or moved aside with its index as
``*.damaged`` for the operator; a stream directory holding a moved-aside segment stays
refused, so its offsets can never be handed out again.

A chunk of the *last* segment whose own bytes are damaged (its header continues the log,
its data does not validate), with no healthy copy, costs less: ``cut_damaged_tail`` copies
the segment aside (``*.cut-<offset>.damaged``), cuts the live file before the damaged
chunk and records the lost range in ``LOST_RANGE_FILE``. Earlier offsets stay readable;
the log refuses reads from the lost range on and every append (``DamagedRangeError``),
because its end is not reliably known and new chunks would reuse its offsets.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from tierlog.formats.errors import FormatError
from tierlog.log.errors import DamagedRangeError, DamagedSegmentError
from tierlog.log.segment_files import fsync_dir, list_files, read_header_at, scan_segment
from tierlog.log.segments import pwrite_all

DAMAGED_SUFFIX = ".damaged"
"""Suffix of a segment or index file that recovery moved aside: kept for the operator,
never read as part of the log."""

LOST_RANGE_FILE = "lost-range.json"
"""Records offsets lost with a damaged chunk of the last segment (``cut_damaged_tail``)."""


@dataclass(frozen=True)
class LostRange:
    """Offsets ``[first_offset, ...)`` are lost; trustworthy chunks resumed at
    ``end_offset`` in the damaged file (None: not known). ``copy`` is the moved-aside file."""

    first_offset: int
    end_offset: int | None
    copy: str

    def describe(self) -> str:
        end = "end" if self.end_offset is None else str(self.end_offset)
        return (
            f"offsets [{self.first_offset}, {end}) were lost: a chunk's data was damaged on "
            f"disk and no healthy copy existed (kept aside as {self.copy}); earlier offsets "
            "stay readable, appends are refused until an operator restores or removes it"
        )

    def error(self, what: str) -> DamagedRangeError:
        """The typed refusal of a read or append that would touch the range."""
        return DamagedRangeError(
            f"{what}: {self.describe()}", first_offset=self.first_offset, end_offset=self.end_offset
        )


def read_lost_range(stream_dir: str) -> LostRange | None:
    """The stream directory's lost range, if a damaged chunk was cut away."""
    try:
        with open(os.path.join(stream_dir, LOST_RANGE_FILE), "rb") as f:
            raw = json.loads(f.read())
        end = raw["end_offset"]
        return LostRange(int(raw["first_offset"]), None if end is None else int(end), raw["copy"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        # a damaged record of a loss must not reopen the range: refuse the whole stream
        raise DamagedRangeError(
            f"{stream_dir}/{LOST_RANGE_FILE} is unreadable ({exc!r}); the stream stays "
            "refused until the operator repairs or removes it",
            first_offset=0,
            end_offset=None,
        ) from exc


def cut_damaged_tail(error: DamagedSegmentError) -> LostRange | None:
    """Cut the last segment before a chunk whose own bytes are damaged, keeping a copy.

    Only for damage the scan met at ``error.position`` in the stream's last segment whose
    chunk header there still continues the log (so the damage is the chunk's own data,
    CRC or entries): the lost range then starts at that chunk. A header that breaks
    continuity implicates its predecessor too (``recovery._scan_next``), which is cut as
    well. Anything else (a sealed segment, a bad segment header, an index the segment
    disagrees with, a second loss) returns None: the caller refuses the stream as before.
    Order: record the range, copy the file aside, then cut, so a crash at any step either
    repeats the same cut or finds it done; nothing is deleted.
    """
    seg_path = error.segment_path
    stream_dir = os.path.dirname(seg_path)
    _, segments, _ = list_files(stream_dir)
    if not segments or max(segments) != error.segment_first_offset:
        return None
    scan = scan_segment(seg_path, error.segment_first_offset, True)
    if not scan.header_ok or scan.damage is None or scan.valid_end != error.position:
        return None
    prev = scan.chunks[-1] if scan.chunks else None
    expected = prev.next_offset if prev is not None else error.segment_first_offset
    cut, first = scan.valid_end, expected
    fd = os.open(seg_path, os.O_RDONLY)
    try:
        header = read_header_at(fd, scan.valid_end)
        continues = header.chunk_id == expected and (
            prev is None or (header.epoch >= prev.epoch and header.timestamp >= prev.timestamp)
        )
    except (FormatError, OSError):
        continues = False
    finally:
        os.close(fd)
    if not continues and prev is not None:
        cut, first = prev.position, prev.chunk_id
    base = seg_path[: -len(".segment")]
    copy = f"{seg_path}.cut-{first}{DAMAGED_SUFFIX}"
    lost = LostRange(first, error.end_offset, os.path.basename(copy))
    earlier = read_lost_range(stream_dir)
    if earlier is not None and earlier != lost:
        return None  # a second loss: refuse rather than overwrite the first record
    _write_durably(
        os.path.join(stream_dir, LOST_RANGE_FILE),
        json.dumps(
            {"first_offset": first, "end_offset": error.end_offset, "copy": lost.copy}
        ).encode(),
    )
    for path, target in ((seg_path, copy), (base + ".index", f"{base}.index.cut-{first}")):
        if os.path.exists(path):
            tmp = target + ".tmp"
            shutil.copyfile(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target if target.endswith(DAMAGED_SUFFIX) else target + DAMAGED_SUFFIX)
    fsync_dir(stream_dir)
    fd = os.open(seg_path, os.O_RDWR)
    try:
        os.ftruncate(fd, cut)  # the index is rebuilt from the cut segment on open
        os.fsync(fd)
    finally:
        os.close(fd)
    return lost


def _write_durably(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def refuse_quarantined(stream_dir: str) -> None:
    for name in sorted(os.listdir(stream_dir)):
        if name.endswith(".segment" + DAMAGED_SUFFIX):
            path = os.path.join(stream_dir, name)
            raise DamagedSegmentError(
                f"{path}: a damaged segment was moved aside; the stream stays refused until "
                "it is restored or the operator removes it",
                segment_path=path,
                segment_first_offset=int(name[:20]),
                position=0,
                first_offset=int(name[:20]),
                end_offset=None,
            )


def quarantine(error: DamagedSegmentError) -> list[str]:
    """Move a damaged segment and its index aside (never deleted); the new paths."""
    moved = []
    base = error.segment_path[: -len(".segment")]
    for path in (error.segment_path, base + ".index"):
        if os.path.exists(path):
            os.replace(path, path + DAMAGED_SUFFIX)
            moved.append(path + DAMAGED_SUFFIX)
    fsync_dir(os.path.dirname(error.segment_path))
    return moved


def patch_segment(segment_path: str, position: int, data: bytes | memoryview) -> None:
    """Overwrite ``data`` at ``position`` of a segment with the identical bytes of a healthy
    copy (chunks are verbatim in the remote tier), durably; recovery then rebuilds the
    index from the repaired segment."""
    fd = os.open(segment_path, os.O_WRONLY)
    try:
        pwrite_all(fd, [data], position)  # short writes continue, big ones are split
        os.fsync(fd)
    finally:
        os.close(fd)
