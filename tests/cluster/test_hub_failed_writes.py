"""A member whose fdatasync fails, between in-process hubs on loopback with real logs.

The fault is injected at the system call: the member's ``fdatasync`` fails with EIO and
the pages written since its last good one are lost (the file is cut back to what was
durable), which is what the disk shows after a failed writeback and a power loss. The
member must then report (``WRITTEN``, the tail of its fetches) only what is on its disk,
so the leader never counts a lost chunk toward a commit; recover its log in place; and
replicate again, with no restart, once the disk accepts writes. The chunks before a
refused one are reported only once they are fsynced."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

import tierlog.log.segments as segments
from tests.cluster.hub_helpers import (
    STREAM,
    Recorder,
    caught_up,
    lead_and_follow,
    leader_log,
    member_log,
    until,
)
from tests.log.acceptor_helpers import stream_files, write_leader_chunks
from tierlog.formats.chunk import decode_header
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log import member_epoch
from tierlog.log.errors import BadChunkError
from tierlog.log.writer import StreamLog
from tierlog.server.member_reads import MemberBound


class LosingDisk:
    """``os.fdatasync`` for one directory fails (EIO) while ``failing``, losing the
    pages written since the log's last durable point; every other file syncs for real."""

    def __init__(self, directory: str, log: StreamLog) -> None:
        self.directory = directory
        self.log = log
        self.failing = False
        self.failures = 0
        self._real: Callable[[int], None] = os.fdatasync

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not self.failing or not path.startswith(self.directory):
            self._real(fd)
            return
        durable = self.log.durable_point()
        in_durable_segment = os.path.basename(path) == f"{durable.segment_first_offset:020}.segment"
        os.ftruncate(fd, durable.end_position if in_durable_segment else FILE_HEADER_SIZE)
        self.failures += 1
        raise OSError(5, "Input/output error")


async def test_a_member_reports_only_what_reached_its_disk_and_recovers_in_place(
    hubs, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    n1, n2 = [await hubs.add(n, retry_delay=0.05) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 20)
    member = member_log(tmp_path, "n2")
    recorder = lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="the member catching up")
    await until(lambda: recorder.written.get("n2") == leader.last_chunk_id, what="WRITTEN")
    on_disk = member.durable_point().chunk_id
    disk = LosingDisk(os.path.dirname(member.stream_dir), member)
    monkeypatch.setattr(segments.os, "fdatasync", disk)
    disk.failing = True
    heard: list[int] = []
    # the leader goes on; every fdatasync of the member fails and loses its pages
    for start in (20, 30, 40):
        write_leader_chunks(leader, 10, start=start)
        n1.wake(STREAM)
        for _ in range(20):
            heard.append(recorder.written.get("n2", -1))
            await asyncio.sleep(0.02)
    heard.append(recorder.written.get("n2", -1))
    assert disk.failures >= 1
    # nothing the leader heard from the member names a chunk that is not on its disk
    assert max(heard) == on_disk, (max(heard), on_disk)
    # the member keeps trying (its log recovered in place each time), never stuck
    await until(lambda: disk.failures >= 3, what="repeated failed fdatasyncs")
    assert recorder.written.get("n2") == on_disk
    status = n2.replica_status(STREAM)
    assert status is not None and status.state == "failed"
    assert status.last_error is not None and "Input/output error" in status.last_error
    assert status.written_chunk_id == on_disk and status.failures >= 1
    # the disk heals: the same process, the same log object, replicates again
    disk.failing = False
    await until(caught_up(member, leader), what="the member catching up after the fault")
    await until(lambda: recorder.written.get("n2") == leader.last_chunk_id, what="WRITTEN")
    status = n2.replica_status(STREAM)
    assert status is not None and status.last_error is None and status.recoveries >= 1
    assert status.state in ("following", "catching-up")
    leader.sync()
    assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    n2.unfollow(STREAM)
    member.close()
    leader.close()


