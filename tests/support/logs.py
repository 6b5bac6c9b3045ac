"""Reading back what a ``StreamLog`` holds, in a test."""

from __future__ import annotations

from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog


def log_records(log: StreamLog) -> list[bytes]:
    """Every committed record of ``log``, oldest first."""
    with log.reader(OffsetSpec.first()) as r:
        return [bytes(b) for _, b in r.records()]


def log_records_at(log: StreamLog) -> list[tuple[int, bytes]]:
    """Every committed record of ``log`` with its offset, oldest first."""
    with log.reader(OffsetSpec.first()) as r:
        return [(o, bytes(b)) for o, b in r.records()]
