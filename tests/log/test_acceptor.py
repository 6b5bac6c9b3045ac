"""The acceptor path: verbatim chunks from a leader give byte-identical segment and
index files (segment rolls included), typed refusals, truncation, late joiners, the
epoch history and the persisted member epoch."""

from __future__ import annotations

import os

import pytest

from tests.log.acceptor_helpers import (
    SMALL,
    replicate,
    span_bytes,
    stream_files,
    write_leader_chunks,
)
from tierlog.formats.chunk import HEADER_SIZE, encode_chunk
from tierlog.log.errors import (
    BadChunkError,
    ChunkGapError,
    ChunkNotLocalError,
    ChunkOverlapError,
    LateJoinError,
    MemberEpochCorruptError,
    OlderEpochChunkError,
    StaleEpochError,
    SyncFailedError,
    TruncateBelowTieredError,
)
from tierlog.log.member_epoch import member_epoch_path
from tierlog.log.writer import StreamLog


@pytest.fixture
def leader(tmp_path):
    log = StreamLog.create(str(tmp_path / "leader"), "v", "s", SMALL, created_ns=1)
    yield log
    log.close()


def follower_log(tmp_path, name: str = "follower") -> StreamLog:
    return StreamLog.create_follower(str(tmp_path / name / "v_s_1"), SMALL)


def test_replicated_files_are_byte_identical_across_rolls(leader, tmp_path):
    write_leader_chunks(leader, 40)
    follower = follower_log(tmp_path)
    assert replicate(leader, follower) > 3
    assert len(leader.list_segments()) > 3  # rolls happened
    assert follower.next_offset == leader.next_offset
    assert follower.epoch_history() == leader.epoch_history()
    assert follower.tail() == leader.tail()
    assert follower.producer_sequence("prod") == leader.producer_sequence("prod")
    assert follower.query_offset("consumer-a") == leader.query_offset("consumer-a")
    leader.sync()
    assert stream_files(follower.stream_dir) == stream_files(leader.stream_dir)
    # more chunks later, one chunk per span
    write_leader_chunks(leader, 13, start=40)
    replicate(leader, follower, max_bytes=1)
    leader.sync()
    follower.close()
    assert stream_files(follower.stream_dir) == stream_files(leader.stream_dir)
    # reopened: history rebuilt from the index files
    reopened = StreamLog.open(follower.stream_dir, SMALL, adopt_disk_epoch=True)
    assert reopened.epoch_history() == leader.epoch_history()
    assert reopened.producer_sequence("prod") == leader.producer_sequence("prod")
    reopened.close()


def test_refusals_are_typed_and_keep_the_log(leader, tmp_path):
    write_leader_chunks(leader, 10)
    follower = follower_log(tmp_path)
    first, after_first = span_bytes(leader, 0, 1)
    second, _ = span_bytes(leader, after_first, 1)
    with pytest.raises(LateJoinError):
        follower.accept_chunks(second)  # an empty log at 0, not a snapshot
    follower.accept_chunks(first)
    third, _ = span_bytes(leader, span_bytes(leader, after_first, 1)[1], 1)
    with pytest.raises(ChunkGapError):
        follower.accept_chunks(third)
    with pytest.raises(ChunkOverlapError):
        follower.accept_chunks(first)
    bad = bytearray(second)
    bad[-1] ^= 0xFF
    with pytest.raises(BadChunkError):
        follower.accept_chunks(bytes(bad))
    with pytest.raises(BadChunkError):
        follower.accept_chunks(second[:-3])
    with pytest.raises(BadChunkError):
        follower.accept_chunks(second + b"\x50\x00")
    assert follower.next_offset > after_first  # the whole chunk before the torn bytes
    follower.sync_to_disk()
    follower.close()
    follower = StreamLog.open(follower.stream_dir, SMALL, adopt_disk_epoch=True)
    assert follower.next_offset > after_first
    follower.close()


def test_a_refused_chunk_keeps_the_chunks_before_it(leader, tmp_path):
    write_leader_chunks(leader, 4)
    follower = follower_log(tmp_path)
    data, next_offset = span_bytes(leader, 0, 10_000)
    bad = bytearray(data)
    bad[-1] ^= 0xFF  # last chunk's trailer or data
    with pytest.raises(BadChunkError) as info:
        follower.accept_chunks(bytes(bad))
    assert 0 < info.value.next_offset == follower.next_offset < next_offset
    follower.close()


