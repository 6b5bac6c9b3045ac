"""Opening a stream log whose recovery found damage it may not cut.

``DamagedSegmentError`` names the segment and the range; ``repair`` (the remote tier,
when it durably holds the range) rewrites it with identical bytes and recovery runs again.
When nothing repairs it and the damage is a chunk's own data in the last segment, the
log is cut before that chunk (``damage.cut_damaged_tail``: the file is copied aside, the
range recorded as lost) and opens: earlier offsets stay readable, the lost range and
appends are refused. Any other unrepaired damage moves the file aside (never deleted) and
the error is raised: the stream stays refused until an operator restores or removes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from tierlog.log.config import LogConfig
from tierlog.log.damage import LostRange, cut_damaged_tail, quarantine
from tierlog.log.errors import DamagedSegmentError
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger

log = get_logger(__name__)

Repair = Callable[[DamagedSegmentError], bool]
"""Rewrite the damaged range from a healthy copy; True if anything was rewritten."""

MAX_REPAIRS = 8


@dataclass
class DamageReport:
    """What opening met: ranges repaired, and the damage that refused the stream."""

    repaired: list[DamagedSegmentError] = field(default_factory=list)
    refused: DamagedSegmentError | None = None
    moved_aside: list[str] = field(default_factory=list)
    lost: LostRange | None = None


def open_repairing(
    path: str, config: LogConfig, repair: Repair | None, report: DamageReport | None = None
) -> StreamLog:
    """``StreamLog.open`` (adopting the on-disk epoch) with damage repaired or refused."""
    report = report if report is not None else DamageReport()
    seen: set[tuple[str, int]] = set()
    for _attempt in range(MAX_REPAIRS):
        try:
            return StreamLog.open(path, config, adopt_disk_epoch=True)
        except DamagedSegmentError as exc:
            if not os.path.exists(exc.segment_path):
                report.refused = exc
                raise  # moved aside earlier: stays refused
            where = (exc.segment_path, exc.position)
            if where not in seen and repair is not None and repair(exc):
                seen.add(where)  # the same damage again: the repair did not reach it
                report.repaired.append(exc)
                continue
            if report.lost is None:
                lost = cut_damaged_tail(exc)
                if lost is not None:
                    report.lost = lost
                    log.error(
                        "stream_range_lost_damaged",
                        file=exc.segment_path,
                        first_offset=lost.first_offset,
                        end_offset=lost.end_offset if lost.end_offset is not None else "end",
                        moved_to=lost.copy,
                        error=str(exc),
                    )
                    continue
            report.moved_aside = quarantine(exc)
            report.refused = exc
            log.error(
                "stream_refused_damaged",
                file=exc.segment_path,
                first_offset=exc.first_offset,
                end_offset=exc.end_offset if exc.end_offset is not None else "end",
                moved_to=",".join(report.moved_aside),
                error=str(exc),
            )
            raise
    raise DamagedSegmentError(
        f"{path}: damage remains after {MAX_REPAIRS} repairs from the remote tier",
        segment_path=path,
        segment_first_offset=0,
        position=0,
        first_offset=0,
        end_offset=None,
    )
