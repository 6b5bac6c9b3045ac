"""A member's place among a stream's voters is tied to its disk: pure decisions.

Raft's amnesia hazard: a voter's acks and votes are promises about what its disk
holds. A node restarted with an empty, replaced or older directory still has its name,
so without more it adopts the next epoch with an empty tail and counts toward the
election's majority: with one disk lost and the leader merely restarted, the cluster
can elect a log that lacks committed chunks and cut them from the one disk that kept
them. A member whose disk is not the one it made its promises with must rejoin as a
new member.

So every member's stream directory carries an identity (``member.id``, a random token
written and fsynced when the member takes its place), and the stream's cluster record
holds, for every member, the identity its directory must carry (``MemberDisks``). The
identity is **per stream directory**, not per node: what a member promised is the
stream's log, which lives in that directory; a node-wide identity would miss one
stream directory wiped (or moved aside) while the rest of the data directory stayed.

A node acts as a member of a stream (adopts an epoch, fetches and acknowledges,
acquires leadership) only while its ``standing`` is ``TRUSTED``:

* the record's identity for it equals its directory's: ``TRUSTED``;
* the record gave it a place not taken yet (``""``: a new stream's voter, a learner just
  added or a member just demoted): ``CLAIM`` — it writes a fresh identity into its
  directory, then records it (the directory first: a crash in between leaves an
  identity the record does not know, and the place is claimed again). Nothing it
  holds was ever counted, so whatever its directory holds is safe to start from;
* the record holds no identity for it (a record written before identities existed):
  ``CLAIM`` if its log holds chunks (the upgrade: today's members keep their place),
  else ``MARK_LOST`` (an empty directory cannot be told from a lost one);
* any other directory (empty, replaced, another identity): ``MARK_LOST`` — it records
  that its disk is lost (``MemberDisks.lost``) and waits; the stream's leader demotes
  it to a learner with a new place (``member_plan``), it claims that place, catches up
  and is promoted once it holds the commit offset;
* recorded as lost: ``LOST`` until the leader demoted it (sticky: even the original
  disk put back waits for the demotion, so nothing ever counted on both).
* the stream's only member: whatever its directory, ``CLAIM`` (``TRUSTED`` when it
  carries the recorded identity): no other disk can hold what it lost and nobody could
  demote it; it continues as a single node does, from the remote tier's tail.

Safety needs only the first rule: a node whose directory is not the trusted one never
adopts, acknowledges or leads, so every vote and every ack counted comes from the disk
that holds what it promised. Marking and demoting are liveness: they give the member
its place back. Not detected: a copy of the *same* member's directory restored from an
older backup carries the right identity (its promises since the backup are lost);
restore a member by emptying its directory instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from tierlog.cluster.members import Membership

FRESH = ""
"""A member's identity in the record before it took its place (it claims it)."""


class Standing(Enum):
    """What a node may do as a member of one stream, given its directory."""

    TRUSTED = "trusted"  # its directory is the one the record trusts: it votes, acks, leads
    CLAIM = "claim"  # take the place: write a fresh identity, then record it
    MARK_LOST = "mark-lost"  # record that its disk is lost, then wait
    LOST = "lost"  # recorded as lost: wait for the leader to demote it
    NOT_MEMBER = "not-member"


@dataclass(frozen=True, slots=True)
class DiskSeen:
    """A node's stream directory as it is: the identity it carries (None: none) and
    whether its log holds at least one chunk."""

    disk_id: str | None
    has_chunks: bool


@dataclass(frozen=True, slots=True)
class MemberDisks:
    """What a stream's record says about its members' directories. ``ids``: node →
    the identity its directory must carry (``FRESH``: a place not taken yet; a member
    absent: recorded before identities existed). ``lost``: members that found their
    directory was not the trusted one and wait to be demoted."""

    ids: tuple[tuple[str, str], ...] = ()
    lost: frozenset[str] = frozenset()

    @staticmethod
    def of(ids: Mapping[str, str], lost: Iterable[str] = ()) -> MemberDisks:
        return MemberDisks(tuple(sorted(ids.items())), frozenset(lost))

    @staticmethod
    def created(voters: Iterable[str]) -> MemberDisks:
        """A new stream: every voter has a place to claim."""
        return MemberDisks.of(dict.fromkeys(voters, FRESH))

    def as_dict(self) -> dict[str, str]:
        return dict(self.ids)

    def id_of(self, node: str) -> str | None:
        for name, disk_id in self.ids:
            if name == node:
                return disk_id
        return None

    def claimed(self, node: str, disk_id: str) -> MemberDisks:
        if not disk_id:
            raise ValueError("a claimed identity is not empty")
        return MemberDisks.of({**self.as_dict(), node: disk_id}, self.lost - {node})

    def marked_lost(self, node: str) -> MemberDisks:
        return MemberDisks(self.ids, self.lost | {node})

    def joined(self, node: str) -> MemberDisks:
        """``node`` (re)joins as a learner: a fresh place, no longer lost."""
        return MemberDisks.of({**self.as_dict(), node: FRESH}, self.lost - {node})

    def removed(self, node: str) -> MemberDisks:
        ids = self.as_dict()
        ids.pop(node, None)
        return MemberDisks.of(ids, self.lost - {node})

    def trusted(self, node: str) -> bool:
        """Whether ``node`` took its place (a claimed identity, not lost)."""
        return bool(self.id_of(node)) and node not in self.lost

    def role_of(self, membership: Membership, node: str) -> str:
        """How an operator reads a member: ``voter`` / ``learner``, with ``(disk lost)``
        while it waits for its demotion and ``(joining)`` before it took its place."""
        role = "voter" if membership.is_voter(node) else "learner"
        if node in self.lost:
            return f"{role} (disk lost)"
        if self.id_of(node) == FRESH:
            return f"{role} (joining)"
        return role


def standing(membership: Membership, disks: MemberDisks, node: str, seen: DiskSeen) -> Standing:
    """What ``node`` may do for the stream with its directory ``seen`` (module doc)."""
    if node not in membership.members:
        return Standing.NOT_MEMBER
    if membership.voters == (node,) and not membership.learners:
        # the only member: no other disk can hold what it lost, nobody could demote
        # it; it continues as a single node does (from the remote tier's tail)
        return Standing.TRUSTED if seen.disk_id == disks.id_of(node) else Standing.CLAIM
    if node in disks.lost:
        return Standing.LOST
    expected = disks.id_of(node)
    if expected is None:  # a record from before identities: the upgrade rule
        return Standing.CLAIM if seen.has_chunks else Standing.MARK_LOST
    if expected == FRESH:
        return Standing.CLAIM
    if seen.disk_id == expected:
        return Standing.TRUSTED
    return Standing.MARK_LOST


def after_settling(
    membership: Membership, disks: MemberDisks, node: str, seen: DiskSeen, new_id: str
) -> tuple[Standing, MemberDisks]:
    """The record's disks after ``node`` acted on its standing: a claim records
    ``new_id`` (already written into the directory, so the node is then trusted), a
    lost disk is marked; otherwise unchanged. Returns the standing the node has then."""
    now = standing(membership, disks, node, seen)
    if now is Standing.CLAIM:
        return Standing.TRUSTED, disks.claimed(node, new_id)
    if now is Standing.MARK_LOST:
        return Standing.LOST, disks.marked_lost(node)
    return now, disks
