"""Random interleavings of leader writes, verbatim replication in random spans, a
replica's own (divergent) writes, truncations and reopens: whenever the replica holds a
prefix of the leader's log, its segment and index files are exactly the leader's files
for that prefix (the same files, the last one cut where the prefix ends), as if the
chunks had been written there directly."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.log.acceptor_helpers import SMALL, span_bytes, stream_files, write_leader_chunks
from tierlog.log.writer import StreamLog


class ReplicaMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="acceptor-stateful-")
        self.leader = StreamLog.create(os.path.join(self.root, "l"), "v", "s", SMALL, created_ns=1)
        self.replica = StreamLog.create_follower(os.path.join(self.root, "r", "v_s_1"), SMALL)
        self.written = 0
        self.leader_chunks: list[int] = []  # chunk ids of the leader's log, in order
        self.common = 0  # the replica holds the leader's first ``common`` chunks
        self.own = 0  # then ``own`` chunks of its own (a divergent suffix)

    def teardown(self) -> None:
        self.leader.close()
        self.replica.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(n=st.integers(1, 8))
    def leader_writes(self, n: int) -> None:
        before = self.leader.next_offset
        write_leader_chunks(self.leader, n, start=self.written)
        self.written += n
        offset = before
        while (got := span_bytes(self.leader, offset, 1)) is not None:
            self.leader_chunks.append(offset)
            offset = got[1]

    @precondition(lambda self: self.own == 0 and self.common < len(self.leader_chunks))
    @rule(max_bytes=st.integers(1, 3000), spans=st.integers(1, 4))
    def replicate(self, max_bytes: int, spans: int) -> None:
        for _ in range(spans):
            got = span_bytes(self.leader, self.replica.next_offset, max_bytes)
            if got is None:
                break
            data, next_offset = got
            assert self.replica.accept_chunks(data) == next_offset
            self.common = (
                self.leader_chunks.index(next_offset)
                if next_offset in (self.leader_chunks)
                else len(self.leader_chunks)
            )
        self.replica.sync_to_disk()

    @rule(n=st.integers(1, 4))
    def replica_writes_its_own(self, n: int) -> None:
        for i in range(n):
            self.replica.append([b"own-%d" % i])
        self.own += n

    @rule(pick=st.integers(0, 10**6))
    def truncate(self, pick: int) -> None:
        held = self.common + self.own
        if not held:
            return
        keep = pick % (held + 1)  # chunks to keep: 0 .. all
        if keep <= self.common:
            keep_through = self.leader_chunks[keep - 1] if keep else -1
            self.replica.truncate_after(keep_through)
            self.common, self.own = keep, 0
        else:
            own_ids = self._own_chunk_ids()
            self.replica.truncate_after(own_ids[keep - self.common - 1])
            self.own = keep - self.common
            assert self.replica.epoch_history()[-1][2] == own_ids[keep - self.common - 1]

    def _own_chunk_ids(self) -> list[int]:
        """The chunk ids of the replica's own chunks (after the common prefix)."""
        offset = self._prefix_end()
        ids = []
        while (got := span_bytes(self.replica, offset, 1)) is not None:
            ids.append(offset)
            offset = got[1]
        return ids

    def _prefix_end(self) -> int:
        if not self.common:
            return 0
        return span_bytes(self.leader, self.leader_chunks[self.common - 1], 1)[1]

    @rule()
    def reopen(self) -> None:
        self.replica.close()
        self.replica = StreamLog.open(self.replica.stream_dir, SMALL, adopt_disk_epoch=True)

    @invariant()
    def files_are_the_leaders_prefix(self) -> None:
        if self.own:
            return
        self.leader.sync()
        end = self._prefix_end()
        assert self.replica.next_offset == end
        mine = stream_files(self.replica.stream_dir)
        theirs = stream_files(self.leader.stream_dir)
        if not self.common:
            assert set(mine) == {f"{0:020d}.segment", f"{0:020d}.index"}
            assert all(len(raw) == 8 for raw in mine.values())
            return
        last_segment = max(int(name[:20]) for name in mine)
        expected_names = {n for n in theirs if int(n[:20]) <= last_segment}
        assert set(mine) == expected_names
        for name, raw in mine.items():
            if int(name[:20]) < last_segment:
                assert raw == theirs[name], name
            else:
                assert raw == theirs[name][: len(raw)], name
        span = self.replica.chunk_span(last_segment, 10**9)
        assert span is not None and span.next_offset == end


TestReplicaMachine = ReplicaMachine.TestCase
TestReplicaMachine.settings = settings(settings.default, stateful_step_count=25)
