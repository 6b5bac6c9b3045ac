"""A member's consumers across its truncation, with real hubs and logs on loopback: a
member back from a deposed leader's epoch holds a suffix the new leader never wrote; the
new leader's COMMIT reaches it before its HISTORY. Whatever the member shows its
consumers (``MemberCommitView`` raised by the replica runner's commits) never holds a
chunk of that suffix, and a reader attached before the cut reads on, without a gap,
into the new leader's chunks."""

from __future__ import annotations

import pytest

from tests.cluster.hub_helpers import STREAM, Cluster, Recorder, caught_up, until
from tests.log.acceptor_helpers import SMALL, replicate, write_leader_chunks
from tierlog.formats import replication as wire
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.server.member_view import MemberCommitView


@pytest.fixture
async def cluster():
    c = Cluster()
    yield c
    await c.stop()


def values(reader: LogReader) -> list[bytes]:
    return [bytes(data) for _, data in reader.records()]


async def test_a_commit_before_the_history_never_shows_the_cut_suffix(
    cluster: Cluster, tmp_path
) -> None:
    n1, n2 = [await cluster.add(n) for n in ("n1", "n2")]
    leader = StreamLog.create(str(tmp_path / "n1"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(leader, 8)
    member = StreamLog.create_follower(str(tmp_path / "n2" / STREAM), SMALL)
    replicate(leader, member)
    # the member led epoch 1 alone for a while: a suffix nobody else has
    member.close()
    member = StreamLog.open(member.stream_dir, SMALL, adopt_disk_epoch=True)
    for i in range(5):
        member.append([b"lost-%d" % i] * 3)
    member.sync()
    # n1 leads epoch 2 from the common prefix and commits past the member's suffix ids
    leader.start_epoch(2)
    for i in range(12):
        leader.append([b"new-%d" % i])
    leader.sync()
    commit = leader.commit_point().chunk_id
    assert commit > member.last_chunk_id
    view = MemberCommitView(member)
    early = LogReader(view, OffsetSpec.first())  # attached before anything was shown
    shown: list[list[bytes]] = []
    read_early: list[bytes] = []

    def on_commit(chunk_id: int) -> None:
        view.set_limit(chunk_id)
        shown.append(values(LogReader(view, OffsetSpec.first())))
        read_early.extend(values(early))

    n1.lead(STREAM, leader, 2, ("n2",), Recorder())
    n1.serve(STREAM)
    n1.set_commit(STREAM, commit)
    n2.follow(STREAM, member, on_commit=on_commit, on_truncate=view.truncated)
    n1.send("n2", wire.Commit(STREAM, 2, commit))  # before any fetch: before the HISTORY
    await until(caught_up(member, leader), what="truncate and catch up")
    await until(lambda: view.limit == commit, what="the commit shown")
    assert shown and not view.broken
    assert all(not v.startswith(b"lost") for records in shown for v in records)
    everything = values(LogReader(leader, OffsetSpec.first()))
    assert shown[-1] == everything
    assert read_early + values(early) == everything  # no gap, nothing twice
    n2.unfollow(STREAM)
    member.close()
    leader.close()
