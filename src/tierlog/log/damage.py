"""Damaged local files: moved aside (never deleted) or patched with a healthy copy.

A segment that recovery may not cut is either rewritten with the identical bytes of a
healthy copy (chunks are verbatim in the remote tier) or moved aside with its index as
``*.damaged`` for the operator; a stream directory holding a moved-aside segment stays
refused, so its offsets can never be handed out again.
"""

from __future__ import annotations

import os

from tierlog.log.errors import DamagedSegmentError
from tierlog.log.segment_files import fsync_dir
from tierlog.log.segments import pwrite_all

DAMAGED_SUFFIX = ".damaged"
"""Suffix of a segment or index file that recovery moved aside: kept for the operator,
never read as part of the log."""


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
