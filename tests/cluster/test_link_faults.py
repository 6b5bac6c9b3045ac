"""Faults inside the replication runtime itself: a loop without ``sendfile`` (uvloop),
a link whose writer fails, and a lost fetch while the leader keeps talking (a
``COMMIT``, a late answer to an earlier fetch): none may stall a member."""

from __future__ import annotations

import uvloop

from tests.cluster.hub_helpers import (
    STREAM,
    Cluster,
    Recorder,
    caught_up,
    lead_and_follow,
    leader_log,
    member_log,
    until,
)
from tests.log.acceptor_helpers import stream_files, write_leader_chunks
from tierlog.cluster.fetch_server import LedStream
from tierlog.cluster.link import Link
from tierlog.formats import replication as wire


async def _replicate_two_rounds(tmp_path) -> None:
    cluster = Cluster()
    try:
        n1, n2 = [await cluster.add(n) for n in ("n1", "n2")]
        leader = leader_log(tmp_path)
        write_leader_chunks(leader, 20)
        member = member_log(tmp_path, "n2")
        lead_and_follow(n1, n2, leader, member)
        await until(caught_up(member, leader), what="catching up")
        write_leader_chunks(leader, 20, start=20)
        n1.wake(STREAM)
        await until(caught_up(member, leader), what="following")
        leader.sync()
        assert len(leader.list_segments()) > 3
        assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
        assert n1.send_failures == 0
        n2.unfollow(STREAM)
        member.close()
        leader.close()
    finally:
        await cluster.stop()


def test_replication_under_uvloop_copies_files_byte_identical(tmp_path):
    # uvloop has no loop.sendfile: chunk data is read and written in pieces instead
    uvloop.run(_replicate_two_rounds(tmp_path))


async def test_a_failed_writer_closes_the_link_and_replication_resumes(hubs, tmp_path, monkeypatch):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 20)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    original = Link._send_file
    failures = {"left": 1}

    async def failing_once(self, loop, writer, f, position, length):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError("disk read failed under the writer")
        return await original(self, loop, writer, f, position, length)

    monkeypatch.setattr(Link, "_send_file", failing_once)
    member = member_log(tmp_path, "n2")
    n2.follow(STREAM, member, "n1", 1)
    await until(caught_up(member, leader), what="catching up over a new link")
    assert failures["left"] == 0
    assert n1.send_failures == 1  # visible, not a silently dead writer task
    leader.sync()
    assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_a_lost_fetch_is_sent_again_despite_commits_and_late_answers(
    hubs, tmp_path, monkeypatch
):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 10)
    member = member_log(tmp_path, "n2")
    lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="catching up")
    first_chunk = 0
    stale = wire.Chunks(STREAM, 1, first_chunk, 1, 0, 1, b"not a chunk that continues")
    original = LedStream.on_fetch
    dropped = {"count": 0}

    def drop_and_chatter(self, link, fetch):
        if dropped["count"] < 3:
            # the fetch is lost; the leader still sends a COMMIT and a late answer to
            # an earlier fetch on the same link
            dropped["count"] += 1
            link.send(wire.Commit(STREAM, 1, leader.last_chunk_id))
            link.send(stale)
            return
        original(self, link, fetch)

    monkeypatch.setattr(LedStream, "on_fetch", drop_and_chatter)
    followed = n2.followed[STREAM]
    followed.refetch()  # a fetch now: it is lost
    write_leader_chunks(leader, 10, start=10)
    n1.wake(STREAM)
    await until(caught_up(member, leader), timeout=20, what="following after lost fetches")
    assert dropped["count"] == 3
    assert followed.fetch_timeouts >= 2  # the first drop was answered by a heartbeat
    n2.unfollow(STREAM)
    member.close()
    leader.close()
