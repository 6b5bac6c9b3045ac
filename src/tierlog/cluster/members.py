"""Who replicates a stream, and the quorum arithmetic on top of it.

A stream's members are voters (counted for elections and the commit offset) and
learners (replicate, never counted). Changes go one at a time, so any majority of the
old voter set and any majority of the new one share a member: a new member first joins
as a learner, is promoted once it holds everything up to the commit offset, and only
then may the next change start. Removing a voter is its own change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tierlog.cluster.errors import MembershipChangeError

T = TypeVar("T", int, float)


def majority(voter_count: int) -> int:
    """Members needed for a majority of ``voter_count`` voters."""
    return voter_count // 2 + 1


def quorum_value(values: Mapping[str, T], voters: Iterable[str], missing: T) -> T:
    """The highest value held by a majority of ``voters``: the majority-th largest of
    their values, a voter absent from ``values`` counting as ``missing``."""
    voter_list = list(voters)
    ranked = sorted((values.get(v, missing) for v in voter_list), reverse=True)
    return ranked[majority(len(voter_list)) - 1]


@dataclass(frozen=True, slots=True)
class Membership:
    """The member list of one stream. ``voters`` and ``learners`` are disjoint, sorted."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.voters:
            raise MembershipChangeError("a stream needs at least one voter")
        if len(set(self.voters)) != len(self.voters) or len(set(self.learners)) != len(
            self.learners
        ):
            raise MembershipChangeError("duplicate member")
        if set(self.voters) & set(self.learners):
            raise MembershipChangeError("a member is both voter and learner")
        object.__setattr__(self, "voters", tuple(sorted(self.voters)))
        object.__setattr__(self, "learners", tuple(sorted(self.learners)))

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted(self.voters + self.learners))

    @property
    def changing(self) -> bool:
        """A change is in progress while a learner waits for promotion."""
        return bool(self.learners)

    def is_voter(self, node: str) -> bool:
        return node in self.voters

    def majority(self) -> int:
        return majority(len(self.voters))

    def add_learner(self, node: str) -> Membership:
        if node in self.voters or node in self.learners:
            raise MembershipChangeError(f"{node!r} is already a member")
        if self.changing:
            raise MembershipChangeError(
                f"member change in progress (learner {self.learners[0]!r}); one at a time"
            )
        return Membership(self.voters, (node,))

    def promote(self, node: str, learner_written: int, commit_offset: int) -> Membership:
        """Make ``node`` a voter: only once it has written every chunk up to the commit
        offset (its written chunk id is at least the committed chunk id)."""
        if node not in self.learners:
            raise MembershipChangeError(f"{node!r} is not a learner")
        if learner_written < commit_offset:
            raise MembershipChangeError(
                f"learner {node!r} has written up to {learner_written},"
                f" below the commit offset {commit_offset}"
            )
        return Membership((*self.voters, node), tuple(n for n in self.learners if n != node))

    def remove(self, node: str) -> Membership:
        """Drop a learner (abandoning its change) or, when no change is in progress,
        a voter (never the last)."""
        if node in self.learners:
            return Membership(self.voters, tuple(n for n in self.learners if n != node))
        if node not in self.voters:
            raise MembershipChangeError(f"{node!r} is not a member")
        if self.changing:
            raise MembershipChangeError("member change in progress; one at a time")
        if len(self.voters) == 1:
            raise MembershipChangeError("cannot remove the last voter")
        return Membership(tuple(n for n in self.voters if n != node), ())

    def demote(self, node: str) -> Membership:
        """Make voter ``node`` a learner (its disk was lost: it must catch up and be
        promoted again). A removal of a voter and the addition of a learner in one
        change: never while another change is in progress, never the last voter."""
        if node not in self.voters:
            raise MembershipChangeError(f"{node!r} is not a voter")
        if self.changing:
            raise MembershipChangeError("member change in progress; one at a time")
        if len(self.voters) == 1:
            raise MembershipChangeError("cannot demote the last voter")
        return Membership(tuple(n for n in self.voters if n != node), (node,))
