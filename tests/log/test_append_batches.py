"""StreamLog.append_batches: pre-encoded batches (Publish frames) through the log's one
append path — deduplication, chunk splitting, entry checks, progress on failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.logs import log_records
from tierlog.formats.chunk import MAX_ENTRIES_PER_CHUNK
from tierlog.formats.protocol.publish import PublishBatch, decode_publish, encode_publish
from tierlog.formats.tracking import TrackingType, decode_delta
from tierlog.log.append import chunk_ranges, kept_indexes
from tierlog.log.config import LogConfig
from tierlog.log.errors import RecordTooLargeError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import BatchProgress, StreamLog


def make(tmp_path: Path, **kw: object) -> StreamLog:
    cfg = LogConfig(fsync="never", **kw)  # type: ignore[arg-type]
    return StreamLog.create(str(tmp_path), "/", "s", cfg, created_ns=1)


def frame(messages: list[tuple[int, bytes]]) -> PublishBatch:
    return decode_publish(memoryview(encode_publish(1, messages))[4:])


def records(log: StreamLog) -> list[bytes]:
    log.sync()  # readers see committed chunks only
    return log_records(log)


def chunk_sequences(log: StreamLog) -> list[tuple[int, dict[bytes, int]]]:
    """(data length, producer sequences in the trailer) of each user chunk."""
    out = []
    log.sync()
    with log.reader(OffsetSpec.first()) as r:
        for chunk in r.chunks():
            seqs = {
                ident: value
                for kind, ident, value in decode_delta(chunk.trailer)
                if kind == TrackingType.SEQUENCE
            }
            out.append((chunk.header.data_length, seqs))
    return out


def test_a_frame_over_one_chunk_is_deduplicated_then_split_between_entries(
    tmp_path: Path,
) -> None:
    log = make(tmp_path, max_chunk_bytes=4096, max_record_bytes=4000)
    log.append_batches([frame([(1, b"a"), (2, b"b")])], "app")
    big = frame([(1, b"dup")] + [(i, b"%03d" % i * 300) for i in range(3, 11)])  # ~7.2 KB
    progress = log.append_batches([big, frame([(10, b"dup"), (11, b"z")])], "app")
    assert progress.duplicates == 2 and progress.batches == 2
    assert records(log) == [b"a", b"b"] + [b"%03d" % i * 300 for i in range(3, 11)] + [b"z"]
    chunks = chunk_sequences(log)
    assert len(chunks) >= 4  # the big frame alone in at least two chunks
    assert all(size <= 4096 for size, _ in chunks)
    assert [seqs[b"app"] for _, seqs in chunks][-1] == 11
    assert log.producer_sequence("app") == 11
    log.close()


def test_a_bad_record_in_a_split_frame_writes_none_of_it(tmp_path: Path) -> None:
    """The entries of a frame over one chunk are all checked before its first chunk."""
    log = make(tmp_path, max_chunk_bytes=4096, max_record_bytes=1000)
    ok = frame([(1, b"ok")])
    bad = frame([(i, b"y" * 900) for i in range(2, 8)] + [(8, b"x" * 2000)])  # 7.4 KB
    progress = BatchProgress()
    with pytest.raises(RecordTooLargeError):
        log.append_batches([ok, bad], "app", progress)
    assert progress.batches == 1  # the first frame is written, the bad one not at all
    assert records(log) == [b"ok"]
    assert log.producer_sequence("app") == 1
    log.close()


def test_batches_without_a_producer_keep_every_entry(tmp_path: Path) -> None:
    log = make(tmp_path)
    progress = log.append_batches([frame([(1, b"a"), (1, b"a2")]), frame([(0, b"b")])])
    assert (progress.chunks, progress.duplicates, progress.batches) == (1, 0, 2)
    assert records(log) == [b"a", b"a2", b"b"]
    log.close()


def test_kept_indexes_follow_osiris() -> None:
    assert kept_indexes([1, 2, 3], 0) is None  # all new: the fast path
    assert kept_indexes([1, 2, 3], 1) == [1, 2]
    assert kept_indexes([3, 2, 4, 4, 5], -1) == [0, 2, 4]
    assert kept_indexes([], 5) == []


def test_chunk_ranges_respect_bytes_and_entries() -> None:
    assert chunk_ranges([], 10) == []
    assert chunk_ranges([4, 4, 4], 10) == [(0, 2), (2, 3)]
    assert chunk_ranges([20, 1], 10) == [(0, 1), (1, 2)]  # an item over the limit: alone
    n = MAX_ENTRIES_PER_CHUNK + 1
    assert chunk_ranges([1] * n, 10**9) == [(0, MAX_ENTRIES_PER_CHUNK), (MAX_ENTRIES_PER_CHUNK, n)]
    counts = [MAX_ENTRIES_PER_CHUNK - 1, 2]
    assert chunk_ranges([1, 1], 10**9, counts) == [(0, 1), (1, 2)]
