"""The member side of a node in a cluster: the stream logs it holds as a follower.

A node that is a member of a stream but not its leader keeps the stream's log in the
same directory a leader would (the incarnation's name, so files are byte-identical
across members) and follows the leader through the replication hub: chunks are
appended verbatim by the log's acceptor path, fsynced, and acknowledged. The log is
not open in the broker: its consumers read it through ``reads`` (up to the cluster
commit), publishers are pointed at the leader by Metadata.
When the node takes the stream over, the follower log is closed first and the broker
opens the same directory as the leader's log.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from tierlog.cluster.hub import ReplicationHub
from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.catalog import StreamRecord

log = get_logger("tierlog.server.cluster")


class FollowerReads(Protocol):
    """The consumers of followed streams (``server.member_reads``): told when a follower
    log opens, learns the cluster commit, is cut, and stops."""

    def opened(self, record: StreamRecord, stream_log: StreamLog) -> None: ...

    def committed(self, incarnation: str, chunk_id: int) -> None: ...

    def truncated(self, incarnation: str, keep_through: int) -> None: ...

    def stopped(self, incarnation: str) -> None: ...

    def readers_remote_next(self, incarnation: str) -> int | None:
        """None without consumers of the stream here; else the remote tail their view of
        the manifest holds (the member frees nothing past it)."""
        ...


@dataclass(slots=True)
class Follower:
    """One followed stream: its log, its writer lane and whom it follows."""

    record: StreamRecord
    log: StreamLog
    lane: Executor
    leader: str
    epoch: int


class Followers:
    """Every stream this node follows, opened and closed on their writer lanes."""

    def __init__(self, hub: ReplicationHub, streams_dir: str) -> None:
        self.hub = hub
        self.streams_dir = streams_dir
        self.streams: dict[str, Follower] = {}
        self.reads: FollowerReads | None = None
        self.commits: dict[str, int] = {}  # the cluster commit each stream learned

    def get(self, incarnation: str) -> Follower | None:
        return self.streams.get(incarnation)

    async def follow(
        self, record: StreamRecord, config: LogConfig, lane: Executor, leader: str, epoch: int
    ) -> None:
        """Follow ``leader`` in ``epoch`` (opening or creating the log the first time;
        a later call with a new leader or epoch re-points the follower)."""
        incarnation = record.incarnation
        current = self.streams.get(incarnation)
        if current is not None:
            current.record = record  # settings (local limits) as the catalog has them now
            if (current.leader, current.epoch) != (leader, epoch):
                current.leader, current.epoch = leader, epoch
                self.hub.follow(incarnation, current.log, leader, epoch, executor=current.lane)
            return
        path = os.path.join(self.streams_dir, incarnation)

        def open_log() -> StreamLog:
            if os.path.isdir(path):
                return StreamLog.open(path, config, adopt_disk_epoch=True)
            return StreamLog.create_follower(path, config)

        stream_log = await asyncio.get_running_loop().run_in_executor(lane, open_log)
        self.streams[incarnation] = Follower(record, stream_log, lane, leader, epoch)
        if self.reads is not None:
            self.reads.opened(record, stream_log)
        self.hub.follow(
            incarnation,
            stream_log,
            leader,
            epoch,
            executor=lane,
            on_commit=lambda chunk_id: self._committed(incarnation, chunk_id),
            on_truncate=lambda keep: self._truncated(incarnation, keep),
        )
        log.info(
            "cluster_stream_following",
            stream=record.name,
            incarnation=incarnation,
            leader=leader,
            epoch=epoch,
            next_offset=stream_log.next_offset,
        )

    def _committed(self, incarnation: str, chunk_id: int) -> None:
        if incarnation in self.streams:
            self.commits[incarnation] = max(chunk_id, self.commits.get(incarnation, -1))
        if self.reads is not None:
            self.reads.committed(incarnation, chunk_id)

    def _truncated(self, incarnation: str, keep_through: int) -> None:
        if self.reads is not None:
            self.reads.truncated(incarnation, keep_through)

    def seen_epochs(self, incarnation: str) -> tuple[int, ...]:
        """The epochs a follower log has seen (written or adopted): a new leader takes
        an epoch above them."""
        follower = self.streams.get(incarnation)
        if follower is None:
            return ()
        return (follower.log.max_epoch, follower.log.read_member_epoch())

    async def stop(self, incarnation: str) -> None:
        """Stop following and close the log (before this node opens it as leader)."""
        follower = self.streams.pop(incarnation, None)
        self.commits.pop(incarnation, None)
        if follower is None:
            return
        self.hub.unfollow(incarnation)
        if self.reads is not None:
            self.reads.stopped(incarnation)  # its consumers are told before the log closes
        await asyncio.get_running_loop().run_in_executor(follower.lane, follower.log.close)

    async def close(self) -> None:
        for incarnation in list(self.streams):
            await self.stop(incarnation)


def holds_unregistered_stream(streams_dir: str, record: StreamRecord) -> bool:
    """Whether this node may open, as its first leader, a catalog stream that has no
    cluster record yet (a stream from before the cluster, or one whose creation on
    another node has not registered yet): only if it holds the stream's local log. That
    node may hold confirmed messages not yet in the remote tier (its untiered tail); a
    node without the log would start the stream again past the remote tail and orphan
    that tail, so it leaves the stream alone (clients get STREAM_NOT_AVAILABLE) until
    the node holding it has opened and registered it."""
    if os.path.isdir(os.path.join(streams_dir, record.incarnation)):
        return True
    log.info(
        "cluster_stream_awaits_its_local_log",
        stream=record.name,
        incarnation=record.incarnation,
        reason="a stream from before the cluster is led first by the node holding its log",
    )
    return False
