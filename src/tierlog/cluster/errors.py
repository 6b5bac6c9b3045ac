"""Typed errors of the cluster layer."""

from __future__ import annotations

from tierlog.errors import TierlogError


class ClusterError(TierlogError):
    """Base class of cluster errors."""


class StaleEpochError(ClusterError):
    """A chunk, ack or command carries an epoch lower than the highest one this member
    has seen: it comes from a deposed leader and is refused."""

    def __init__(self, epoch: int, highest: int) -> None:
        super().__init__(f"epoch {epoch} is older than the highest seen epoch {highest}")
        self.epoch = epoch
        self.highest = highest


class StreamUnavailableError(ClusterError):
    """The stream has no leader and no majority of its members is reachable: it stays
    unavailable rather than elect a member that may lack committed chunks."""


class NotAMemberError(ClusterError):
    """The node is not a voting member of the stream, so it may not lead it."""


class LeaderAliveError(ClusterError):
    """The stream's leader still holds a live node lease; leadership cannot be taken."""


class MembershipChangeError(ClusterError):
    """A member change broke a rule: one change at a time, learners before voters,
    a learner is promoted only once it holds everything up to the commit offset."""


class DivergentLogError(ClusterError):
    """A member's tail (last epoch, last chunk id) is not on the leader's log: the
    member must truncate its divergent suffix before it may fetch."""


class LinkError(ClusterError):
    """A node-to-node link failed."""


class LinkAuthError(LinkError):
    """The peer did not prove it holds the cluster secret (or named another node)."""


class LinkClosedError(LinkError):
    """The link is closed."""


class CatchUpError(ClusterError):
    """A new leader could not take the most up-to-date member's log."""


class NotLeaderError(ClusterError):
    """This node does not lead the stream (another node does, or nobody can yet):
    clients are told to look the leader up again."""


class DiskNotTrustedError(NotAMemberError):
    """This node's stream directory does not carry the identity the stream's record
    trusts (an empty, replaced or older directory): it may neither vote nor lead until
    it rejoined as a learner (``cluster/disk_identity.py``)."""
