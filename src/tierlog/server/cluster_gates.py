"""The pieces of a led stream that sit on the broker's paths, and what Metadata says.

* ``LeaderGate``: a written publish group's confirms wait for the stream's cluster
  commit (``StreamHandle.confirm_gate``); the group's chunk is fed to the leader as
  written and members' parked fetches are woken.
* ``MemberEvents``: what the stream's members send through the replication hub, fed to
  the leader's ``LeaderState``.
* ``lease_fence``: the manifest-commit fence (``ManifestCommitter.fence``): no commit once
  the leader stepped down or passed its confirm deadline.
* ``cluster_metadata``: a Metadata answer from the directory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.membership import NodeInfo
from tierlog.cluster.node import StreamLeader
from tierlog.cluster.state import EpochAdopted, EpochRefused, MemberAcked
from tierlog.formats.protocol.commands import BrokerAddress, StreamMetadata
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.log.writer import StreamLog
from tierlog.tiering.errors import DeposedError

if TYPE_CHECKING:
    from tierlog.server.broker import Done, StreamHandle
    from tierlog.server.cluster_service import ClusterService


@dataclass(frozen=True, slots=True)
class StreamLocation:
    """What Metadata tells a client about a stream: its leader and replicas."""

    code: int
    leader: NodeInfo | None
    replicas: tuple[NodeInfo, ...]


class LeaderGate:
    """A led stream's confirm gate: a written group's confirms wait for the commit."""

    def __init__(self, service: ClusterService, leader: StreamLeader) -> None:
        self.service = service
        self.leader = leader

    def group_written(
        self, handle: StreamHandle, chunk_id: int, dones: list[tuple[Done, int]]
    ) -> None:
        confirms = []
        refuses = []
        for done, code in dones:
            if code != ResponseCode.OK:
                done(code)
                continue
            confirms.append(_call(done, ResponseCode.OK))
            refuses.append(_refuse(done))
        incarnation = self.leader.incarnation
        effects = self.leader.written(
            chunk_id, handle.log.epoch, confirms, refuses, time.monotonic()
        )
        hub = self.service.hub
        if hub is not None:
            hub.wake(incarnation)  # members' parked fetches
        if effects:
            self.service._apply(incarnation, effects)

    async def committed(self, chunk_id: int, timeout: float) -> bool:
        """Whether the stream's cluster commit reaches ``chunk_id`` within ``timeout``
        (False: it did not, or this node stepped down first)."""
        reached: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def settle(value: bool) -> None:
            if not reached.done():
                reached.set_result(value)

        self.leader.when_committed(chunk_id, lambda: settle(True), lambda _: settle(False))
        try:
            return await asyncio.wait_for(reached, timeout)
        except TimeoutError:
            return False


class MemberEvents:
    """What a led stream's members send (``LeaderListener``), fed to its leader."""

    def __init__(self, service: ClusterService, incarnation: str) -> None:
        self.service = service
        self.incarnation = incarnation

    def member_written(self, member: str, chunk_id: int, epoch: int) -> None:
        self.service._feed(self.incarnation, MemberAcked(member, epoch, chunk_id))

    def member_adopted(
        self, member: str, epoch: int, highest: int, tail_epoch: int, tail_chunk_id: int
    ) -> None:
        self.service._feed(
            self.incarnation, EpochAdopted(member, epoch, Tail(tail_epoch, tail_chunk_id))
        )

    def member_refused(self, member: str, highest_epoch: int) -> None:
        self.service._feed(self.incarnation, EpochRefused(member, highest_epoch))


def lease_fence(leader: StreamLeader) -> Callable[[], None]:
    """The manifest-commit fence of a led stream (called from tiering threads): no
    commit once the leader stepped down or is past its confirm deadline."""

    def fence() -> None:
        if leader.stepped_down or not leader.state.may_confirm(time.monotonic()):
            raise DeposedError(
                f"{leader.incarnation}: epoch {leader.epoch} may no longer commit"
                f" ({leader.state.step_down_reason or 'lease deadline passed'})"
            )

    return fence


def _call(done: Done, code: int) -> Any:
    return lambda: done(code)


def _refuse(done: Done) -> Any:
    return lambda reason: done(ResponseCode.STREAM_NOT_AVAILABLE)


def retrieved(future: asyncio.Future[None]) -> None:
    """An election's outcome is read by whoever waits for it, if anyone still does."""
    if not future.cancelled():
        future.exception()


def start_epoch(stream_log: StreamLog, epoch: int) -> int:
    """The epoch's first chunk (a tracking snapshot), fsynced: the leader counts it as
    written only once it is on disk.

    A new leader's tierer tells the log where the whole stream starts only after the
    election (resolution). Until then a snapshot would trim consumer offsets at the local
    log's first offset (Osiris's rule for a log without a remote tier), and with a tiered
    stream's short local retention that drops every consumer behind the local log: the
    new leader would answer no offset for them (the soak's "consumers" oracle: no offset,
    or an older MetaStore value, after leader changes). So until resolution the stream
    counts as starting at 0 and snapshots keep every offset; the tierer then sets the
    real first offset."""
    if stream_log.remote_position() is None:  # the tierer has not told it yet
        stream_log.set_stream_first_offset(0)
    chunk_id = stream_log.start_epoch(epoch)
    stream_log.sync_to_disk()
    return chunk_id


def tail_of_handle(handle: StreamHandle) -> Tail:
    point = handle.log.commit_point()
    if point.chunk_id == NO_CHUNK:
        return Tail(0, NO_CHUNK)
    return Tail(handle.log.max_epoch, point.chunk_id)


def cluster_metadata(
    service: ClusterService, vhost: str, names: Sequence[str]
) -> tuple[list[BrokerAddress], list[StreamMetadata]]:
    """A Metadata answer from the directory: each stream's leader (and replicas) with
    their advertised stream addresses; a stream without a live leader is
    STREAM_NOT_AVAILABLE (clients retry), never pointed at a lagging member."""
    refs: dict[str, int] = {}
    brokers: list[BrokerAddress] = []

    def ref(info: NodeInfo) -> int:
        if info.name not in refs:
            host, _, port = info.stream_address.rpartition(":")
            refs[info.name] = len(brokers)
            brokers.append(BrokerAddress(len(brokers), host, int(port)))
        return refs[info.name]

    streams = []
    for name in names:
        where = service.locate(vhost, name)
        if where.code != ResponseCode.OK or where.leader is None:
            streams.append(StreamMetadata(name, where.code, NO_LEADER, ()))
            continue
        leader = ref(where.leader)
        streams.append(
            StreamMetadata(name, ResponseCode.OK, leader, tuple(ref(r) for r in where.replicas))
        )
    return brokers, streams


NO_LEADER = 0xFFFF