class DurabilityCheck(Recorder):
    """A leader listener that checks, whenever the member reports a chunk as written
    (``WRITTEN`` or a fetch's tail), that the member's log has it fsynced."""

    def __init__(self, member: StreamLog) -> None:
        super().__init__()
        self.member = member
        self.not_on_disk: list[tuple[int, int]] = []

    def member_written(self, member: str, chunk_id: int, epoch: int) -> None:
        durable = self.member.durable_point().chunk_id
        if chunk_id > durable:
            self.not_on_disk.append((chunk_id, durable))
        super().member_written(member, chunk_id, epoch)


async def test_chunks_before_a_refused_one_are_reported_only_once_fsynced(hubs, tmp_path):
    n1, n2 = [await hubs.add(n, retry_delay=0.05) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 20)
    member = member_log(tmp_path, "n2")
    real_accept = member.accept_chunks
    refused: list[int] = []

    def refusing_after_three(data, **options):
        # the first range: three good chunks are written, then one is refused (as a
        # damaged chunk from the leader would be)
        if refused:
            return real_accept(data, **options)
        view = memoryview(data)
        end = 0
        for _ in range(3):
            end += decode_header(view, end).total_size
        next_offset = real_accept(view[:end], **options)
        refused.append(next_offset)
        raise BadChunkError("injected: the fourth chunk is refused", next_offset)

    member.accept_chunks = refusing_after_three  # type: ignore[method-assign]
    check = DurabilityCheck(member)
    n1.lead(STREAM, leader, 1, ("n2",), check)
    n1.serve(STREAM)
    n2.follow(STREAM, member, "n1", 1)
    await until(caught_up(member, leader), what="the member catching up after a refusal")
    await until(lambda: check.written.get("n2") == leader.last_chunk_id, what="WRITTEN")
    assert refused and check.written["n2"] == leader.last_chunk_id
    assert check.not_on_disk == []
    n2.unfollow(STREAM)
    member.close()
    leader.close()


@pytest.mark.parametrize("written", [False, True], ids=["refused", "written-then-failed"])
async def test_a_member_failed_once_while_caught_up_serves_again_without_new_data(
    hubs, tmp_path, monkeypatch: pytest.MonkeyPatch, written: bool
):
    """A failure that loses nothing while the member holds the leader's whole log, on
    an idle stream: the member epoch file of a new leader's epoch could not be written
    once (a full disk for a moment), or was written but its fsync failed. The member
    recovers in place and follows the leader again; with no new chunk there is no
    chunk write to succeed, so the epoch written on the retry, or the leader's answer
    that the member holds everything, must end the failed state, or the member's bound
    (``server.member_reads``) refuses its consumers for as long as nothing is
    published."""
    n1, n2 = [await hubs.add(n, retry_delay=0.05) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 10)
    member = member_log(tmp_path, "n2")
    recorder = lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="the member catching up")
    real = member_epoch.persist_member_epoch
    refused: list[int] = []

    def full_once(directory: str, epoch: int) -> None:
        if not refused:
            refused.append(epoch)
            if written:
                real(directory, epoch)
                raise OSError(5, "Input/output error")
            raise OSError(28, "No space left on device")
        real(directory, epoch)

    monkeypatch.setattr(member_epoch, "persist_member_epoch", full_once)
    n1.unlead(STREAM)  # a new epoch of the same leader, nothing new written
    n1.lead(STREAM, leader, 2, ("n2",), recorder)
    n1.serve(STREAM)
    n2.follow(STREAM, member, "n1", 2)
    followed = n2.followed[STREAM]
    await until(lambda: followed.recoveries >= 1, what="the failed epoch write, recovered")
    await until(lambda: followed.failures == 0, timeout=5.0, what="the failed state to end")
    status = n2.replica_status(STREAM)
    assert status is not None and status.state == "following" and status.epoch == 2
    assert status.last_error is None and status.recoveries >= 1
    assert MemberBound(heard_within=5.0).refusal(status, 0.0) is None
    assert member.read_member_epoch() == 2
    n2.unfollow(STREAM)
    member.close()
    leader.close()
