"""Writes of many chunks at once: a replica far behind appends thousands of its
leader's chunks in one ``accept_chunks`` call, which must split into write calls
within the kernel's iovec limit (``IOV_MAX``, 1,024 on Linux: one more is EINVAL) and a
byte limit, and continue after short writes."""

from __future__ import annotations

import os

import pytest

import tierlog.log.segments as segments
from tests.log.acceptor_helpers import span_bytes, stream_files
from tierlog.log.config import LogConfig
from tierlog.log.segments import IOV_MAX, pwrite_all, write_all
from tierlog.log.writer import StreamLog

# one segment holds every chunk: the acceptor hands the whole range to one write
BIG = LogConfig(max_segment_chunks=100_000, max_segment_bytes=1 << 30)


def test_accepting_more_chunks_than_iov_max_in_one_call(tmp_path):
    leader = StreamLog.create(str(tmp_path / "leader"), "v", "s", BIG, created_ns=1)
    count = IOV_MAX * 2 + 500  # one chunk per message, as a publisher waiting for confirms
    for i in range(count):
        leader.append_records([b"m-%06d" % i])
    leader.sync()
    data, next_offset = span_bytes(leader, 0, 64 << 20)
    assert next_offset == leader.next_offset == count  # the whole log in one range
    follower = StreamLog.create_follower(str(tmp_path / "f" / "v_s_1"), BIG)
    assert follower.accept_chunks(data) == count
    follower.sync_to_disk()
    assert follower.tail() == leader.tail()
    follower.close()
    assert stream_files(follower.stream_dir) == stream_files(leader.stream_dir)
    reopened = StreamLog.open(follower.stream_dir, BIG, adopt_disk_epoch=True)
    assert reopened.next_offset == count
    reopened.close()
    leader.close()


def test_vectored_writes_split_by_parts_and_bytes_and_survive_short_writes(tmp_path, monkeypatch):
    parts = [bytes([i % 256]) * (1 + i % 7) for i in range(3000)]
    parts[10] = b""  # an empty part is skipped
    parts[20] = b"x" * 5000  # a part larger than a call's byte limit is sliced
    expected = b"".join(parts)
    calls: list[tuple[int, int]] = []
    real_pwritev, real_writev = os.pwritev, os.writev

    def short_pwritev(fd, buffers, position):
        calls.append((len(buffers), sum(map(len, buffers))))
        assert len(buffers) <= IOV_MAX
        # the kernel may stop early: write at most 777 bytes
        return real_pwritev(fd, [b"".join(bytes(b) for b in buffers)[:777]], position)

    def short_writev(fd, buffers):
        calls.append((len(buffers), sum(map(len, buffers))))
        assert len(buffers) <= IOV_MAX
        return real_writev(fd, [b"".join(bytes(b) for b in buffers)[:555]])

    monkeypatch.setattr(segments, "WRITE_CALL_BYTES", 2048)
    monkeypatch.setattr(segments.os, "pwritev", short_pwritev)
    monkeypatch.setattr(segments.os, "writev", short_writev)
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"H" * 10, 0)
        pwrite_all(fd, parts, 10)
        assert os.pread(fd, len(expected) + 20, 10) == expected
        assert all(size <= 2048 for _, size in calls)
        calls.clear()
        os.lseek(fd, 0, os.SEEK_END)
        write_all(fd, parts)
        assert os.pread(fd, 2 * len(expected) + 20, 10) == expected + expected
    finally:
        os.close(fd)
    assert calls


def test_a_write_call_that_writes_nothing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(segments.os, "pwritev", lambda fd, buffers, position: 0)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            pwrite_all(fd, [b"abc"], 0)
    finally:
        os.close(fd)
