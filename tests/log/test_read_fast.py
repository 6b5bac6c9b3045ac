"""Reader fast paths: uniform-record chunks, CRC checks read ahead in the helper thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierlog.formats.chunk import (
    HEADER_SIZE,
    encode_records,
    iter_records,
    iter_uniform_records,
    uniform_record_size,
)
from tierlog.log.config import LogConfig
from tierlog.log.errors import CorruptChunkError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog


def make(tmp_path: Path, **kw: object) -> StreamLog:
    return StreamLog.create(str(tmp_path), "/", "s", LogConfig(**kw), created_ns=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([b"abc"] * 5, 3),
        ([b"abc"], 3),
        ([b""] * 4, 0),
        ([b"abc", b"abcd"], None),
        ([b"a" * 256, b"b" * 256, b"c" * 255 + b"x"], 256),
        ([b"abcd", b"ab", b"ab"], None),
    ],
)
def test_uniform_record_size(records: list[bytes], expected: int | None) -> None:
    data = encode_records(records)
    assert uniform_record_size(data, len(records)) == expected
    assert uniform_record_size(memoryview(data), len(records)) == expected
    if expected is not None:
        fast = [
            (o, bytes(b))
            for o, b in iter_uniform_records(memoryview(data), 0, expected, len(records), 7)
        ]
        assert fast == [(o, bytes(b)) for o, b in iter_records(7, data, len(records))]


def test_uniform_size_rejects_a_lying_length_word() -> None:
    # same total size, but the second entry's length word differs (entries 5 + 3 bytes)
    data = encode_records([b"abcd", b"ab"]) + b"\x00\x00"
    assert uniform_record_size(data, 2) is None
    assert uniform_record_size(b"\x80\x00\x00\x01" + b"\x00" * 12, 1) is None
    assert uniform_record_size(b"", 0) is None


def test_records_skip_below_inside_uniform_and_mixed_chunks(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([b"u%02d" % i for i in range(10)])  # uniform: offsets 0..9
    log.append([b"m", b"mm", b"mmm"])  # mixed: 10..12
    for start in (0, 3, 9, 10, 11, 13):
        with log.reader(OffsetSpec.offset(start)) as r:
            assert [o for o, _ in r.records()] == list(range(start, 13))
        with log.reader(OffsetSpec.offset(start)) as r:
            assert [o for c in r.chunks() for o, _ in c.records()] == list(range(start, 13))
    log.close()


def big_log(tmp_path: Path, chunks: int = 6) -> tuple[StreamLog, list[bytes]]:
    """Chunks of 100 KiB-ish (helper-thread CRC), over several sealed segments."""
    log = make(tmp_path, max_segment_bytes=250_000)
    batch = [bytes([i % 251]) * 1024 for i in range(100)]
    for _ in range(chunks):
        log.append(batch)
    return log, batch


def test_read_ahead_keeps_reader_state_consistent(tmp_path: Path) -> None:
    log, _ = big_log(tmp_path)
    log.close()
    log = StreamLog.open(log.stream_dir)
    with log.reader(OffsetSpec.first(), verify_crc="always") as r:
        it = r.records()
        first = [next(it) for _ in range(150)]  # into the second chunk: read-ahead ran
        assert [o for o, _ in first] == list(range(150))
        assert r.next_offset == 200  # the chunk after the one being handed out
        rest = [c.header.chunk_id for c in r.chunks()]  # read_chunk serves the read-ahead
        assert rest == [200, 300, 400, 500]
        assert r.read_chunk() is None
    log.close()


def corrupt_data_byte(log: StreamLog, chunk_id: int) -> None:
    for seg in log.list_segments():
        for chunk in log.segment_chunks(seg.first_offset):
            if chunk.chunk_id == chunk_id:
                fd = os.open(seg.segment_path, os.O_RDWR)
                try:
                    at = chunk.position + HEADER_SIZE + 5000
                    old = os.pread(fd, 1, at)
                    os.pwrite(fd, bytes([old[0] ^ 0xFF]), at)
                finally:
                    os.close(fd)
                return
    raise AssertionError(f"no chunk {chunk_id}")


@pytest.mark.parametrize("verify", ["always", True])
def test_corrupt_chunk_is_never_served(tmp_path: Path, verify: object) -> None:
    log, _ = big_log(tmp_path)
    log.close()
    corrupt_data_byte(log, 200)  # in a sealed segment: checked with verify_crc=True too
    log = StreamLog.open(log.stream_dir)
    got: list[int] = []
    reader = log.reader(OffsetSpec.first(), verify_crc=verify)  # type: ignore[arg-type]
    with reader as r, pytest.raises(CorruptChunkError, match="CRC"):
        for offset, _ in r.records():
            got.append(offset)
    assert got == list(range(200))  # everything before the bad chunk, nothing of it
    log.close()


def test_read_chunk_alone_checks_crc_inline(tmp_path: Path) -> None:
    log, _ = big_log(tmp_path)
    log.close()
    corrupt_data_byte(log, 100)
    log = StreamLog.open(log.stream_dir)
    with log.reader(OffsetSpec.first(), verify_crc="always") as r:
        assert r.read_chunk() is not None
        with pytest.raises(CorruptChunkError):
            r.read_chunk()
    with log.reader(OffsetSpec.first(), verify_crc=False) as r:
        assert len(list(r.records())) == 600  # unchecked on request
    log.close()
