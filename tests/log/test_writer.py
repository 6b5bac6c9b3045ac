"""The stream log writer: chunks, rollover, limits, dedup, tracking, epochs, commits."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

import tierlog.log.writer as writer_module
from tierlog.formats.chunk import ChunkType, SubBatch, decode_chunk
from tierlog.formats.compression import Compression, compress
from tierlog.formats.segment import iter_index_records
from tierlog.log.commit_point import CommitPoint
from tierlog.log.config import LogConfig
from tierlog.log.errors import (
    InvalidAppendError,
    LogClosedError,
    OffsetGapError,
    OffsetReuseError,
    RecordTooLargeError,
    SegmentNotSealedError,
    StaleEpochError,
)
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.segment_files import read_file
from tierlog.log.tracking import TrackingState
from tierlog.log.writer import StreamLog


def make(tmp_path: Path, **kw: object) -> StreamLog:
    return StreamLog.create(str(tmp_path), "/", "s", LogConfig(**kw), created_ns=1)  # type: ignore[arg-type]


def all_records(log: StreamLog) -> list[tuple[int, bytes]]:
    with log.reader(OffsetSpec.first()) as r:
        return [(o, bytes(b)) for o, b in r.records()]


def all_chunks(log: StreamLog) -> list[tuple[int, int, int]]:
    """(chunk id, type, epoch) of every chunk, tracking included."""
    with log.reader(OffsetSpec.first(), user_only=False) as r:
        return [(c.header.chunk_id, c.header.chunk_type, c.header.epoch) for c in r.chunks()]


def test_append_assigns_offsets_and_reads_back(tmp_path: Path) -> None:
    log = make(tmp_path)
    assert log.next_offset == 0 and log.committed_chunk_id == -1
    r1 = log.append([b"a", b"b", b"c"])
    assert (r1.first_offset, r1.last_offset, r1.chunk_ids) == (0, 2, (0,))
    assert log.append_records([b"d", b"e"]) == 3
    assert log.next_offset == 5 and log.committed_chunk_id == 3 and log.committed_offset == 4
    assert all_records(log) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]
    log.close()
    with pytest.raises(LogClosedError):
        log.append([b"x"])


def test_files_are_osiris_layout(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([b"x" * 10] * 3)
    log.append([b"y"])
    seg = log.list_segments()[0]
    raw = read_file(seg.segment_path)
    assert raw[:8] == b"OSIL\x00\x00\x00\x01"
    records = list(iter_index_records(read_file(seg.index_path)))
    assert [(r.chunk_id, r.position, r.chunk_type) for r in records] == [
        (0, 8, 0),
        (3, 8 + 48 + 42, 0),
    ]
    for r in records:
        chunk = decode_chunk(raw, r.position)
        assert (chunk.header.chunk_id, chunk.header.timestamp, chunk.header.epoch) == (
            r.chunk_id,
            r.timestamp,
            r.epoch,
        )
    assert os.path.basename(seg.segment_path) == "00000000000000000000.segment"
    log.close()


def test_sub_batch_entries_pass_through(tmp_path: Path) -> None:
    log = make(tmp_path)
    body = b"".join(len(r).to_bytes(4, "big") + r for r in [b"one", b"two"])
    sub = SubBatch(Compression.GZIP, 2, len(body), compress(Compression.GZIP, body))
    res = log.append([b"plain", sub, b"after"])
    assert (res.first_offset, res.last_offset) == (0, 3)
    assert all_records(log) == [(0, b"plain"), (1, b"one"), (2, b"two"), (3, b"after")]
    chunk = decode_chunk(log.read_chunk_bytes(0, 8, log.segment_chunks(0)[0].size))
    assert sub.data in bytes(chunk.data)  # stored verbatim
    log.close()


def test_rollover_by_bytes_and_chunks(tmp_path: Path) -> None:
    log = make(tmp_path, max_segment_bytes=300, max_segment_chunks=1000)
    for i in range(10):
        log.append([bytes([i]) * 100])
    segs = log.list_segments()
    assert len(segs) > 1 and all(s.sealed for s in segs[:-1]) and not segs[-1].sealed
    assert all(s.num_chunks >= 2 for s in segs[:-1])  # Osiris: at least 2 chunks per segment
    assert segs[0].first_offset == 0
    for a, b in itertools.pairwise(segs):
        assert a.next_offset == b.first_offset
        assert os.path.basename(b.segment_path) == f"{b.first_offset:020d}.segment"
    assert [o for o, _ in all_records(log)] == list(range(10))
    log.close()
    log = make(tmp_path / "c", max_segment_chunks=3)
    for i in range(7):
        log.append([b"r%d" % i])
    assert [s.num_chunks for s in log.list_segments()] == [3, 3, 1]
    log.close()


def test_tracking_snapshot_starts_each_new_segment(tmp_path: Path) -> None:
    log = make(tmp_path, max_segment_chunks=3)
    log.append([b"a"], producer="p", publishing_ids=[1])
    log.store_offset("c", 0)
    for i in range(5):
        log.append([b"b%d" % i])
    chunks = all_chunks(log)
    segs = log.list_segments()
    starts = {s.first_offset for s in segs[1:]}
    for chunk_id, ctype, _ in chunks:
        if chunk_id in starts:
            assert ctype == ChunkType.TRACKING_SNAPSHOT
    assert sum(1 for _, t, _ in chunks if t == ChunkType.TRACKING_SNAPSHOT) == len(segs) - 1
    # tracking chunks take offsets: user records show gaps
    offsets = [o for o, _ in all_records(log)]
    assert offsets == sorted(offsets) and offsets[-1] > len(offsets) - 1
    log.close()


def test_chunks_split_by_max_chunk_bytes(tmp_path: Path) -> None:
    log = make(tmp_path, max_chunk_bytes=1000, max_record_bytes=500)
    res = log.append([b"x" * 400] * 5)
    assert len(res.chunk_ids) == 3 and res.chunk_ids == (0, 2, 4)
    assert (res.first_offset, res.last_offset) == (0, 4)
    assert [s.size for s in log.segment_chunks(0)] == [48 + 808, 48 + 808, 48 + 404]
    log.close()


def test_oversized_record_writes_nothing(tmp_path: Path) -> None:
    log = make(tmp_path, max_chunk_bytes=2000, max_record_bytes=100)
    log.append([b"ok"])
    seg = log.list_segments()[0]
    before = (read_file(seg.segment_path), read_file(seg.index_path), log.next_offset)
    with pytest.raises(RecordTooLargeError):
        log.append([b"fine", b"x" * 101])
    with pytest.raises(RecordTooLargeError):
        log.append_records([b"y" * 101])
    with pytest.raises(RecordTooLargeError):
        log.append([SubBatch(0, 1, 2000, b"z" * 2000)])
    with pytest.raises(InvalidAppendError):
        log.append([])
    with pytest.raises(InvalidAppendError):
        log.append(["text"])  # type: ignore[list-item]
    assert (read_file(seg.segment_path), read_file(seg.index_path), log.next_offset) == before
    log.close()


def test_producer_dedup(tmp_path: Path) -> None:
    log = make(tmp_path)
    r = log.append([b"a", b"b", b"c"], producer="p1", publishing_ids=[1, 2, 3])
    assert r.written == (1, 2, 3) and r.dropped == ()
    r = log.append([b"b", b"c", b"d", b"d2", b"e"], producer="p1", publishing_ids=[2, 3, 4, 4, 5])
    assert r.written == (4, 5) and r.dropped == (2, 3, 4)
    assert r.dedup_chunk_id == r.chunk_ids[-1]
    r = log.append([b"old"], producer="p1", publishing_ids=[1])
    assert r.first_offset is None and r.chunk_ids == () and r.dropped == (1,)
    assert r.dedup_chunk_id is not None and r.dedup_chunk_id <= log.committed_chunk_id
    assert log.duplicates_dropped == 4
    assert log.producer_sequence("p1") == 5 and log.producer_sequence("other") is None
    log.append([b"x"], producer="p2", publishing_ids=[1])  # producers are independent
    assert [b for _, b in all_records(log)] == [b"a", b"b", b"c", b"d", b"e", b"x"]
    with pytest.raises(InvalidAppendError):
        log.append([b"a"], producer="p1", publishing_ids=[1, 2])
    with pytest.raises(InvalidAppendError):
        log.append([b"a"], publishing_ids=[1])
    with pytest.raises(InvalidAppendError):
        log.append([b"a"], producer="x" * 256, publishing_ids=[1])
    with pytest.raises(InvalidAppendError):
        log.append([b"a"], producer="p1", publishing_ids=[-1])
    log.close()


@pytest.mark.parametrize("segment_chunks", [1000, 2, 3])
def test_dedup_and_offsets_survive_restart(tmp_path: Path, segment_chunks: int) -> None:
    log = make(tmp_path, max_segment_chunks=segment_chunks)
    for i in range(6):
        log.append([b"m%d" % i], producer="p", publishing_ids=[i])
        log.store_offset("reader", i * 10)
    log.store_offset("other", 7)
    log.append([b"q"], producer="q", publishing_ids=[100])
    stream_dir = log.stream_dir
    log.close()
    log = StreamLog.open(stream_dir, LogConfig(max_segment_chunks=segment_chunks))
    assert log.producer_sequence("p") == 5
    assert log.producer_sequence("q") == 100
    assert log.query_offset("reader") == 50 and log.query_offset("other") == 7
    assert log.query_offset("nobody") is None
    r = log.append([b"dup", b"new"], producer="p", publishing_ids=[5, 6])
    assert r.dropped == (5,) and r.written == (6,)
    before = log.tracking_snapshot()
    log.close()
    log = StreamLog.open(stream_dir)
    assert (
        TrackingState.from_bytes(log.tracking_snapshot()).sequences
        == TrackingState.from_bytes(before).sequences
    )
    log.close()


def test_max_producers_trims_snapshots(tmp_path: Path) -> None:
    log = make(tmp_path, max_segment_chunks=2, max_producers=2)
    for i in range(4):
        log.append([b"x"], producer=f"p{i}", publishing_ids=[1])
    log.append([b"roll"])
    log.append([b"roll"])
    stream_dir = log.stream_dir
    log.close()
    log = StreamLog.open(stream_dir, LogConfig(max_segment_chunks=2, max_producers=2))
    known = [p for p in ("p0", "p1", "p2", "p3") if log.producer_sequence(p) is not None]
    assert known == ["p2", "p3"]  # the most recent writers
    log.close()


def test_epoch_never_lower_than_disk(tmp_path: Path) -> None:
    log = make(tmp_path, epoch=3)
    log.append([b"a"])
    stream_dir = log.stream_dir
    log.close()
    with pytest.raises(StaleEpochError):
        StreamLog.open(stream_dir, LogConfig(epoch=2))
    log = StreamLog.open(stream_dir, LogConfig(epoch=4))
    log.append([b"b"])
    assert [e for _, _, e in all_chunks(log)] == [3, 4] and log.max_epoch == 4
    log.close()
    with pytest.raises(StaleEpochError):
        StreamLog.open(stream_dir, LogConfig(epoch=3))


def test_timestamps_never_go_backwards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [2_000_000 * 1_000_000]
    monkeypatch.setattr(writer_module.time, "time_ns", lambda: now[0])
    log = make(tmp_path)
    log.append([b"a"])
    now[0] -= 50_000 * 1_000_000  # clock jumps back 50 s
    log.append([b"b"])
    stream_dir = log.stream_dir
    log.close()
    log = StreamLog.open(stream_dir)  # also across a restart
    now[0] -= 10_000_000
    log.append([b"c"])
    now[0] += 60_000 * 1_000_000
    log.append([b"d"])
    with log.reader(OffsetSpec.first()) as r:
        stamps = [c.header.timestamp for c in r.chunks()]
    assert stamps == [2_000_000, 2_000_000, 2_000_000, 2_010_000 - 10]
    log.close()


def test_commit_cadences(tmp_path: Path) -> None:
    seen: list[CommitPoint] = []
    log = make(tmp_path / "never", fsync="never")
    log.add_commit_listener(seen.append)
    log.append([b"a"])
    log.append([b"b"])
    assert log.committed_chunk_id == -1 and seen == []
    with log.reader(OffsetSpec.first()) as r:
        assert r.read_chunk() is None  # readers see committed chunks only
        log.sync()
        assert log.committed_chunk_id == 1 and seen[-1].next_offset == 2
        assert [bytes(b) for _, b in r.records()] == [b"a", b"b"]
    log.close()

    log = make(tmp_path / "interval", fsync="interval", fsync_interval_ms=1000)
    log.add_commit_listener(seen.append)
    t0 = time.monotonic()
    log.append([b"a"])
    assert log.committed_chunk_id == -1
    assert not log.maybe_sync(t0 + 0.5) or log.committed_chunk_id == 0
    assert log.maybe_sync(t0 + 5.0)
    assert log.committed_chunk_id == 0 and not log.maybe_sync(t0 + 10.0)
    log.close()

    log = make(tmp_path / "chunk", fsync="chunk")
    points: list[int] = []
    log.add_commit_listener(lambda p: points.append(p.chunk_id))
    log.append([b"a"])
    log.store_offset("c", 0)
    assert points == [0, 1] and log.committed == log.commit_point()
    log.close()


def test_close_commits_and_listener_errors_do_not_break_appends(tmp_path: Path) -> None:
    log = make(tmp_path, fsync="never")

    def broken(point: CommitPoint) -> None:
        raise RuntimeError("listener bug")

    log.add_commit_listener(broken)
    log.append([b"a"])
    log.close()
    log = StreamLog.open(log.stream_dir)
    assert log.committed_chunk_id == 0  # recovered data counts as committed
    log.close()


def test_restart_at_skips_offsets_and_restores_tracking(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.append([b"a", b"b"], producer="p", publishing_ids=[1, 2])
    log.store_offset("c", 1)
    remote = TrackingState()
    remote.sequences[b"p"] = (900, 77)
    remote.offsets[b"c"] = 950
    with pytest.raises(OffsetReuseError):
        log.restart_at(1, 2, remote.to_bytes())
    with pytest.raises(StaleEpochError):
        log.restart_at(1000, 1, remote.to_bytes())
    log.restart_at(1000, 2, remote.to_bytes())
    assert log.epoch == 2 and log.next_offset == 1001  # the snapshot chunk took offset 1000
    assert log.producer_sequence("p") == 77 and log.query_offset("c") == 950
    r = log.append([b"x", b"y"], producer="p", publishing_ids=[77, 78])
    assert r.first_offset == 1001 and r.dropped == (77,)
    assert [s.first_offset for s in log.list_segments()] == [0, 1000]
    # the local log jumps over offsets only the remote tier holds: never a silent skip
    with pytest.raises(OffsetGapError) as gap:
        all_records(log)
    assert (gap.value.missing_from, gap.value.missing_to) == (3, 1000)
    with pytest.raises(OffsetGapError), log.reader(OffsetSpec.offset(500)) as reader:
        list(reader.records())  # inside the gap
    with log.reader(OffsetSpec.offset(1000)) as reader:
        assert [o for o, _ in reader.records()] == [1001]
    stream_dir = log.stream_dir
    log.close()
    with pytest.raises(StaleEpochError):
        StreamLog.open(stream_dir)  # epoch 1 < 2 on disk
    log = StreamLog.open(stream_dir, LogConfig(epoch=2))
    assert log.next_offset == 1002 and log.producer_sequence("p") == 78
    assert log.query_offset("c") == 950
    log.close()


def test_restart_at_on_empty_log(tmp_path: Path) -> None:
    log = make(tmp_path)
    log.restart_at(500, 5, TrackingState().to_bytes())
    assert [s.first_offset for s in log.list_segments()] == [500]
    assert log.first_offset == 500
    stream_dir = log.stream_dir
    log.close()
    log = StreamLog.open(stream_dir, LogConfig(epoch=5))
    assert log.next_offset == 501 and log.append([b"z"]).first_offset == 501
    log.close()


def test_segment_inspection_and_delete(tmp_path: Path) -> None:
    log = make(tmp_path, max_segment_chunks=2)
    for i in range(5):
        log.append([b"r%d" % i])
    segs = log.list_segments()
    assert [s.first_offset for s in segs] == [0, 2, 4]
    chunks = log.segment_chunks(2)
    assert [c.chunk_id for c in chunks] == [2, 3]
    for c in chunks:
        raw = log.read_chunk_bytes(2, c.position, c.size)
        h = decode_chunk(raw).header
        assert (h.chunk_id, h.data_crc, h.num_records, h.chunk_type) == (
            c.chunk_id,
            c.data_crc,
            c.num_records,
            c.chunk_type,
        )
    with pytest.raises(SegmentNotSealedError):
        log.delete_segment(4)
    with pytest.raises(SegmentNotSealedError):
        log.delete_segment(2)  # not the oldest
    log.delete_segment(0)
    assert log.first_offset == 2 and not os.path.exists(segs[0].segment_path)
    assert [o for o, _ in all_records(log)] == [2, 3, 4]
    with pytest.raises(KeyError):
        log.segment_chunks(0)
    stream_dir = log.stream_dir
    log.close()
    log = StreamLog.open(stream_dir)
    assert log.first_offset == 2 and log.next_offset == 5
    log.close()
