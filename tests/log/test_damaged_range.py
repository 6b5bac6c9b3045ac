"""A damaged chunk without a healthy copy costs its range, not the stream (issue 30, item 7).

A chunk of the active segment whose own data is damaged (its header continues the log,
its CRC fails) and that no remote copy repairs used to refuse the whole stream, every
offset unavailable. Now opening cuts the log before that chunk (the file is copied aside
as ``*.damaged``, nothing deleted) and records the range as lost.

Oracle: every record before the damaged chunk is read back exactly, in order; a reader
positioned in the lost range, and every append, get ``DamagedRangeError`` naming the
range (never a skip, never an offset handed out twice); the copy aside holds the
original bytes; it stays that way across reopening.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tierlog.log.config import LogConfig
from tierlog.log.damage import LOST_RANGE_FILE
from tierlog.log.errors import DamagedRangeError, DamagedSegmentError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.open_repairing import DamageReport, open_repairing
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog

CONFIG = LogConfig(max_segment_chunks=5)
RECORDS = 5  # per chunk; 8 chunks: a sealed segment of 5, the active one of 3


def build(base: Path) -> tuple[str, list[tuple[int, bytes]], list[tuple[int, int, int]]]:
    """The stream dir, its records, and (chunk id, position, size) of the active segment."""
    log = StreamLog.create(str(base), "/", "s", CONFIG, created_ns=1)
    for i in range(8):
        log.append([b"%d-%d:" % (i, j) + b"x" * 1000 for j in range(RECORDS)])
    with LogReader(log, OffsetSpec.first()) as r:
        expected = [(o, bytes(b)) for o, b in r.records()]
    active = log.segment_refs()[-1].first_offset
    chunks = [(c.chunk_id, c.position, c.size) for c in log.segment_chunks(active)]
    stream_dir = log.stream_dir
    log.close()
    return stream_dir, expected, chunks


def read_all(log: StreamLog) -> list[tuple[int, bytes]]:
    with LogReader(log, OffsetSpec.first()) as r:
        return [(o, bytes(b)) for o, b in r.records()]


def flip_data(segment: str, position: int, size: int) -> None:
    """One bit in the middle of a chunk: its records, covered by the data CRC only."""
    with open(segment, "r+b") as f:
        f.seek(position + size // 2)
        byte = f.read(1)[0]
        f.seek(position + size // 2)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("which", [1, 0], ids=["middle", "first-of-segment"])
def test_a_damaged_chunk_costs_its_range_not_the_stream(tmp_path: Path, which: int) -> None:
    src, expected, chunks = build(tmp_path / "pristine")
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    [segment] = [
        os.path.join(stream_dir, n)
        for n in sorted(os.listdir(stream_dir))[-2:]
        if n.endswith(".segment")
    ]
    lost_from, position, size = chunks[which]
    flip_data(segment, position, size)
    damaged_bytes = Path(segment).read_bytes()
    with pytest.raises(DamagedSegmentError):  # the plain open still refuses to guess
        StreamLog.open(stream_dir)
    for attempt in range(2):  # and opening again finds the same state
        report = DamageReport()
        log = open_repairing(stream_dir, CONFIG, None, report)
        try:
            assert report.refused is None and report.moved_aside == []
            assert (report.lost is not None) == (attempt == 0)
            assert log.lost_range is not None
            assert log.lost_range.first_offset == lost_from
            assert log.lost_range.end_offset == lost_from + RECORDS  # where trust resumed
            assert read_all(log) == [(o, b) for o, b in expected if o < lost_from]
            assert log.next_offset == lost_from
            for spec in (
                OffsetSpec.offset(lost_from),
                OffsetSpec.offset(lost_from + 2),
                OffsetSpec.offset(expected[-1][0]),
                OffsetSpec.next(),
            ):
                with pytest.raises(DamagedRangeError, match=f"offsets \\[{lost_from}, ") as info:
                    LogReader(log, spec)
                assert info.value.first_offset == lost_from
            with LogReader(log, OffsetSpec.offset(lost_from - 1)) as r:
                assert [o for o, _ in r.records()] == [lost_from - 1]
            with pytest.raises(DamagedRangeError):  # no offset of the range handed out again
                log.append([b"would reuse offset %d" % lost_from])
            with pytest.raises(DamagedRangeError):
                log.store_offset("c", 3)
            assert log.next_offset == lost_from
        finally:
            log.close()
    names = os.listdir(stream_dir)
    copy = os.path.basename(segment) + f".cut-{lost_from}.damaged"
    assert copy in names and LOST_RANGE_FILE in names
    assert Path(stream_dir, copy).read_bytes() == damaged_bytes  # nothing lost for good
    assert not any(n.endswith(".segment.damaged") for n in names)
