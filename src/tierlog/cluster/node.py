"""One node of a cluster: its lease, the streams it leads, and what it learns from the
directory. No server, no sockets, no event loop: the server's cluster service calls in
with the outcomes of MetaStore calls, local fsyncs and the time, and carries out the
effects.

* **One lease per node.** ``NodeLease`` takes the node lease and renews it; every
  renewal (and its loss) is fed to every ``StreamLeader`` the node runs, however many
  streams that is. A renewal counts from when it was *sent*.
* **One ``LeaderState`` per led stream**, driven by one shared timer (``ClusterNode.tick``),
  never a thread or a timer per stream.
* **Confirms wait for the commit.** A publish group written locally registers its
  callbacks with the chunk id it ends at (``StreamLeader.written``); they run only when
  the stream's ``Commit`` effect reaches that chunk, and a commit is only emitted while
  the leader ``may_confirm``. On step-down the waiting confirms are failed, never sent:
  a client retries them (a named producer's deduplication keeps that exactly once).
* **The directory scan** (``DirectoryView``): one read of every stream record and the
  live nodes, giving each stream's leader (for Metadata) and the streams this node
  should take over (a voter whose leader's node lease is gone).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

from tierlog.cluster.errors import StreamUnavailableError
from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.membership import (
    STREAMS_PREFIX,
    ClusterDirectory,
    Leadership,
    NodeInfo,
    StreamMembers,
)
from tierlog.cluster.state import (
    Commit,
    Effect,
    Event,
    LeaderState,
    LeaseLost,
    LeaseRenewed,
    LeaseTiming,
    LocalWritten,
    StepDown,
    Tick,
)
from tierlog.storage.errors import LeaseLostError
from tierlog.storage.meta_store import Lease

Clock = Callable[[], float]
Confirm = Callable[[], None]
Refuse = Callable[[str], None]


class NodeLease:
    """The node's one MetaStore lease and its renewals (blocking calls: run them off the
    event loop). ``renew`` returns when the renewal was sent, for ``LeaseRenewed``."""

    def __init__(
        self,
        directory: ClusterDirectory,
        info: NodeInfo,
        timing: LeaseTiming,
        clock: Clock = time.monotonic,
    ) -> None:
        self.directory = directory
        self.info = info
        self.timing = timing
        self.clock = clock
        self.lease: Lease | None = None
        self.registered_at = 0.0
        self.renewed_at: float | None = None  # sent time of the last successful renewal

    @property
    def held(self) -> bool:
        return self.lease is not None

    def register(self) -> tuple[NodeInfo, float]:
        """Take the lease and publish the node's addresses (``LeaseHeldError`` while the
        lease of an earlier run of this node has not expired yet)."""
        sent_at = self.clock()
        info, lease = self.directory.register_node(self.info, self.timing.ttl)
        self.info, self.lease, self.registered_at = info, lease, sent_at
        self.renewed_at = sent_at
        return info, sent_at

    def renew(self) -> float:
        """One keepalive; ``LeaseLostError`` if the lease expired or moved (the node must
        step down everywhere and register again)."""
        assert self.lease is not None
        sent_at = self.clock()
        try:
            self.lease = self.directory.renew_node(self.lease, self.timing.ttl)
        except LeaseLostError:
            self.lease = None
            raise
        self.renewed_at = sent_at
        return sent_at

    def lost(self) -> None:
        self.lease = None

    def release(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            self.directory.release_node(lease)


@dataclass(slots=True)
class _Waiting:
    chunk_id: int
    confirms: list[Confirm]
    refuses: list[Refuse]


@dataclass(slots=True)
class StreamLeader:
    """This node's leadership of one stream: the pure ``LeaderState`` plus the publish
    confirms waiting for its commit offset."""

    leadership: Leadership
    state: LeaderState
    waiting: deque[_Waiting] = field(default_factory=deque)
    committed: int = NO_CHUNK

    @property
    def incarnation(self) -> str:
        return self.leadership.incarnation

    @property
    def epoch(self) -> int:
        return self.leadership.epoch

    @property
    def stepped_down(self) -> bool:
        return self.state.step_down_reason is not None

    def written(
        self,
        chunk_id: int,
        epoch: int,
        confirms: list[Confirm],
        refuses: list[Refuse],
        now: float,
    ) -> list[Effect]:
        """A group is written locally through ``chunk_id`` (a chunk of ``epoch``): its
        confirms wait for the commit to reach that chunk."""
        if self.stepped_down:
            for refuse in refuses:
                refuse(self.state.step_down_reason or "not the leader")
            return []
        if confirms:
            if chunk_id <= self.committed:
                for confirm in confirms:
                    confirm()
            else:
                self.waiting.append(_Waiting(chunk_id, confirms, refuses))
        return self.handle(LocalWritten(chunk_id, epoch), now) if chunk_id != NO_CHUNK else []

    def when_committed(self, chunk_id: int, confirm: Confirm, refuse: Refuse) -> None:
        """``confirm`` once the commit reaches ``chunk_id`` (at once when it has), or
        ``refuse`` when the leader steps down first. For answers that must survive a
        failover as confirms do (a consumer offset the leader answers is in a chunk a
        majority holds, so any next leader holds it too); nothing is written."""
        if self.stepped_down:
            refuse(self.state.step_down_reason or "not the leader")
            return
        if chunk_id <= self.committed:
            confirm()
            return
        at = len(self.waiting)  # the waiting stay in chunk order (usually: the last)
        while at > 0 and self.waiting[at - 1].chunk_id > chunk_id:
            at -= 1
        self.waiting.insert(at, _Waiting(chunk_id, [confirm], [refuse]))

    def handle(self, event: Event, now: float) -> list[Effect]:
        effects = self.state.handle(event, now)
        self.apply_local(effects)
        return effects

    def start(self, now: float) -> list[Effect]:
        effects = self.state.start(now)
        self.apply_local(effects)
        return effects

    def apply_local(self, effects: Iterable[Effect]) -> None:
        """The effects that stay inside this object: commits release confirms, a
        step-down refuses every confirm still waiting."""
        for effect in effects:
            if isinstance(effect, Commit):
                self._release(effect.chunk_id)
            elif isinstance(effect, StepDown):
                self._refuse_all(effect.reason)

    def _release(self, commit: int) -> None:
        self.committed = max(self.committed, commit)
        while self.waiting and self.waiting[0].chunk_id <= self.committed:
            for confirm in self.waiting.popleft().confirms:
                confirm()

    def _refuse_all(self, reason: str) -> None:
        while self.waiting:
            for refuse in self.waiting.popleft().refuses:
                refuse(reason)


@dataclass(frozen=True, slots=True)
class StreamPlace:
    """Where one stream is led, as one directory scan saw it."""

    record: StreamMembers
    leader: NodeInfo | None  # None: no live leader

    def leader_or_raise(self) -> NodeInfo:
        if self.leader is None:
            raise StreamUnavailableError(
                f"stream {self.record.incarnation!r} has no live leader (epoch {self.record.epoch})"
            )
        return self.leader


@dataclass(frozen=True, slots=True)
class DirectoryView:
    """One scan of the directory: every stream record and every live node."""

    streams: dict[str, StreamPlace]
    nodes: dict[str, NodeInfo]

    @staticmethod
    def read(directory: ClusterDirectory) -> DirectoryView:
        """Two prefix reads (stream records, node records) plus one lease read per node,
        whatever the number of streams."""
        nodes = {info.name: info for info in directory.live_nodes()}
        streams: dict[str, StreamPlace] = {}
        for record in stream_records(directory):
            leader = None
            if record.leader is not None:
                info = nodes.get(record.leader)
                if info is not None and info.lease_epoch == record.leader_lease_epoch:
                    leader = info
            streams[record.incarnation] = StreamPlace(record, leader)
        return DirectoryView(streams, nodes)

    def to_take_over(self, node: str) -> list[str]:
        """Streams ``node`` should try to lead: it is a voter and no live leader holds
        them. (The acquisition transaction re-checks both.)"""
        return [
            incarnation
            for incarnation, place in self.streams.items()
            if place.leader is None and place.record.membership.is_voter(node)
        ]


def stream_records(directory: ClusterDirectory) -> list[StreamMembers]:
    """Every stream's cluster record, with one prefix read."""
    out = []
    for stored in directory.meta.list(STREAMS_PREFIX):
        incarnation = unquote(stored.key[len(STREAMS_PREFIX) :])
        out.append(StreamMembers.decode(incarnation, stored))
    return out


