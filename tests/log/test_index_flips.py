"""A derived file never takes a stream down (issue 30, item 7): one flipped bit in the
index record of the log's last chunk (the active segment, no right neighbour, no remote
copy) used to make the chunk count as damaged and the stream refused, its healthy
segment moved aside. Now the index is rebuilt from the chunks, whose CRC holds and whose
headers continue the log.

Oracle: the stream opens, every record is read back exactly once, in order, and the
index file is what the writer wrote; a chunk type that the data also reads as stays
refused (ambiguous), as a flipped header does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from rstream import ConsumerOffsetSpecification, OffsetType
from rstream.utils import RawMessage

from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_e2e import consume, producer, publish
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.config import LogConfig
from tierlog.log.errors import DamagedSegmentError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog

RECORD = 29
# (field, byte in the 29-byte record ">QqQIB", bit)
INDEX_FLIPS = [
    ("chunk_id", 7, 2),
    ("chunk_id-high", 2, 0),
    ("timestamp-low", 15, 0),
    ("timestamp", 12, 3),
    ("timestamp-sign", 8, 7),
    ("epoch-up", 23, 1),
    ("epoch-down", 23, 0),
    ("position", 27, 3),
    ("type->delta", 28, 0),
    ("type->snapshot", 28, 1),
    ("type->unknown", 28, 2),
]


def build(base: Path, chunks: int) -> tuple[str, list[tuple[int, bytes]]]:
    """Segments of 4 chunks, the last (active) one holding ``chunks % 4`` of them (4 when
    0); user chunks of 5 records, a tracking chunk among them."""
    log = StreamLog.create(str(base), "/", "s", LogConfig(max_segment_chunks=4), created_ns=1)
    for i in range(chunks):
        log.append([b"%d-%d:" % (i, j) + b"x" * (j + i % 3) for j in range(5)])
        if i == 2:
            log.store_offset("c", 3)
    expected = read_all(log)
    stream_dir = log.stream_dir
    log.close()
    return stream_dir, expected


def read_all(log: StreamLog) -> list[tuple[int, bytes]]:
    with LogReader(log, OffsetSpec.first()) as r:
        return [(o, bytes(b)) for o, b in r.records()]


def active_index(stream_dir: str) -> str:
    names = sorted(n for n in os.listdir(stream_dir) if n.endswith(".index"))
    return os.path.join(stream_dir, names[-1])


def flip(path: str, at: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << bit)]))


@pytest.mark.parametrize("chunks", [10, 9], ids=["last-of-three", "alone-in-segment"])
@pytest.mark.parametrize(("field", "at", "bit"), INDEX_FLIPS, ids=[f[0] for f in INDEX_FLIPS])
def test_flipped_bit_in_the_last_index_record_costs_nothing(
    tmp_path: Path, chunks: int, field: str, at: int, bit: int
) -> None:
    src, expected = build(tmp_path / "pristine", chunks)
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    index = active_index(stream_dir)
    pristine_index = Path(index).read_bytes()
    records = (len(pristine_index) - FILE_HEADER_SIZE) // RECORD
    flip(index, FILE_HEADER_SIZE + (records - 1) * RECORD + at, bit)
    log = StreamLog.open(stream_dir)
    try:
        assert read_all(log) == expected
        assert log.next_offset == expected[-1][0] + 1
        log.append([b"after the repair"])
        assert read_all(log)[-1] == (expected[-1][0] + 1, b"after the repair")
    finally:
        log.close()
    assert not any(n.endswith(".damaged") for n in os.listdir(stream_dir))
    assert Path(index).read_bytes()[: len(pristine_index)] == pristine_index


def test_a_header_epoch_the_log_never_had_is_refused(tmp_path: Path) -> None:
    """The other copy flipped: the last chunk's header claims an epoch above its
    predecessor's and its index record's. A writer would adopt it, so it stays damage."""
    src, _expected = build(tmp_path / "pristine", 10)
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    index = active_index(stream_dir)
    data = Path(index).read_bytes()
    last_position = int.from_bytes(data[-RECORD + 24 : -RECORD + 28], "big")
    segment = index[: -len(".index")] + ".segment"
    flip(segment, last_position + 23, 4)  # the header's epoch, one bit up
    with pytest.raises(DamagedSegmentError) as info:
        StreamLog.open(stream_dir)
    assert info.value.segment_path == segment


async def test_served_after_a_flipped_index_timestamp(tmp_path: Path) -> None:
    """The real server, tiering off (no remote copy), rstream clients: after a restart
    with one bit of the last index record's timestamp flipped, the stream opens, every
    offset is readable and publishing continues."""
    server = TierlogServerProcess(tmp_path / "data", config_text="[tier]\nenabled = false\n")
    server.start()
    try:
        async with producer(server) as p:
            await p.create_stream("flip", arguments={"x-tierlog-max-segment-chunks": "3"})
        batches = [
            [RawMessage(b"%d-%d:" % (k, i) + b"x" * 1000) for i in range(10)] for k in range(12)
        ]
        await publish(server, "flip", batches, name="w", pause=0.05)
        server.stop()
        stream_dir = os.path.join(server.data_dir, "streams")
        [directory] = [os.path.join(stream_dir, d) for d in os.listdir(stream_dir)]
        index = active_index(directory)
        size = os.path.getsize(index)
        assert len(os.listdir(directory)) > 2, "the test wants sealed segments too"
        flip(index, size - RECORD + 12, 3)  # the last record's timestamp
        server.start()
        spec = ConsumerOffsetSpecification(OffsetType.FIRST)
        got = await consume(server, "flip", spec, 120)
        assert [body for _, body in got] == [bytes(m) for b in batches for m in b]
        offsets = [offset for offset, _ in got]
        assert offsets == sorted(set(offsets)), "an offset twice or out of order"
        await publish(server, "flip", [[RawMessage(b"after")]], name="w2")
        assert not any(n.endswith(".damaged") for n in os.listdir(directory))
    finally:
        server.stop()
