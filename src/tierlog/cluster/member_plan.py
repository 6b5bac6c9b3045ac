"""What a stream's leader changes next in its member list: a pure decision.

The leader of a stream calls ``next_member_change`` after each directory scan with what
it knows (its members and their written offsets, the commit offset, the live and the
retiring nodes, how many members each node holds) and carries out the one step it gets
back. Steps go one at a time (``members.Membership``): a new member always joins as a
learner and ``state.LeaderState`` promotes it once it holds everything up to the commit
offset; only then is the next step decided.

The rules, in order (the first that applies wins):

1. **A change in progress** (a learner): abandon it (remove the learner) when the
   learner is retiring, its node is not live or its disk is lost; else wait for the
   promotion.
2. **The leader is retiring**: first bring the other non-retiring voters up to the
   replication factor with a spare node (learner first); then hand the stream over
   (``Resign``: the edge finishes tiering up to the commit offset, then gives the
   leadership up) as soon as another live non-retiring voter can take it; with none,
   wait (a single-voter stream on a retiring node with no spare cannot move).
3. **A voter is retiring**: replace it first (a spare joins as a learner) while the
   non-retiring voters are fewer than the replication factor and a spare exists; then
   remove it. Without a spare it is removed anyway: the stream runs one copy short
   until a node is available, which rule 4 then adds. A removal waits until the
   remaining voters alone hold the commit offset on a majority of them, so committed
   data never rests on fewer copies than a majority of the new voter set.
4. **Under-replicated** (fewer voters than the replication factor): add a spare; with
   none, wait, and say so (the stream runs short until a node is available).

Between rules 1 and 2: **a voter whose disk is lost** (``disk_identity``: its directory
is not the one it made its promises with, so it neither votes nor acknowledges) is
demoted to a learner, which claims a fresh place, catches up and is promoted again.
Like a removal, the demotion waits until the other voters alone hold the commit offset
on a majority of them; a lost member's written offset counts for nothing.

A spare is a live node that is neither retiring nor a member; among several, a preferred
one (a delayed stream's system stream prefers its stream's members, so the two stay on
the same nodes), then the one holding the fewest stream members, then the first by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tierlog.cluster.log_history import NO_CHUNK
from tierlog.cluster.members import Membership, quorum_value


@dataclass(frozen=True, slots=True)
class StreamSeen:
    """One led stream as its leader sees it. ``written``: each member's written chunk id
    (current-epoch acks); ``commit``: the commit offset (a chunk id, ``NO_CHUNK`` before
    the first commit of the epoch)."""

    leader: str
    membership: Membership
    replication_factor: int
    commit: int
    written: Mapping[str, int] = field(default_factory=dict)
    lost: frozenset[str] = frozenset()
    """Members whose disk is lost (``MemberDisks.lost``)."""

    def written_by(self) -> Mapping[str, int]:
        """The written offsets that count: a member whose disk is lost holds nothing."""
        if not self.lost:
            return self.written
        return {m: w for m, w in self.written.items() if m not in self.lost}


@dataclass(frozen=True, slots=True)
class NodesSeen:
    """The cluster's nodes as one directory scan saw them. ``load``: how many stream
    members each node holds (voters and learners)."""

    live: frozenset[str]
    retiring: frozenset[str] = frozenset()
    load: Mapping[str, int] = field(default_factory=dict)
    prefer: frozenset[str] = frozenset()
    """Spares to take first (a companion stream's members, so both stay together)."""


@dataclass(frozen=True, slots=True)
class AddLearner:
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class RemoveMember:
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class Demote:
    """Make a voter whose disk is lost a learner (it rejoins with a fresh place)."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resign:
    """Hand the stream to another voter: finish tiering up to the commit offset, then
    give the leadership up (the leader is retiring)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now; ``reason`` says what the change waits for (status, logs)."""

    reason: str


Step = AddLearner | RemoveMember | Demote | Resign | Wait


def spare_node(stream: StreamSeen, nodes: NodesSeen) -> str | None:
    """The node to add to ``stream``: live, not retiring, not a member; preferred ones
    first, then the least loaded, then by name."""
    members = set(stream.membership.members)
    candidates = [n for n in nodes.live if n not in nodes.retiring and n not in members]
    if not candidates:
        return None
    return min(candidates, key=lambda n: (n not in nodes.prefer, nodes.load.get(n, 0), n))


def holds_commit(stream: StreamSeen, voters: tuple[str, ...]) -> bool:
    """Whether a majority of ``voters`` has written everything up to the commit."""
    if not voters:
        return False
    if stream.commit == NO_CHUNK:
        return True
    return quorum_value(stream.written_by(), voters, NO_CHUNK) >= stream.commit


def next_member_change(stream: StreamSeen, nodes: NodesSeen) -> Step | None:
    """The next step for ``stream`` (``None``: its members are as they should be)."""
    membership = stream.membership
    for learner in membership.learners:
        if learner in nodes.retiring:
            return RemoveMember(learner, f"learner {learner} is retiring")
        if learner not in nodes.live:
            return RemoveMember(learner, f"learner {learner} is not live")
        if learner in stream.lost:
            return RemoveMember(learner, f"learner {learner} lost its disk")
        return Wait(f"learner {learner} is catching up")
    lost = [v for v in membership.voters if v in stream.lost and v != stream.leader]
    if lost:
        node = lost[0]
        others = tuple(v for v in membership.voters if v != node)
        if not holds_commit(stream, others):
            return Wait(f"the voters other than {node} (disk lost) are catching up")
        return Demote(node, f"voter {node} lost its disk")
    staying = tuple(v for v in membership.voters if v not in nodes.retiring)
    spare = spare_node(stream, nodes)
    if stream.leader in nodes.retiring:
        if len(staying) < stream.replication_factor and spare is not None:
            return AddLearner(spare, f"replaces retiring {stream.leader}")
        if any(v in nodes.live for v in staying):
            return Resign(f"leader {stream.leader} is retiring")
        return Wait(f"leader {stream.leader} is retiring and no other live voter can take over")
    leaving = [v for v in membership.voters if v in nodes.retiring]
    if leaving:
        node = leaving[0]
        if len(staying) < stream.replication_factor and spare is not None:
            return AddLearner(spare, f"replaces retiring {node}")
        if not holds_commit(stream, staying):
            return Wait(f"the voters staying after {node} leaves are catching up")
        return RemoveMember(node, f"voter {node} is retiring")
    if len(membership.voters) < stream.replication_factor:
        short = f"{len(membership.voters)} voters, replication factor {stream.replication_factor}"
        if spare is None:
            return Wait(f"{short}: no spare node (live, not retiring, not a member) to add")
        return AddLearner(spare, short)
    return None