def test_older_epoch_refused_and_new_epoch_accepted(tmp_path):
    leader = StreamLog.create(str(tmp_path / "l"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(leader, 3)
    follower = follower_log(tmp_path)
    replicate(leader, follower)
    leader.start_epoch(3)
    write_leader_chunks(leader, 3, start=3)
    replicate(leader, follower)
    assert follower.tail()[0] == 3
    assert [r[0] for r in follower.epoch_history()] == [1, 3]
    # a deposed epoch-2 leader's chunk continuing the log exactly
    stale = encode_chunk(0, follower.next_offset, 2, 2**42, [b"stale"])
    with pytest.raises(OlderEpochChunkError):
        follower.accept_chunks(stale)
    assert follower.accept_chunks(encode_chunk(0, follower.next_offset, 4, 2**42, [b"new"])) > 0
    assert follower.tail()[0] == 4
    with pytest.raises(StaleEpochError):
        follower.start_epoch(2)
    leader.close()
    follower.close()


def test_truncate_matches_a_log_that_never_had_the_suffix(leader, tmp_path):
    write_leader_chunks(leader, 30)
    follower = follower_log(tmp_path)
    replicate(leader, follower)
    history = leader.epoch_history()
    chunk_ids = []
    offset = 0
    while (got := span_bytes(leader, offset, 1)) is not None:
        chunk_ids.append(offset)
        offset = got[1]
    for keep in (chunk_ids[20], chunk_ids[11], chunk_ids[6], chunk_ids[0], -1):
        new_next = follower.truncate_after(keep)
        expected = follower_log(tmp_path, f"expected-{keep}")
        while expected.next_offset < new_next:
            data, _ = span_bytes(leader, expected.next_offset, 1)
            expected.accept_chunks(data)
        expected.sync_to_disk()
        assert expected.next_offset == new_next
        assert follower.epoch_history() == expected.epoch_history()
        assert follower.producer_sequence("prod") == expected.producer_sequence("prod")
        assert stream_files(follower.stream_dir) == stream_files(expected.stream_dir)
        expected.close()
    assert follower.next_offset == 0 and follower.tail() == (0, -1)
    # and it replicates again from there
    replicate(leader, follower)
    leader.sync()
    assert stream_files(follower.stream_dir) == stream_files(leader.stream_dir)
    assert history == follower.epoch_history()
    follower.close()


def test_truncate_refuses_below_the_tiered_offset(leader, tmp_path):
    write_leader_chunks(leader, 10)
    follower = follower_log(tmp_path)
    replicate(leader, follower)
    follower.set_tiered_offset(5)
    with pytest.raises(TruncateBelowTieredError):
        follower.truncate_after(0)
    assert follower.next_offset == leader.next_offset
    follower.close()


def test_late_joiner_starts_at_a_snapshot(leader, tmp_path):
    write_leader_chunks(leader, 40)
    segments = leader.list_segments()
    join = segments[3].first_offset
    data, _ = span_bytes(leader, join, 1)
    follower = StreamLog.create_follower(str(tmp_path / "late" / "v_s_1"), SMALL, first_chunk=data)
    assert follower.first_offset == join
    replicate(leader, follower)
    leader.sync()
    leader_files = stream_files(leader.stream_dir)
    follower_files = stream_files(follower.stream_dir)
    assert set(follower_files) == {n for n in leader_files if int(n[:20]) >= join}
    assert all(follower_files[n] == leader_files[n] for n in follower_files)
    assert follower.producer_sequence("prod") == leader.producer_sequence("prod")
    assert follower.query_offset("consumer-a") == leader.query_offset("consumer-a")
    follower.close()
    # an empty log only starts past its next offset at a tracking snapshot
    other = follower_log(tmp_path, "other")
    user_chunk, _ = span_bytes(leader, leader.list_segments()[3].first_offset + 0, 1)
    not_snapshot = span_bytes(leader, _second_chunk(leader, join), 1)[0]
    with pytest.raises(LateJoinError):
        other.accept_chunks(not_snapshot)
    other.accept_chunks(user_chunk)  # a snapshot: accepted, the segment moved
    assert other.first_offset == join
    other.close()
    reopened = StreamLog.open(other.stream_dir, SMALL, adopt_disk_epoch=True)
    assert reopened.first_offset == join and reopened.last_chunk_id == join
    reopened.close()


def _second_chunk(log: StreamLog, first: int) -> int:
    return span_bytes(log, first, 1)[1]


def test_chunk_span_bounds(leader):
    write_leader_chunks(leader, 12)
    assert leader.chunk_span(leader.next_offset, 100) is None
    with pytest.raises(ChunkNotLocalError):
        leader.chunk_span(leader.next_offset + 5, 100)
    span = leader.chunk_span(0, 10**6)
    assert span.first_chunk_id == 0 and span.position == 8
    assert span.length == os.path.getsize(span.segment_path) - 8  # the whole sealed segment
    one = leader.chunk_span(0, 1)
    assert one.chunk_count == 1 and one.length >= HEADER_SIZE
    with pytest.raises(ChunkNotLocalError):
        leader.chunk_span(1 if one.next_offset != 1 else 2, 100)


def test_member_epoch_file(leader):
    assert leader.read_member_epoch() == 0
    leader.persist_member_epoch(7)
    assert leader.read_member_epoch() == 7
    leader.persist_member_epoch(9)
    assert leader.read_member_epoch() == 9
    path = member_epoch_path(leader.stream_dir)
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    raw[10] ^= 1
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(MemberEpochCorruptError):
        leader.read_member_epoch()
    with open(path, "wb") as f:
        f.write(raw[:5])
    with pytest.raises(MemberEpochCorruptError):
        leader.read_member_epoch()


def test_late_joiner_at_a_segment_start_without_tracking(tmp_path):
    leader = StreamLog.create(str(tmp_path / "l"), "v", "s", SMALL, created_ns=1)
    for i in range(30):
        leader.append_records([b"r-%d" % i] * 3)  # no producer, no offsets: no snapshots
    segment = leader.list_segments()[2]
    data, _ = span_bytes(leader, segment.first_offset, 10**6)
    joiner = follower_log(tmp_path, "j")
    with pytest.raises(LateJoinError):
        joiner.accept_chunks(data)
    joiner.accept_chunks(data, segment_start=True)
    replicate(leader, joiner)
    leader.sync()
    leader_files = stream_files(leader.stream_dir)
    joined = stream_files(joiner.stream_dir)
    assert joined == {n: b for n, b in leader_files.items() if int(n[:20]) >= segment.first_offset}
    joiner.close()
    leader.close()


def test_a_failed_write_refuses_more_until_reopened(leader, tmp_path, monkeypatch):
    write_leader_chunks(leader, 6)
    follower = follower_log(tmp_path)
    first, after = span_bytes(leader, 0, 1)
    follower.accept_chunks(first)
    rest, _ = span_bytes(leader, after, 10**6)
    import tierlog.log.segments as segments

    def no_space(fd, parts):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segments, "write_all", no_space)
    with pytest.raises(SyncFailedError):
        follower.accept_chunks(rest)
    monkeypatch.undo()
    with pytest.raises(SyncFailedError):
        follower.accept_chunks(rest)
    follower.close()
    reopened = StreamLog.open(follower.stream_dir, SMALL, adopt_disk_epoch=True)
    assert reopened.next_offset in (after, leader.next_offset)
    replicate(leader, reopened)
    leader.sync()
    assert stream_files(reopened.stream_dir) == stream_files(leader.stream_dir)
    reopened.close()


def test_a_failed_fdatasync_is_recovered_in_place_from_what_the_disk_holds(
    leader, tmp_path, monkeypatch
):
    write_leader_chunks(leader, 30)
    follower = follower_log(tmp_path)
    first, after = span_bytes(leader, 0, 200)
    follower.accept_chunks(first)
    follower.sync_to_disk()
    durable = follower.durable_point()
    rest, _ = span_bytes(leader, after, 700)  # the rest of the same segment
    import tierlog.log.segments as segments

    real_fdatasync = os.fdatasync
    lost: list[int] = []

    def lost_pages(fd):
        # the writeback failed: the pages written since the last fdatasync never
        # reached the disk (what power loss after this would show)
        os.ftruncate(fd, durable.end_position)
        lost.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(segments.os, "fdatasync", lost_pages)
    follower.accept_chunks(rest)
    assert follower.next_offset > durable.next_offset  # written, not durable
    with pytest.raises(SyncFailedError):
        follower.sync_to_disk()
    assert follower.write_failed
    with pytest.raises(SyncFailedError):
        follower.accept_chunks(rest)
    monkeypatch.setattr(segments.os, "fdatasync", real_fdatasync)
    # in place: the same object, writable again, at what the disk holds
    assert follower.recover_after_failure() == durable.next_offset
    assert not follower.write_failed
    assert follower.durable_point().chunk_id == follower.last_chunk_id == durable.chunk_id
    replicate(leader, follower)
    leader.sync()
    assert stream_files(follower.stream_dir) == stream_files(leader.stream_dir)
    assert lost
    follower.close()
