"""A simulated cluster around the pure replication machines, for property tests.

Nodes hold logs as lists of ``(epoch, chunk id)`` chunks (every chunk takes one offset,
so ``log[i]`` has chunk id ``i``); everything a node writes is fsynced at once, and a
node's log and highest seen epoch survive crashes, except when it loses its disk
(``lose_disk``: log, epoch and directory identity gone). The stream record holds each
member's directory identity (``cluster.disk_identity``): a node adopts, syncs and
acquires only while its standing is trusted (``amnesia_guard``; off: as before
identities, every member votes whatever its disk), and the leader demotes members whose
disk is lost through the real ``member_plan``. The MetaStore is linearizable and
keeps time with the global clock; each node's monotonic clock runs at its own rate.
Messages (adopt requests and replies, acks) sit in a network list and are delivered in
any order, or dropped; fetches (sync and catch-up) are request/response at once.

The world records what the invariants need and raises ``InvariantViolation`` on the
first broken one:

* a committed chunk is never lost or changed: every leader that reaches the leading
  phase holds every chunk committed by a lower epoch, with the same epoch;
* a leader never confirms once a newer epoch was acquired;
* epochs only go up (MetaStore record, every node's persisted epoch, along every log);
* each leader's commit offset only goes up, and a sync never finds two logs that
  disagree below their common-prefix point (log matching).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierlog.cluster import state as cs
from tierlog.cluster.disk_identity import (
    DiskSeen,
    MemberDisks,
    Standing,
    after_settling,
    standing,
)
from tierlog.cluster.errors import MembershipChangeError, StaleEpochError
from tierlog.cluster.log_history import Tail, common_prefix_end, history_of, holds, tail_of
from tierlog.cluster.member_plan import (
    Demote,
    NodesSeen,
    RemoveMember,
    StreamSeen,
    next_member_change,
)
from tierlog.cluster.members import Membership

Chunk = tuple[int, int]  # (epoch, chunk id)


class InvariantViolation(AssertionError):
    pass


@dataclass
class Node:
    name: str
    clock_offset: float
    clock_rate: float
    log: list[Chunk] = field(default_factory=list)
    highest_epoch: int = 0  # persisted
    up: bool = True
    paused: bool = False
    leader: cs.LeaderState | None = None
    pending_catch_up: cs.CatchUp | None = None
    disk_id: str | None = None  # the identity its directory carries

    def now(self, global_time: float) -> float:
        return self.clock_offset + self.clock_rate * global_time

    @property
    def active(self) -> bool:
        return self.up and not self.paused

    def tail(self) -> Tail:
        return tail_of(history_of(self.log))


@dataclass(frozen=True)
class Message:
    sender: str
    to: str
    body: object  # an event for a leader, or ("adopt", epoch)


@dataclass
class World:
    names: list[str]
    timing: cs.LeaseTiming
    rates: list[float]
    time: float = 0.0
    nodes: dict[str, Node] = field(default_factory=dict)
    membership: Membership | None = None
    record_epoch: int = 0  # the stream's leader record in the MetaStore
    record_leader: str | None = None
    lease_expiry: dict[str, float] = field(default_factory=dict)  # node lease, global time
    meta_cut: set[str] = field(default_factory=set)  # nodes that cannot reach the MetaStore
    cut_links: set[frozenset[str]] = field(default_factory=set)
    network: list[Message] = field(default_factory=list)
    acquisitions: list[tuple[int, float]] = field(default_factory=list)  # (epoch, time)
    committed: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (epoch, by)
    confirms: int = 0
    elections: int = 0
    last_commit: dict[tuple[str, int], int] = field(default_factory=dict)
    seen_highest: dict[str, int] = field(default_factory=dict)
    amnesia_guard: bool = True
    disks: MemberDisks = field(default_factory=MemberDisks)
    disk_losses: int = 0
    demotions: int = 0
    _identities: int = 0

    def __post_init__(self) -> None:
        for i, name in enumerate(self.names):
            self.nodes[name] = Node(name, clock_offset=1000.0 * i, clock_rate=self.rates[i])
        self.membership = Membership(
            tuple(self.names[:3]) if len(self.names) > 3 else tuple(self.names)
        )
        self.disks = MemberDisks.created(self.members().members)

    def admit(self, node: Node) -> bool:
        """The member edge before adopting, syncing or acquiring: act on the node's disk
        standing (claim a place, record a lost disk, both through the MetaStore) and
        answer whether it is trusted."""
        if not self.amnesia_guard:
            return True
        seen = DiskSeen(node.disk_id, bool(node.log))
        now = standing(self.members(), self.disks, node.name, seen)
        if now in (Standing.CLAIM, Standing.MARK_LOST) and node.name not in self.meta_cut:
            self._identities += 1
            new_id = f"{node.name}-{self._identities}"
            if now is Standing.CLAIM:
                node.disk_id = new_id  # the directory first, then the record
            now, self.disks = after_settling(self.members(), self.disks, node.name, seen, new_id)
        return now is Standing.TRUSTED

    # -- helpers ---------------------------------------------------------------------
    def linked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cut_links

    def members(self) -> Membership:
        assert self.membership is not None
        return self.membership

    def send(self, sender: str, to: str, body: object) -> None:
        if self.linked(sender, to):
            self.network.append(Message(sender, to, body))

    def feed(self, node: Node, event: cs.Event) -> None:
        if node.leader is None:
            return
        self.apply(node, node.leader.handle(event, node.now(self.time)))

    def apply(self, node: Node, effects: list[cs.Effect]) -> None:
        leader = node.leader
        assert leader is not None
        for effect in effects:
            if node.leader is not leader:
                return  # stepped down while carrying out an earlier effect
            if isinstance(effect, cs.RequestAdopt):
                for member in effect.members:
                    self.send(node.name, member, ("adopt", effect.epoch))
            elif isinstance(effect, cs.CatchUp):
                node.pending_catch_up = effect
            elif isinstance(effect, cs.AppendTrackingSnapshot):
                self.check_leader_complete(node)
                self.append_chunk(node)
            elif isinstance(effect, cs.Commit):
                self.record_commit(node, effect.chunk_id)
            elif isinstance(effect, cs.PromoteLearner):
                self.promote(node, effect)
            elif isinstance(effect, cs.StepDown):
                self.step_down(node)
                return

    def step_down(self, node: Node) -> None:
        leader = node.leader
        node.leader = None
        node.pending_catch_up = None
        if (
            leader is not None
            and self.record_leader == node.name
            and self.record_epoch == leader.epoch
            and node.name not in self.meta_cut
        ):
            self.record_leader = None

    def append_chunk(self, node: Node) -> None:
        leader = node.leader
        assert leader is not None
        chunk = (leader.epoch, len(node.log))
        node.log.append(chunk)
        self.feed(node, cs.LocalWritten(chunk[1], chunk[0]))

    def promote(self, node: Node, effect: cs.PromoteLearner) -> None:
        leader = node.leader
        assert leader is not None
        if node.name in self.meta_cut or self.record_epoch != leader.epoch:
            return
        if self.amnesia_guard and not self.disks.trusted(effect.member):
            return  # the directory refuses a learner that holds no trusted disk
        try:
            self.membership = self.members().promote(effect.member, effect.written, effect.commit)
        except MembershipChangeError:
            return
        self.feed(node, cs.MembersChanged(self.members()))

    # -- invariants ------------------------------------------------------------------
    def fail(self, message: str) -> None:
        raise InvariantViolation(message)

    def check_leader_complete(self, node: Node) -> None:
        """A leader entering the leading phase holds every chunk committed before."""
        leader = node.leader
        assert leader is not None
        for chunk_id, (epoch, by) in self.committed.items():
            if by >= leader.epoch:
                continue
            if chunk_id >= len(node.log) or node.log[chunk_id] != (epoch, chunk_id):
                self.fail(
                    f"leader {node.name} epoch {leader.epoch} lacks committed chunk"
                    f" {(epoch, chunk_id)} (committed in epoch {by}); log tail {node.tail()}"
                )

    def record_commit(self, node: Node, chunk_id: int) -> None:
        leader = node.leader
        assert leader is not None
        newer = [(e, t) for e, t in self.acquisitions if e > leader.epoch and t <= self.time]
        if newer:
            self.fail(
                f"deposed leader {node.name} epoch {leader.epoch} confirmed {chunk_id}"
                f" after epoch {newer[0][0]} was acquired at {newer[0][1]}"
            )
        key = (node.name, leader.epoch)
        if chunk_id < self.last_commit.get(key, -1):
            self.fail(f"commit offset went down on {key}")
        self.last_commit[key] = chunk_id
        if chunk_id >= len(node.log):
            self.fail(f"{node.name} committed {chunk_id} beyond its log")
        for chunk in node.log[: chunk_id + 1]:
            epoch, cid = chunk
            previous = self.committed.get(cid)
            if previous is not None and previous[0] != epoch:
                self.fail(f"committed chunk {cid} changed from epoch {previous[0]} to {epoch}")
            if previous is None:
                self.committed[cid] = (epoch, leader.epoch)
        self.confirms += 1
        # Leaders already leading in a newer epoch must hold what was just committed.
        for other in self.nodes.values():
            newer = other.leader
            if newer and newer.phase is cs.Phase.LEADING and newer.epoch > leader.epoch:
                self.check_leader_complete(other)

    def check_always(self) -> None:
        for node in self.nodes.values():
            epochs = [e for e, _ in node.log]
            if epochs != sorted(epochs):
                self.fail(f"epochs go down in {node.name}'s log")
            if any(cid != i for i, (_, cid) in enumerate(node.log)):
                self.fail(f"{node.name}'s chunk ids are not consecutive")
            if epochs and node.highest_epoch < epochs[-1]:
                self.fail(f"{node.name} persisted epoch below its log's")
            if node.highest_epoch < self.seen_highest.get(node.name, 0):
                self.fail(f"{node.name}'s persisted epoch went down")
            self.seen_highest[node.name] = node.highest_epoch
        epochs = [e for e, _ in self.acquisitions]
        if epochs != sorted(set(epochs)):
            self.fail(f"leader epochs not strictly increasing: {epochs}")

    # -- actions (each returns without effect when it does not apply) -----------------
    def tick(self, dt: float) -> None:
        self.time += dt
        for node in self.nodes.values():
            if node.active and node.leader is not None:
                self.feed(node, cs.Tick())

    def renew(self, name: str) -> None:
        node = self.nodes[name]
        if not node.active or name in self.meta_cut:
            return
        sent_at = node.now(self.time)
        if self.lease_expiry.get(name, -1.0) > self.time:
            self.lease_expiry[name] = self.time + self.timing.ttl
            self.feed(node, cs.LeaseRenewed(sent_at))
        else:
            self.feed(node, cs.LeaseLost())

    def acquire(self, name: str) -> None:
        """The MetaStore transaction: a voter takes an expired leadership, epoch bumped."""
        node = self.nodes[name]
        if not node.active or name in self.meta_cut or node.leader is not None:
            return
        if not self.members().is_voter(name) or not self.admit(node):
            return
        holder = self.record_leader
        if holder not in (None, name) and self.lease_expiry.get(holder, -1.0) > self.time:
            return
        if self.lease_expiry.get(name, -1.0) <= self.time:  # re-register: a new node lease
            self.lease_expiry[name] = self.time + self.timing.ttl
        disk = [e for e, _ in node.log[-1:]]
        epoch = cs.next_leader_epoch(
            self.record_epoch, self.record_epoch, [node.highest_epoch, *disk]
        )
        self.record_epoch, self.record_leader = epoch, name
        self.acquisitions.append((epoch, self.time))
        node.highest_epoch = epoch
        self.elections += 1
        node.leader = cs.LeaderState(
            node=name,
            epoch=epoch,
            membership=self.members(),
            own_tail=node.tail(),
            timing=self.timing,
            acquired_at=node.now(self.time),
        )
        self.apply(node, node.leader.start(node.now(self.time)))

    def append(self, name: str) -> None:
        node = self.nodes[name]
        if node.active and node.leader is not None and node.leader.accepts_appends:
            self.append_chunk(node)

    def deliver(self, index: int, drop: bool = False) -> None:
        if not self.network:
            return
        message = self.network[index % len(self.network)]
        target = self.nodes[message.to]
        if target.paused and not drop:
            return
        self.network.remove(message)
        if drop or not target.up or not self.linked(message.sender, message.to):
            return
        body = message.body
        if isinstance(body, tuple) and body[0] == "adopt":
            self.on_adopt(target, message.sender, int(body[1]))
        elif isinstance(body, cs.EpochAdopted | cs.EpochRefused | cs.MemberAcked):
            self.feed(target, body)

    def fence(self, node: Node, epoch: int) -> bool:
        """The member's epoch check (``MemberEpoch``); False if ``epoch`` is refused.
        Checks the rule itself too: nothing older than the persisted epoch gets in."""
        guard = cs.MemberEpoch(node.highest_epoch)
        try:
            guard.check(epoch)
        except StaleEpochError:
            return False
        if epoch < node.highest_epoch:
            self.fail(f"{node.name} accepted epoch {epoch} after seeing {node.highest_epoch}")
        node.highest_epoch = guard.highest
        return True

    def on_adopt(self, node: Node, sender: str, epoch: int) -> None:
        if not self.admit(node):
            return  # refused as an unknown stream: never counted
        if not self.fence(node, epoch):
            self.send(node.name, sender, cs.EpochRefused(node.name, node.highest_epoch))
            return
        if node.leader is not None and node.leader.epoch < epoch:
            self.step_down(node)
        self.send(node.name, sender, cs.EpochAdopted(node.name, epoch, node.tail()))

    def sync(self, member_name: str, leader_name: str, count: int) -> None:
        """``member`` fetches up to ``count`` chunks from ``leader`` and acks."""
        member, source = self.nodes[member_name], self.nodes[leader_name]
        leader = source.leader
        if member is source or not (member.active and source.active) or leader is None:
            return
        if not self.linked(member_name, leader_name) or leader.phase is not cs.Phase.LEADING:
            return
        if member_name not in leader.membership.members:
            return
        if member.leader is not None and member.leader.epoch >= leader.epoch:
            return  # a leader does not follow an older or equal epoch
        if not self.admit(member):
            return  # not the disk the stream trusts: it does not follow
        if not self.fence(member, leader.epoch):
            self.feed(source, cs.EpochRefused(member_name, member.highest_epoch))
            return
        if member.leader is not None:  # a leader of an older epoch learns it is deposed
            self.step_down(member)
        self.truncate_and_copy(member, source, len(source.log), count)
        self.send(
            member_name, leader_name, cs.MemberAcked(member_name, leader.epoch, len(member.log) - 1)
        )

    def truncate_and_copy(self, dest: Node, source: Node, upto: int, count: int) -> None:
        keep = common_prefix_end(history_of(dest.log), history_of(source.log))
        if dest.log[: keep + 1] != source.log[: keep + 1]:
            self.fail(f"{dest.name} and {source.name} disagree below common point {keep}")
        del dest.log[keep + 1 :]
        dest.log.extend(source.log[len(dest.log) : min(upto, len(dest.log) + count)])

    def catch_up(self, name: str) -> None:
        node = self.nodes[name]
        effect = node.pending_catch_up
        leader = node.leader
        if effect is None or leader is None or not node.active:
            return
        source = self.nodes[effect.source]
        if not source.active or not self.linked(name, source.name):
            return
        node.pending_catch_up = None
        if source.highest_epoch > leader.epoch:
            self.feed(node, cs.CatchUpFailed(f"{source.name} moved to a newer epoch"))
            return
        if not holds(history_of(source.log), effect.tail) or source.tail() < effect.tail:
            self.feed(node, cs.CatchUpFailed(f"{source.name} no longer holds {effect.tail}"))
            return
        self.truncate_and_copy(node, source, effect.tail.chunk_id + 1, len(source.log))
        self.feed(node, cs.CaughtUp(node.tail()))

    def crash(self, name: str) -> None:
        node = self.nodes[name]
        node.up = False
        node.leader = None
        node.pending_catch_up = None

    def lose_disk(self, name: str) -> None:
        """The node crashes and is restarted at once with an empty directory: log,
        persisted epoch and identity gone (a replaced disk)."""
        self.crash(name)
        node = self.nodes[name]
        node.log, node.highest_epoch, node.disk_id = [], 0, None
        self.seen_highest[name] = 0
        self.disk_losses += 1
        self.restart(name)

    def restart(self, name: str) -> None:
        node = self.nodes[name]
        node.up, node.paused = True, False

    def pause(self, name: str) -> None:
        self.nodes[name].paused = True

    def resume(self, name: str) -> None:
        self.nodes[name].paused = False
        node = self.nodes[name]
        if node.up and node.leader is not None:
            self.feed(node, cs.Tick())

    def cut(self, a: str, b: str) -> None:
        if a != b:
            self.cut_links.add(frozenset((a, b)))

    def heal(self) -> None:
        self.cut_links.clear()
        self.meta_cut.clear()

    def settle(self) -> None:
        """Deliver every deliverable message, renew every lease, sync every member once
        from every leader, catch up every pending leader: fast progress for the search."""
        for name in self.names:
            self.renew(name)
        for _ in range(3):
            for index in range(len(self.network) - 1, -1, -1):
                if index < len(self.network):
                    self.deliver(index)
            for name in self.names:
                self.catch_up(name)
        for leader_name in self.names:
            for member in self.names:
                self.sync(member, leader_name, 1000)
            self.repair(leader_name)
        for index in range(len(self.network) - 1, -1, -1):
            if index < len(self.network):
                self.deliver(index)

    def change_members(self, name: str, target: str, add: bool) -> None:
        """The current leader adds ``target`` as a learner or removes it."""
        node = self.nodes[name]
        leader = node.leader
        if leader is None or not node.active or name in self.meta_cut:
            return
        if self.record_leader != name or self.record_epoch != leader.epoch:
            return
        if leader.phase is not cs.Phase.LEADING:
            return
        try:
            current = self.members()
            new = current.add_learner(target) if add else current.remove(target)
        except MembershipChangeError:
            return
        self.membership = new
        self.disks = self.disks.joined(target) if add else self.disks.removed(target)
        self.feed(node, cs.MembersChanged(new))

    def repair(self, name: str) -> None:
        """The leader's member plan for members whose disk is lost: a lost voter is
        demoted to a learner (once the others hold the commit), a lost learner removed."""
        node = self.nodes[name]
        leader = node.leader
        if leader is None or not node.active or name in self.meta_cut:
            return
        if self.record_leader != name or self.record_epoch != leader.epoch:
            return
        if leader.phase is not cs.Phase.LEADING or leader.epoch_start is None:
            return
        if leader.commit < leader.epoch_start:
            return
        current = self.members()
        seen = StreamSeen(
            name,
            current,
            len(current.voters),
            leader.commit,
            {m: leader.written(m) for m in current.members},
            self.disks.lost,
        )
        live = frozenset(n for n, other in self.nodes.items() if other.up)
        step = next_member_change(seen, NodesSeen(live))
        if isinstance(step, Demote):
            self.membership = current.demote(step.node)
            self.disks = self.disks.joined(step.node)
            self.demotions += 1
        elif isinstance(step, RemoveMember) and step.node in self.disks.lost:
            self.membership = current.remove(step.node)
            self.disks = self.disks.removed(step.node)
        else:
            return
        self.feed(node, cs.MembersChanged(self.members()))
