"""The replication decisions of one stream as pure state machines: events in, effects out.

Nothing here does I/O or reads a clock: every event carries ``now`` (the node's
monotonic clock). The cluster shell feeds MetaStore outcomes, replication messages and
local fsyncs, and carries out the effects. Tests drive any interleaving of appends,
acks, crashes, pauses and partitions deterministically.

Rules (Osiris-style replication, with leases from the MetaStore; docs/cluster.md):

* **Epochs only go up.** A new leader's epoch is ``max(leader-record epoch, manifest
  pointer epoch, highest epoch on any member's disk) + 1`` (``next_leader_epoch``),
  taken in the MetaStore transaction that checks it is a voter. Every member persists
  the highest epoch it has seen and refuses anything older (``MemberEpoch``).
* **Election.** The new leader asks every member to adopt its epoch; once a majority
  of voters (itself included) adopted it, it takes the most up-to-date of their tails
  (epoch first, then chunk id), catches up to it if it is not its own, then appends a
  tracking-snapshot chunk in its own epoch. Members that adopted an epoch refuse older
  leaders, so the tails collected stay valid.
* **Commit offset** = highest chunk id written on a majority of voters, counting only
  acks sent in the leader's epoch, and advancing only once a chunk of the current
  epoch is on a majority (never "committed by counting old copies").
* **A leader that may be deposed stops.** It confirms (emits ``Commit``) only before
  ``last successful renewal + TTL - drift`` on its own clock, measured from when the
  renewal was *sent*; past ``renewal + TTL`` or after one TTL without hearing from a
  majority (check-quorum) it steps down.
* **Learners** are promoted once they have written everything up to the commit offset.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from tierlog.cluster.errors import StaleEpochError
from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.members import Membership, majority, quorum_value
from tierlog.errors import ConfigError


def next_leader_epoch(record_epoch: int, pointer_epoch: int, disk_epochs: Iterable[int]) -> int:
    """The epoch a node takes when it acquires a stream's leadership: above every
    epoch the stream ever used, wherever it was recorded."""
    return max(record_epoch, pointer_epoch, *disk_epochs, 0) + 1


@dataclass(slots=True)
class MemberEpoch:
    """A member's persisted highest seen epoch: the fence against deposed leaders.
    The shell persists ``highest`` (fsync) before acting on a raise."""

    highest: int = 0

    def check(self, epoch: int) -> bool:
        """Accept a message of ``epoch``; returns True if ``highest`` rose (persist it
        before replying). Raises ``StaleEpochError`` for an older epoch."""
        if epoch < self.highest:
            raise StaleEpochError(epoch, self.highest)
        if epoch > self.highest:
            self.highest = epoch
            return True
        return False


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """``ttl``: the node lease TTL. ``drift``: the margin for clock-rate differences
    between this node and the MetaStore (a leader stops confirming ``drift`` seconds
    before its lease can expire there). Must satisfy ``0 < drift < ttl``."""

    ttl: float
    drift: float

    def __post_init__(self) -> None:
        if not 0 < self.drift < self.ttl:
            raise ConfigError(f"cluster lease drift {self.drift} must be in (0, ttl={self.ttl})")


# --- events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EpochAdopted:
    """``member`` persisted our epoch; ``tail`` is its log's last chunk at that time."""

    member: str
    epoch: int
    tail: Tail


@dataclass(frozen=True, slots=True)
class EpochRefused:
    """``member`` has already seen ``highest`` > our epoch: we are deposed."""

    member: str
    highest: int


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Our log now ends at ``tail`` after taking the most up-to-date member's log."""

    tail: Tail


@dataclass(frozen=True, slots=True)
class CatchUpFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class LocalWritten:
    """Our own log fsynced through ``chunk_id``, a chunk of ``epoch``."""

    chunk_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class MemberAcked:
    """``member`` reports its log fsynced through ``written`` while following ``epoch``."""

    member: str
    epoch: int
    written: int


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """A renewal of our node lease succeeded; ``sent_at`` is when it was requested."""

    sent_at: float


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """The MetaStore says our node lease expired or moved."""


