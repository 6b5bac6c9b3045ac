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

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from rstream import Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType
from rstream.exceptions import PreconditionFailed
from rstream.utils import RawMessage

from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_e2e import producer, publish
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.config import LogConfig
from tierlog.log.damage import LOST_RANGE_FILE
from tierlog.log.errors import DamagedRangeError, DamagedSegmentError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.open_repairing import DamageReport, open_repairing
from tierlog.log.reader import LogReader, LogView
from tierlog.log.writer import StreamLog

CONFIG = LogConfig(max_segment_chunks=5)
RECORDS = 5  # per chunk; 8 chunks: a sealed segment of 5, the active one of 3
RECORD = 29  # an index record
FIRST = ConsumerOffsetSpecification(OffsetType.FIRST)


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


async def test_served_with_a_damaged_chunk_in_the_active_segment(tmp_path: Path) -> None:
    """The real server, tiering off (no remote copy), rstream clients: one bit flipped in
    the data of a chunk in the middle of the active segment. After the restart a consumer
    from ``first`` gets exactly the messages before that chunk, a subscription inside the
    lost range is refused (PRECONDITION_FAILED, the reason logged), and a publish is
    refused rather than given an offset of the lost range."""
    server = TierlogServerProcess(tmp_path / "data", config_text="[tier]\nenabled = false\n")
    server.start()
    try:
        async with producer(server) as p:
            await p.create_stream("dmg", arguments={"x-tierlog-max-segment-chunks": "8"})
        batches = [
            [RawMessage(b"%d-%d:" % (k, i) + b"x" * 1000) for i in range(10)] for k in range(12)
        ]
        await publish(server, "dmg", batches, name="w", pause=0.05)
        server.stop()
        streams = os.path.join(server.data_dir, "streams")
        [directory] = [os.path.join(streams, d) for d in os.listdir(streams)]
        index = sorted(n for n in os.listdir(directory) if n.endswith(".index"))[-1]
        assert len(os.listdir(directory)) > 2, "the test wants a sealed segment before"
        records = Path(directory, index).read_bytes()[FILE_HEADER_SIZE:]
        assert len(records) >= 3 * RECORD, "the test wants chunks on both sides"
        with LogReader(LogView(directory), OffsetSpec.first()) as r:
            pristine = [(o, bytes(b)) for o, b in r.records()]
        assert [b for _, b in pristine] == [bytes(m) for b in batches for m in b]
        at = len(records) // RECORD // 2  # a chunk in the middle of the active segment
        lost_from = int.from_bytes(records[at * RECORD : at * RECORD + 8], "big")
        start = int.from_bytes(records[at * RECORD + 24 : at * RECORD + 28], "big")
        end = int.from_bytes(records[(at + 1) * RECORD + 24 : (at + 1) * RECORD + 28], "big")
        flip_data(os.path.join(directory, index[: -len(".index")] + ".segment"), start, end - start)
        server.start()
        before = [(o, b) for o, b in pristine if o < lost_from]
        assert 0 < len(before) < len(pristine)
        got = await consume_quiet(
            server, ConsumerOffsetSpecification(OffsetType.FIRST), len(before)
        )
        assert got == before  # exactly, and nothing after
        for offset in (lost_from, lost_from + 3):
            c = Consumer("127.0.0.1", port=server.stream_port, username="guest", password="guest")
            await c.start()
            try:
                with pytest.raises(PreconditionFailed):
                    await c.subscribe(
                        "dmg",
                        lambda *_: None,
                        offset_specification=ConsumerOffsetSpecification(OffsetType.OFFSET, offset),
                    )
            finally:
                await c.close()
        [status] = await publish(server, "dmg", [[RawMessage(b"after")]], name="w2")
        assert not status.is_confirmed
        assert status.response_code == ResponseCode.STREAM_NOT_AVAILABLE
        got = await consume_quiet(
            server, ConsumerOffsetSpecification(OffsetType.FIRST), len(before)
        )
        assert got == before  # the refused publish took no offset
        assert any(n.endswith(f".cut-{lost_from}.damaged") for n in os.listdir(directory))
    finally:
        server.stop()


async def consume_quiet(
    server: TierlogServerProcess, spec: ConsumerOffsetSpecification, count: int
) -> list[tuple[int, bytes]]:
    """Every message delivered until ``count`` arrived and half a second more passed (a
    message past the damaged chunk would show up here)."""
    got: list[tuple[int, bytes]] = []
    enough = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))
        if len(got) >= count:
            enough.set()

    c = Consumer("127.0.0.1", port=server.stream_port, username="guest", password="guest")
    await c.start()
    try:
        await c.subscribe("dmg", on_message, offset_specification=spec)
        await asyncio.wait_for(enough.wait(), 20)
        await asyncio.sleep(0.5)
    finally:
        await c.close()
    return got


def test_a_crash_before_the_cut_repeats_the_same_cut(tmp_path: Path) -> None:
    """The range is recorded and the copy made before the live file is cut: a crash in
    between (the live segment still holds the damaged chunk) repeats the same cut."""
    src, expected, chunks = build(tmp_path / "pristine")
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    segment = os.path.join(stream_dir, sorted(os.listdir(stream_dir))[-1])
    assert segment.endswith(".segment")
    lost_from, position, size = chunks[1]
    flip_data(segment, position, size)
    damaged_bytes = Path(segment).read_bytes()
    open_repairing(stream_dir, CONFIG, None).close()
    Path(segment).write_bytes(damaged_bytes)  # the cut never reached the disk
    report = DamageReport()
    log = open_repairing(stream_dir, CONFIG, None, report)
    try:
        assert report.lost is not None and report.lost.first_offset == lost_from
        assert read_all(log) == [(o, b) for o, b in expected if o < lost_from]
    finally:
        log.close()
    copy = Path(stream_dir, f"{os.path.basename(segment)}.cut-{lost_from}.damaged")
    assert copy.read_bytes() == damaged_bytes