class ClusterNode:
    """Every stream this node leads, fed from one lease and one timer."""

    def __init__(self, name: str, timing: LeaseTiming, clock: Clock = time.monotonic) -> None:
        self.name = name
        self.timing = timing
        self.clock = clock
        self.leaders: dict[str, StreamLeader] = {}

    def lead(self, leadership: Leadership, own_tail: Tail, acquired_at: float) -> StreamLeader:
        """Start leading after a successful acquisition sent at ``acquired_at``."""
        state = LeaderState(
            node=self.name,
            epoch=leadership.epoch,
            membership=leadership.membership,
            own_tail=own_tail,
            timing=self.timing,
            acquired_at=acquired_at,
        )
        leader = StreamLeader(leadership, state)
        self.leaders[leadership.incarnation] = leader
        return leader

    def forget(self, incarnation: str) -> StreamLeader | None:
        return self.leaders.pop(incarnation, None)

    def broadcast(
        self, event: LeaseRenewed | LeaseLost | Tick, now: float | None = None
    ) -> dict[str, list[Effect]]:
        """Feed one node-wide event to every led stream; the effects per stream (only
        streams with effects are listed)."""
        now = self.clock() if now is None else now
        out: dict[str, list[Effect]] = {}
        for incarnation, leader in list(self.leaders.items()):
            if leader.stepped_down:
                continue
            effects = leader.handle(event, now)
            if effects:
                out[incarnation] = effects
        return out

    def tick(self, now: float | None = None) -> dict[str, list[Effect]]:
        return self.broadcast(Tick(), now)


def register_stream(
    directory: ClusterDirectory, incarnation: str, voters: Iterable[str]
) -> StreamMembers:
    """The stream's cluster record, created with ``voters`` if it has none yet (a
    stream from before the cluster, or a creation racing another node's)."""
    from tierlog.storage.errors import AlreadyExistsError

    existing = directory.stream(incarnation)
    if existing is not None:
        return existing
    try:
        return directory.create_stream(incarnation, voters)
    except AlreadyExistsError:
        return directory.require_stream(incarnation)
