"""The two write paths leave the same ``LogTail``: a replica that accepted a leader's
chunks verbatim has the leader's tail, and the state a cut reloads is the state a fresh
open recovers."""

from __future__ import annotations

from pathlib import Path

from tests.log.acceptor_helpers import SMALL, replicate, write_leader_chunks
from tierlog.log.writer import StreamLog


def test_a_replica_has_its_leaders_tail_and_a_cut_reloads_what_open_recovers(
    tmp_path: Path,
) -> None:
    leader = StreamLog.create(str(tmp_path / "leader"), "v", "s", SMALL, created_ns=1)
    leader.start_epoch(2)
    write_leader_chunks(leader, 30)
    leader.sync()
    follower = StreamLog.create_follower(str(tmp_path / "f" / "v_s_1"), SMALL)
    replicate(leader, follower)
    assert follower.log_tail == leader.log_tail
    assert follower.log_tail.first_timestamp > 0
    leader.start_epoch(3)
    write_leader_chunks(leader, 7, start=30)
    leader.sync()
    replicate(leader, follower)
    assert follower.log_tail == leader.log_tail
    assert (follower.epoch, follower.max_epoch) == (3, 3)

    follower.truncate_after(12)  # back into epoch 2: the writer's epoch stays 3
    cut = follower.log_tail
    assert cut.last_chunk_id <= 12 < cut.next_offset
    assert (cut.epoch, cut.max_epoch) == (3, 2)
    follower.close()
    reopened = StreamLog.open(follower.stream_dir, SMALL, adopt_disk_epoch=True)
    assert (reopened.log_tail.next_offset, reopened.log_tail.last_chunk_id) == (
        cut.next_offset,
        cut.last_chunk_id,
    )
    assert reopened.log_tail.last_timestamp == cut.last_timestamp
    assert reopened.log_tail.first_timestamp == cut.first_timestamp
    reopened.close()
    leader.close()
