"""The hub driven by the real ``LeaderState`` in process: election (adoption, catch-up
from the most up-to-date member, the epoch's tracking snapshot), commit from members'
acks, the commit shown on members, and a failover to a new leader that keeps every
committed chunk. This is the shape of the server's integration, without processes."""

from __future__ import annotations

import asyncio
import time

from tests.cluster.hub_helpers import STREAM, Cluster, until
from tests.log.acceptor_helpers import SMALL, stream_files, write_leader_chunks
from tierlog.cluster.hub import ReplicationHub
from tierlog.cluster.log_history import Tail
from tierlog.cluster.members import Membership
from tierlog.cluster.state import (
    AppendTrackingSnapshot,
    CatchUp,
    CatchUpFailed,
    CaughtUp,
    Commit,
    Effect,
    EpochAdopted,
    EpochRefused,
    LeaderState,
    LeaseTiming,
    LocalWritten,
    MemberAcked,
    RequestAdopt,
    StepDown,
)
from tierlog.log.writer import StreamLog

VOTERS = Membership(("n1", "n2", "n3"))
TIMING = LeaseTiming(ttl=30.0, drift=3.0)


class Driver:
    """A node's leadership of the stream: LeaderState's effects carried out on the hub."""

    def __init__(self, node: str, hub: ReplicationHub, log: StreamLog, epoch: int) -> None:
        self.node, self.hub, self.log, self.epoch = node, hub, log, epoch
        self.commits: list[int] = []
        self.stepped_down: str | None = None
        self.tasks: list[asyncio.Task[None]] = []
        log.persist_member_epoch(epoch)
        epoch_of_tail, last = log.tail()
        self.state = LeaderState(
            node, epoch, VOTERS, Tail(epoch_of_tail, last), TIMING, time.monotonic()
        )
        hub.lead(STREAM, log, epoch, tuple(m for m in VOTERS.members if m != node), self)
        self.apply(self.state.start(time.monotonic()))

    # LeaderListener
    def member_written(self, member: str, chunk_id: int, epoch: int) -> None:
        self.feed(MemberAcked(member, epoch, chunk_id))

    def member_adopted(
        self, member: str, epoch: int, highest: int, tail_epoch: int, tail_chunk_id: int
    ) -> None:
        self.feed(EpochAdopted(member, epoch, Tail(tail_epoch, tail_chunk_id)))

    def member_refused(self, member: str, highest_epoch: int) -> None:
        self.feed(EpochRefused(member, highest_epoch))

    def feed(self, event: object) -> None:
        self.apply(self.state.handle(event, time.monotonic()))  # type: ignore[arg-type]

    def local_written(self) -> None:
        durable = self.log.durable_point()
        self.feed(LocalWritten(durable.chunk_id, self.log.tail()[0]))

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, RequestAdopt):
                self.hub.request_adopt(STREAM, effect.epoch, effect.members)
            elif isinstance(effect, CatchUp):
                self.tasks.append(asyncio.create_task(self._catch_up(effect)))
            elif isinstance(effect, AppendTrackingSnapshot):
                self.log.start_epoch(effect.epoch)
                self.log.sync_to_disk()
                self.hub.serve(STREAM)
                self.local_written()
            elif isinstance(effect, Commit):
                self.commits.append(effect.chunk_id)
                self.hub.set_commit(STREAM, effect.chunk_id)
            elif isinstance(effect, StepDown):
                self.stepped_down = effect.reason

    async def _catch_up(self, effect: CatchUp) -> None:
        try:
            tail = await self.hub.catch_up(
                STREAM, effect.source, (effect.tail.epoch, effect.tail.chunk_id)
            )
        except Exception as exc:
            self.feed(CatchUpFailed(str(exc)))
            return
        self.feed(CaughtUp(Tail(*tail)))

    def write(self, count: int, start: int) -> None:
        write_leader_chunks(self.log, count, start=start)
        self.log.sync_to_disk()
        self.hub.wake(STREAM)
        self.local_written()


async def test_election_commit_and_failover_through_the_hub(tmp_path):
    cluster = Cluster()
    logs = {n: StreamLog.create_follower(str(tmp_path / n / STREAM), SMALL) for n in VOTERS.members}
    shown: dict[str, list[int]] = {n: [] for n in VOTERS.members}
    try:
        hubs = {n: await cluster.add(n) for n in VOTERS.members}
        for n in ("n2", "n3"):
            hubs[n].follow(STREAM, logs[n], on_commit=shown[n].append)
        # n1 acquired epoch 1: adoption by a majority, then its snapshot, then publishes
        n1 = Driver("n1", hubs["n1"], logs["n1"], 1)
        await until(lambda: n1.state.accepts_appends, what="n1 elected")
        n1.write(25, 0)
        last = logs["n1"].last_chunk_id
        await until(lambda: n1.commits and n1.commits[-1] == last, what="commit in epoch 1")
        await until(lambda: shown["n2"] and shown["n2"][-1] == last, what="n2 shows the commit")
        committed = last
        # n1 writes more that reaches only n3, then dies
        hubs["n2"].unfollow(STREAM)
        n1.write(5, 25)
        await until(
            lambda: logs["n3"].durable_point().next_offset == logs["n1"].next_offset,
            what="n3 has n1's latest chunks",
        )
        uncommitted_tail = logs["n1"].last_chunk_id
        await hubs["n1"].stop()
        # n2 acquires epoch 2 (n2's tail is behind n3's): catch up from n3, then lead
        n2 = Driver("n2", hubs["n2"], logs["n2"], 2)
        await until(lambda: n2.state.accepts_appends, what="n2 elected and caught up")
        assert logs["n2"].tail()[0] == 2
        n2.write(5, 100)
        last = logs["n2"].last_chunk_id
        await until(lambda: n2.commits and n2.commits[-1] == last, what="commit in epoch 2")
        await until(lambda: shown["n3"] and shown["n3"][-1] == last, what="n3 shows it")
        logs["n2"].sync()
        await until(
            lambda: logs["n3"].durable_point().next_offset == logs["n2"].next_offset,
            what="n3 follows n2",
        )
        assert stream_files(logs["n3"].stream_dir) == stream_files(logs["n2"].stream_dir)
        # every chunk committed in epoch 1 is on the new leader, unchanged
        epoch1 = [r for r in logs["n2"].epoch_history() if r[0] == 1]
        assert epoch1 and epoch1[0][2] >= committed
        # n2 took n3's more up-to-date log (catch-up) before its own epoch began
        assert epoch1[0][2] == uncommitted_tail
        assert n2.stepped_down is None
    finally:
        await cluster.stop()
        for log in logs.values():
            log.close()
