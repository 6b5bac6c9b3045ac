"""Readers: offset specs, committed-only visibility, concurrency, sendfile ranges."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

import tierlog.log.writer as writer_module
from tierlog.formats.chunk import ChunkType, SubBatch, decode_chunk
from tierlog.formats.compression import Compression, compress
from tierlog.log.config import LogConfig
from tierlog.log.errors import CorruptChunkError, LogClosedError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog


def make(tmp_path: Path, **kw: object) -> StreamLog:
    return StreamLog.create(str(tmp_path), "/", "r", LogConfig(**kw), created_ns=1)  # type: ignore[arg-type]


def first_record(log: StreamLog, spec: OffsetSpec) -> int | None:
    with log.reader(spec) as r:
        for offset, _ in r.records():
            return offset
    return None


def test_offset_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_000_000 * 1_000_000]
    monkeypatch.setattr(writer_module.time, "time_ns", lambda: now[0])
    log = make(tmp_path, max_segment_chunks=3)
    for i in range(8):  # chunks of 3 records at t = 1000 s, 1001 s, ...
        log.append([b"%d" % (i * 3 + j) for j in range(3)])
        now[0] += 1_000 * 1_000_000
    log.store_offset("c", 5)  # a tracking chunk at the end
    assert len(log.list_segments()) > 2
    assert first_record(log, OffsetSpec.first()) == 0
    with log.reader(OffsetSpec.last()) as r:  # last *user* chunk
        c = r.read_chunk()
        assert c is not None and c.header.chunk_id == 21 and c.header.chunk_type == ChunkType.USER
    assert first_record(log, OffsetSpec.next()) is None
    assert first_record(log, OffsetSpec.offset(13)) == 13  # inside a chunk: earlier records skipped
    assert first_record(log, OffsetSpec.offset(12)) == 12
    assert first_record(log, OffsetSpec.offset(0)) == 0
    assert first_record(log, OffsetSpec.offset(10_000)) is None  # beyond the end: next
    assert first_record(log, OffsetSpec.timestamp(0)) == 0
    assert first_record(log, OffsetSpec.timestamp(1_002_000)) == 6
    assert first_record(log, OffsetSpec.timestamp(1_002_001)) == 9
    assert first_record(log, OffsetSpec.timestamp(9_999_999)) is None
    with log.reader(OffsetSpec.next()) as r:
        log.append([b"new"])
        assert [bytes(b) for _, b in r.records()] == [b"new"]
    log.close()


def test_specs_on_empty_log(tmp_path: Path) -> None:
    log = make(tmp_path)
    for spec in (
        OffsetSpec.first(),
        OffsetSpec.last(),
        OffsetSpec.next(),
        OffsetSpec.offset(5),
        OffsetSpec.timestamp(1),
    ):
        with log.reader(spec) as r:
            assert r.read_chunk() is None and r.next_offset == 0
    with log.reader(OffsetSpec.last()) as r:
        log.append([b"x"])
        assert [o for o, _ in r.records()] == [0]
    log.close()


def test_reader_skips_tracking_and_reports_positions(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([b"a"])
    log.store_offset("c", 0)
    log.append([b"b", b"c"])
    with log.reader(OffsetSpec.first()) as r:
        chunks = list(r.chunks())
    assert [c.header.chunk_id for c in chunks] == [0, 2]
    seg = log.list_segments()[0].segment_path
    for c in chunks:
        assert c.segment_path == seg
        assert c.raw is not None and len(c.raw) == c.size
        with open(seg, "rb") as f:
            f.seek(c.position)
            assert f.read(c.size) == bytes(c.raw)
        assert decode_chunk(c.raw).header == c.header
    with log.reader(OffsetSpec.first(), user_only=False) as r:
        assert [c.header.chunk_type for c in r.chunks()] == [0, 1, 0]
    with log.reader(OffsetSpec.first()) as r:
        light = r.read_chunk(load=False)
        assert light is not None and light.raw is None
        with pytest.raises(ValueError):
            light.data  # noqa: B018
    log.close()


def test_sendfile_range(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([b"sendfile me"] * 3)
    a, b = socket.socketpair()
    with log.reader(OffsetSpec.first()) as r:
        c = r.read_chunk(load=False)
        assert c is not None
        fd = os.open(c.segment_path, os.O_RDONLY)
        try:
            sent = os.sendfile(a.fileno(), fd, c.position, c.size)
        finally:
            os.close(fd)
    got = b.recv(c.size)
    a.close()
    b.close()
    assert sent == c.size and decode_chunk(got).header.chunk_id == 0
    log.close()


def test_concurrent_reader_waits_for_commits(tmp_path: Path) -> None:
    log = make(tmp_path, max_segment_chunks=5, fsync="never")
    got: list[int] = []
    done = threading.Event()

    def consume() -> None:
        with log.reader(OffsetSpec.first()) as r:
            while len(got) < 200:
                for offset, record in r.records():
                    assert bytes(record) == b"%d" % offset
                    got.append(offset)
                if len(got) < 200:
                    r.wait(timeout=5)
        done.set()

    t = threading.Thread(target=consume)
    t.start()
    for i in range(40):
        log.append([b"%d" % (i * 5 + j) for j in range(5)])
        if i % 3 == 0:
            log.sync()
    log.sync()
    assert done.wait(10)
    t.join()
    assert got == list(range(200))  # every record once, in order, across segment rolls
    log.close()


def test_wait_returns_on_close_and_closed_reader(tmp_path: Path) -> None:
    log = make(tmp_path)
    r = log.reader(OffsetSpec.next())
    assert not r.wait(timeout=0.01)
    log.close()
    assert not r.wait(timeout=5)
    r.close()
    with pytest.raises(LogClosedError):
        r.read_chunk()


def test_reader_survives_retention_of_its_segment(tmp_path: Path) -> None:
    log = make(tmp_path, max_segment_chunks=2)
    for i in range(6):
        log.append([b"%d" % i])
    with log.reader(OffsetSpec.first()) as r:
        first = r.read_chunk()
        assert first is not None
        log.delete_segment(0)  # the reader keeps its open file
        assert [o for o, _ in r.records()] == [1, 2, 3, 4, 5]
    log.close()


def sub(records: list[bytes]) -> SubBatch:
    body = b"".join(len(r).to_bytes(4, "big") + r for r in records)
    return SubBatch(Compression.GZIP, len(records), len(body), compress(Compression.GZIP, body))


def test_records_with_sub_batches_and_skips(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([sub([b"only"])])  # one entry holding one record: entries == records
    log.append([b"a", sub([b"b", b"c"]), b"d"])
    log.append([sub([b"e"]), b"f"])
    expected = [(0, b"only"), (1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e"), (6, b"f")]
    with log.reader(OffsetSpec.first()) as r:
        assert [(o, bytes(b)) for o, b in r.records()] == expected
    for start in range(7):
        with log.reader(OffsetSpec.offset(start)) as r:
            assert [(o, bytes(b)) for o, b in r.records()] == expected[start:]
    log.close()


def test_verify_always_catches_corruption_after_open(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([b"precious data"])
    seg = log.list_segments()[0].segment_path
    with open(seg, "r+b") as f:  # rot under a running process
        f.seek(8 + 48 + 4)
        f.write(b"P")
    with log.reader(OffsetSpec.first(), verify_crc="always") as r, pytest.raises(CorruptChunkError):
        r.read_chunk()
    log.close()
    log = StreamLog.open(log.stream_dir)
    assert log.next_offset == 0 and log.recovery_notes
    log.close()