@dataclass(frozen=True, slots=True)
class MembersChanged:
    membership: Membership


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: re-check the lease and check-quorum."""


Event = (
    EpochAdopted
    | EpochRefused
    | CaughtUp
    | CatchUpFailed
    | LocalWritten
    | MemberAcked
    | LeaseRenewed
    | LeaseLost
    | MembersChanged
    | Tick
)


# --- effects ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestAdopt:
    """Ask these members to persist ``epoch`` and report their tails."""

    members: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Take ``source``'s log up to ``tail``: cut our divergent suffix against its
    history, fetch its chunks verbatim, then report ``CaughtUp``."""

    source: str
    tail: Tail


@dataclass(frozen=True, slots=True)
class AppendTrackingSnapshot:
    """Write a tracking-snapshot chunk in ``epoch``: the first chunk of our epoch."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Commit:
    """Everything through ``chunk_id`` is committed: confirm publishes, let consumers
    and tiering go there, tell the members."""

    chunk_id: int


@dataclass(frozen=True, slots=True)
class PromoteLearner:
    """Make ``member`` a voter (MetaStore transaction), then report ``MembersChanged``."""

    member: str
    written: int
    commit: int


@dataclass(frozen=True, slots=True)
class StepDown:
    reason: str


Effect = RequestAdopt | CatchUp | AppendTrackingSnapshot | Commit | PromoteLearner | StepDown


# --- the leader machine -------------------------------------------------------------


class Phase(Enum):
    ADOPTING = "adopting"  # waiting for a majority to adopt our epoch
    CATCHING_UP = "catching-up"  # taking the most up-to-date member's log
    LEADING = "leading"  # appending; the tracking snapshot was requested
    STEPPED_DOWN = "stepped-down"  # terminal


@dataclass(slots=True)
class LeaderState:
    """One node's leadership of one stream in one epoch, from acquisition to step-down.

    Construct it right after the MetaStore acquisition transaction succeeded and this
    node persisted ``epoch`` locally; ``acquired_at`` is when that transaction was
    sent (it is also the first lease renewal). Call ``start`` for the first effects.
    """

    node: str
    epoch: int
    membership: Membership
    own_tail: Tail
    timing: LeaseTiming
    acquired_at: float
    phase: Phase = Phase.ADOPTING
    commit: int = NO_CHUNK  # committed chunk id as last emitted
    step_down_reason: str | None = None
    epoch_start: int | None = None  # our first chunk id in this epoch
    _renewed_at: float = 0.0
    _adopted: dict[str, Tail] = field(default_factory=dict)
    _written: dict[str, int] = field(default_factory=dict)  # current-epoch acks
    _heard: dict[str, float] = field(default_factory=dict)  # last current-epoch contact
    _best: tuple[str, Tail] | None = None
    _promoting: str | None = None

    def __post_init__(self) -> None:
        self._renewed_at = self.acquired_at
        self._adopted[self.node] = self.own_tail
        self._written[self.node] = self.own_tail.chunk_id

    # -- queries ---------------------------------------------------------------------
    @property
    def accepts_appends(self) -> bool:
        return self.phase is Phase.LEADING

    def confirm_deadline(self) -> float:
        """The local time from which we no longer confirm anything."""
        return self._renewed_at + self.timing.ttl - self.timing.drift

    def may_confirm(self, now: float) -> bool:
        return self.phase is Phase.LEADING and now < self.confirm_deadline()

    def quorum_contact(self, now: float) -> float:
        """The latest time by which a majority of voters (us included) was heard."""
        heard = dict(self._heard)
        heard[self.node] = now
        return max(quorum_value(heard, self.membership.voters, self.acquired_at), self.acquired_at)

    def candidate_commit(self) -> int:
        """The highest chunk id on a majority, if a current-epoch chunk is among it."""
        if self.epoch_start is None:
            return NO_CHUNK
        value = quorum_value(self._written, self.membership.voters, NO_CHUNK)
        return value if value >= self.epoch_start else NO_CHUNK

    def written(self, member: str) -> int:
        return self._written.get(member, NO_CHUNK)

    def heard_at(self, member: str) -> float | None:
        """When ``member`` was last heard in this epoch (None: not yet)."""
        return self._heard.get(member)

    # -- transitions -----------------------------------------------------------------
    def start(self, now: float) -> list[Effect]:
        others = tuple(m for m in self.membership.members if m != self.node)
        effects: list[Effect] = [RequestAdopt(others, self.epoch)]
        self._after(now, effects)
        return effects

    def handle(self, event: Event, now: float) -> list[Effect]:
        if self.phase is Phase.STEPPED_DOWN:
            return []
        effects: list[Effect] = []
        if isinstance(event, EpochAdopted):
            if event.epoch == self.epoch:
                self._heard[event.member] = now
                self._adopted.setdefault(event.member, event.tail)
        elif isinstance(event, EpochRefused):
            if event.highest > self.epoch:
                self._step_down(f"member {event.member} has seen epoch {event.highest}", effects)
        elif isinstance(event, CaughtUp):
            if self.phase is Phase.CATCHING_UP and self._best and event.tail == self._best[1]:
                self.own_tail = event.tail
                self._written[self.node] = event.tail.chunk_id
                self._lead(effects)
        elif isinstance(event, CatchUpFailed):
            if self.phase is Phase.CATCHING_UP:
                self._step_down(f"catch-up failed: {event.reason}", effects)
        elif isinstance(event, LocalWritten):
            self._local_written(event)
        elif isinstance(event, MemberAcked):
            if event.epoch == self.epoch and event.member in self.membership.members:
                self._heard[event.member] = now
                previous = self._written.get(event.member, NO_CHUNK)
                self._written[event.member] = max(previous, event.written)
        elif isinstance(event, LeaseRenewed):
            self._renewed_at = max(self._renewed_at, event.sent_at)
        elif isinstance(event, LeaseLost):
            self._step_down("node lease lost", effects)
        elif isinstance(event, MembersChanged):
            self._members_changed(event.membership, effects)
        if self.phase is not Phase.STEPPED_DOWN:
            self._after(now, effects)
        return effects

    def _local_written(self, event: LocalWritten) -> None:
        if event.epoch == self.epoch and self.epoch_start is None:
            self.epoch_start = event.chunk_id
        self._written[self.node] = max(self._written[self.node], event.chunk_id)
        self.own_tail = Tail(event.epoch, event.chunk_id)

    def _members_changed(self, membership: Membership, effects: list[Effect]) -> None:
        self.membership = membership
        self._promoting = None
        if not membership.is_voter(self.node):
            self._step_down("no longer a voter of the stream", effects)

    def _after(self, now: float, effects: list[Effect]) -> None:
        """Checks run after every event: lease, check-quorum, election progress,
        commit, learner promotion."""
        if now >= self._renewed_at + self.timing.ttl:
            self._step_down("node lease expired", effects)
            return
        if now - self.quorum_contact(now) > self.timing.ttl:
            self._step_down("no majority heard for one lease TTL (check-quorum)", effects)
            return
        if self.phase is Phase.ADOPTING:
            self._maybe_elected(effects)
        if self.phase is Phase.LEADING:
            self._maybe_commit(now, effects)
            self._maybe_promote(effects)

    def _maybe_elected(self, effects: list[Effect]) -> None:
        voters = [m for m in self._adopted if self.membership.is_voter(m)]
        if len(voters) < majority(len(self.membership.voters)):
            return
        best_member = max(voters, key=lambda m: (self._adopted[m], m == self.node))
        best = self._adopted[best_member]
        self._best = (best_member, best)
        if best > self.own_tail:
            self.phase = Phase.CATCHING_UP
            effects.append(CatchUp(best_member, best))
        else:
            self._lead(effects)

    def _lead(self, effects: list[Effect]) -> None:
        self.phase = Phase.LEADING
        effects.append(AppendTrackingSnapshot(self.epoch))

    def _maybe_commit(self, now: float, effects: list[Effect]) -> None:
        candidate = self.candidate_commit()
        if candidate > self.commit and self.may_confirm(now):
            self.commit = candidate
            effects.append(Commit(candidate))

    def _maybe_promote(self, effects: list[Effect]) -> None:
        if self._promoting is not None or self.epoch_start is None:
            return
        if self.commit < self.epoch_start:
            return  # nothing of our epoch committed yet: the commit offset is stale
        for learner in self.membership.learners:
            written = self._written.get(learner, NO_CHUNK)
            if written >= self.commit:
                self._promoting = learner
                effects.append(PromoteLearner(learner, written, self.commit))
                return

    def _step_down(self, reason: str, effects: list[Effect]) -> None:
        self.phase = Phase.STEPPED_DOWN
        self.step_down_reason = reason
        effects.append(StepDown(reason))
