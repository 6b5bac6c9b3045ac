"""Cluster coordination in the MetaStore: node registration, stream members, leaders.

Keys (all JSON):

* ``cluster/nodes/{node}``: the node's advertised addresses and the epoch of its node
  lease ``cluster/node-lease/{node}``. One lease per node, renewed by one keepalive,
  however many streams the node leads.
* ``cluster/streams/{incarnation}``: the stream's member list (voters, learners), its
  leader (node name + that node's lease epoch at acquisition) and its epoch. The
  MetaStore's own epoch field of the key holds the stream epoch too, so an update by a
  deposed leader fails the store's epoch check as well as the version check. It also
  holds the identity each member's stream directory must carry (``disks``) and the
  members whose directory did not (``lost_disks``): ``disk_identity`` decides.

A stream's leader is *attached* to its node lease: the leader is live exactly while the
node lease named in the record is held with the recorded lease epoch. A lease that
expired never comes back with the same epoch, so once a leader's lease is gone every
node sees the leadership as free, for every stream that node led, at once.

Acquiring leadership is one conditional put on the stream key: it re-checks (against
the version read) that the node is a voter and that the recorded leader's lease is
gone, and bumps the epoch to ``max(record epoch, manifest pointer epoch, epochs the
caller saw on disk or in refusals) + 1``. Member changes are conditional puts by the
leader of the current epoch, one change at a time (``members.Membership``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from tierlog.cluster.disk_identity import (
    DiskSeen,
    MemberDisks,
    Standing,
    after_settling,
    standing,
)
from tierlog.cluster.errors import (
    ClusterError,
    DiskNotTrustedError,
    LeaderAliveError,
    MembershipChangeError,
    NotAMemberError,
    StaleEpochError,
    StreamUnavailableError,
)
from tierlog.cluster.members import Membership
from tierlog.cluster.state import next_leader_epoch
from tierlog.remote.catalog import ManifestPointer, pointer_key
from tierlog.storage.errors import (
    AlreadyExistsError,
    EpochFencedError,
    KeyDeletedError,
    LeaseLostError,
    VersionConflictError,
)
from tierlog.storage.meta_store import Lease, MetaStore, Versioned, validate_meta_key

NODES_PREFIX = "cluster/nodes/"
STREAMS_PREFIX = "cluster/streams/"
NODE_LEASE_PREFIX = "cluster/node-lease/"


def node_key(node: str) -> str:
    return NODES_PREFIX + quote(node, safe="")


def node_lease_name(node: str) -> str:
    return NODE_LEASE_PREFIX + quote(node, safe="")


def stream_key(incarnation: str) -> str:
    return STREAMS_PREFIX + quote(incarnation, safe="")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node advertises: where clients, admins and peers reach it."""

    name: str
    stream_address: str
    admin_address: str
    replication_address: str
    lease_epoch: int = 0

    def __post_init__(self) -> None:
        validate_meta_key(self.name)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "name": self.name,
                "stream": self.stream_address,
                "admin": self.admin_address,
                "replication": self.replication_address,
                "lease_epoch": self.lease_epoch,
            }
        ).encode()

    @staticmethod
    def decode(value: bytes) -> NodeInfo:
        data = _json(value, "node record")
        return NodeInfo(
            name=str(data["name"]),
            stream_address=str(data["stream"]),
            admin_address=str(data["admin"]),
            replication_address=str(data["replication"]),
            lease_epoch=int(data["lease_epoch"]),
        )


@dataclass(frozen=True, slots=True)
class StreamMembers:
    """A stream's cluster record as stored (``version`` is the MetaStore version)."""

    incarnation: str
    membership: Membership
    epoch: int
    leader: str | None
    leader_lease_epoch: int
    version: int
    replication_factor: int = 0
    """The voters the stream should have (RabbitMQ's ``initial-cluster-size``; member
    changes converge on it). 0: as many as it has (a record from before the field)."""
    disks: MemberDisks = field(default_factory=MemberDisks)
    """The identity each member's directory must carry, and the members whose disk is
    lost (``disk_identity``; members absent: recorded before identities existed)."""

    @property
    def target_voters(self) -> int:
        return self.replication_factor or len(self.membership.voters)

    def roles(self) -> dict[str, str]:
        """Every member's role as an operator reads it: ``voter``, ``learner``, with
        ``(disk lost)`` or ``(joining)`` (``MemberDisks.role_of``)."""
        return {m: self.disks.role_of(self.membership, m) for m in self.membership.members}

    def encode(self) -> bytes:
        return json.dumps(
            {
                "voters": list(self.membership.voters),
                "learners": list(self.membership.learners),
                "epoch": self.epoch,
                "leader": self.leader,
                "leader_lease_epoch": self.leader_lease_epoch,
                "replication_factor": self.target_voters,
                "disks": self.disks.as_dict(),
                "lost_disks": sorted(self.disks.lost),
            }
        ).encode()

    @staticmethod
    def decode(incarnation: str, stored: Versioned) -> StreamMembers:
        data = _json(stored.value, f"cluster record of {incarnation!r}")
        leader = data.get("leader")
        return StreamMembers(
            incarnation=incarnation,
            membership=Membership(tuple(data["voters"]), tuple(data["learners"])),
            epoch=int(data["epoch"]),
            leader=None if leader is None else str(leader),
            leader_lease_epoch=int(data["leader_lease_epoch"]),
            version=stored.version,
            replication_factor=int(data.get("replication_factor", 0)),
            disks=MemberDisks.of(
                {str(k): str(v) for k, v in dict(data.get("disks") or {}).items()},
                (str(n) for n in data.get("lost_disks") or ()),
            ),
        )


def _json(value: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise ClusterError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ClusterError(f"{what} is not a JSON object")
    return data


@dataclass(slots=True)
class DiskClaim:
    """A node's stream directory for the directory's disk checks: what it carries
    (``seen``) and how to give it a fresh identity (``take``: writes and fsyncs one
    into the directory, returns it)."""

    seen: DiskSeen
    take: Callable[[], str]


@dataclass(frozen=True, slots=True)
class Leadership:
    """A successful acquisition: lead ``incarnation`` in ``epoch`` with these members."""

    incarnation: str
    node: str
    epoch: int
    membership: Membership
    version: int
    lease_epoch: int
    """The node lease the leadership hangs on: it ends with that lease, even if the
    node registers again with a new one."""


class ClusterDirectory:
    """The cluster's coordination state in one MetaStore (SQLite or etcd)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    # --- nodes ----------------------------------------------------------------------
    def register_node(self, info: NodeInfo, ttl: float) -> tuple[NodeInfo, Lease]:
        """Take the node's lease (``LeaseHeldError`` while another process holds it)
        and publish its addresses with the lease epoch."""
        lease = self.meta.acquire_lease(node_lease_name(info.name), info.name, ttl)
        published = NodeInfo(
            info.name,
            info.stream_address,
            info.admin_address,
            info.replication_address,
            lease.epoch,
        )
        key = node_key(info.name)
        while True:
            current = self.meta.get(key)
            try:
                if current is None:
                    self.meta.create(key, published.encode(), epoch=lease.epoch)
                else:
                    self.meta.put_if(key, published.encode(), current.version, lease.epoch)
                return published, lease
            except (AlreadyExistsError, VersionConflictError, KeyDeletedError):
                continue  # a concurrent registration or cleanup: re-read and retry

    def renew_node(self, lease: Lease, ttl: float) -> Lease:
        """One keepalive for every stream the node leads (``LeaseLostError`` if lost)."""
        return self.meta.renew_lease(lease, ttl)

    def release_node(self, lease: Lease) -> None:
        self.meta.release_lease(lease)

    def node(self, name: str) -> NodeInfo | None:
        stored = self.meta.get(node_key(name))
        return None if stored is None else NodeInfo.decode(stored.value)

    def node_alive(self, name: str, lease_epoch: int | None = None) -> bool:
        """Whether ``name``'s node lease is held (with ``lease_epoch``, if given)."""
        lease = self.meta.read_lease(node_lease_name(name))
        return lease is not None and (lease_epoch is None or lease.epoch == lease_epoch)

    def live_nodes(self) -> list[NodeInfo]:
        """Registered nodes whose current lease is the one they registered with."""
        out = []
        for stored in self.meta.list(NODES_PREFIX):
            info = NodeInfo.decode(stored.value)
            if self.node_alive(info.name, info.lease_epoch):
                out.append(info)
        return out

    # --- streams --------------------------------------------------------------------
    def create_stream(self, incarnation: str, voters: Iterable[str]) -> StreamMembers:
        """Record a new stream's members (chosen at creation); no leader yet."""
        membership = Membership(tuple(voters))
        disks = MemberDisks.created(membership.voters)
        record = StreamMembers(incarnation, membership, 0, None, 0, 0, disks=disks)
        stored = self.meta.create(stream_key(incarnation), record.encode(), epoch=0)
        return StreamMembers.decode(incarnation, stored)

    def stream(self, incarnation: str) -> StreamMembers | None:
        stored = self.meta.get(stream_key(incarnation))
        return None if stored is None else StreamMembers.decode(incarnation, stored)

    def require_stream(self, incarnation: str) -> StreamMembers:
        record = self.stream(incarnation)
        if record is None:
            raise ClusterError(f"stream {incarnation!r} has no cluster record")
        return record

    def delete_stream(self, incarnation: str) -> None:
        self.meta.delete(stream_key(incarnation))

    def leader_alive(self, record: StreamMembers) -> bool:
        return record.leader is not None and self.node_alive(
            record.leader, record.leader_lease_epoch
        )

    def leader_of(self, incarnation: str) -> NodeInfo:
        """The live leader's addresses; ``StreamUnavailableError`` if there is none."""
        record = self.require_stream(incarnation)
        if record.leader is None or not self.leader_alive(record):
            raise StreamUnavailableError(
                f"stream {incarnation!r} has no live leader (epoch {record.epoch})"
            )
        info = self.node(record.leader)
        if info is None:
            raise StreamUnavailableError(f"leader {record.leader!r} is not registered")
        return info

    def acquire_leadership(
        self,
        incarnation: str,
        node: str,
        node_lease: Lease,
        seen_epochs: Iterable[int] = (),
        disk: DiskClaim | None = None,
    ) -> Leadership:
        """The acquisition transaction: one conditional put on the stream record that
        re-checks membership, the node's disk and the old leader's liveness against the
        version read, and takes ``next_leader_epoch``. ``seen_epochs``: the highest epoch
        on this node's disk plus any epoch members reported when refusing an earlier
        attempt. ``disk``: this node's stream directory; a node whose directory is not
        the one the record trusts never leads (``disk_identity``): a fresh or upgraded
        place is claimed in the same put. None only where no directory exists (tests of
        the directory alone).

        Raises ``NotAMemberError`` (``DiskNotTrustedError``: not its trusted disk; the
        record then says the disk is lost), ``LeaderAliveError``, ``VersionConflictError``
        (a concurrent change: re-read and retry), ``KeyDeletedError`` (stream deleted)."""
        stored = self.meta.get(stream_key(incarnation))
        if stored is None:
            raise KeyDeletedError(f"stream {incarnation!r} has no cluster record")
        record = StreamMembers.decode(incarnation, stored)
        if not record.membership.is_voter(node):
            raise NotAMemberError(f"{node!r} is not a voter of {incarnation!r}")
        disks = record.disks
        if disk is not None:
            now = standing(record.membership, record.disks, node, disk.seen)
            if now is Standing.CLAIM:
                disks = record.disks.claimed(node, disk.take())
            elif now is not Standing.TRUSTED:
                if now is Standing.MARK_LOST:
                    with contextlib.suppress(VersionConflictError, EpochFencedError):
                        # best effort: the member's next scan records it otherwise
                        self._put_disks(stored, record, record.disks.marked_lost(node))
                raise DiskNotTrustedError(
                    f"{node!r}: its directory of {incarnation!r} is not the disk the stream"
                    f" trusts ({now.value}); it rejoins as a learner"
                )
        if record.leader not in (None, node) and self.leader_alive(record):
            raise LeaderAliveError(
                f"{record.leader!r} leads {incarnation!r} in epoch {record.epoch}"
            )
        if not self.node_alive(node, node_lease.epoch):
            # a lease the node has not noticed expiring (cut from the MetaStore): a
            # leadership recorded on it would look leaderless to every other node
            raise LeaseLostError(f"{node!r}: node lease epoch {node_lease.epoch} is not held")
        pointer = self.meta.get(pointer_key(incarnation))
        pointer_epoch = 0 if pointer is None else ManifestPointer.decode(pointer.value, 0).epoch
        epoch = next_leader_epoch(max(record.epoch, stored.epoch), pointer_epoch, seen_epochs)
        new = replace(
            record, epoch=epoch, leader=node, leader_lease_epoch=node_lease.epoch, disks=disks
        )
        written = self.meta.put_if(stream_key(incarnation), new.encode(), stored.version, epoch)
        return Leadership(
            incarnation, node, epoch, record.membership, written.version, node_lease.epoch
        )

    def settle_disk(self, incarnation: str, node: str, disk: DiskClaim) -> Standing:
        """A member (not leading) acts on its disk standing before it follows: claims a
        fresh or upgraded place (``disk.take`` writes the identity into the directory
        first, at most once) or records that its disk is lost. Conditional puts on the
        record that change nothing else (a concurrent change: re-read, decide again).
        Returns the standing it then has: only ``TRUSTED`` may adopt and acknowledge."""
        taken: str | None = None
        while True:
            stored = self.meta.get(stream_key(incarnation))
            if stored is None:
                return Standing.NOT_MEMBER
            record = StreamMembers.decode(incarnation, stored)
            now = standing(record.membership, record.disks, node, disk.seen)
            if now is Standing.CLAIM and taken is None:
                taken = disk.take()
            after, disks = after_settling(
                record.membership, record.disks, node, disk.seen, taken or ""
            )
            if disks == record.disks:
                return after
            try:
                self._put_disks(stored, record, disks)
            except (VersionConflictError, EpochFencedError):
                continue  # the record moved: decide again on the new one
            if taken is not None:
                disk.seen = DiskSeen(taken, disk.seen.has_chunks)
            return after

    def _put_disks(self, stored: Versioned, record: StreamMembers, disks: MemberDisks) -> None:
        """Record ``disks`` on the record as read (``VersionConflictError`` if it moved);
        leader, epoch and members unchanged."""
        new = replace(record, disks=disks)
        self.meta.put_if(stream_key(record.incarnation), new.encode(), stored.version, stored.epoch)

    def _leader_update(
        self,
        leadership: Leadership,
        change: Callable[[StreamMembers], tuple[Membership, MemberDisks]],
        replication_factor: int | None = None,
    ) -> Leadership:
        """One member change by the leader of the current epoch: a conditional put on
        the record it was computed from (``VersionConflictError``: re-read and retry)."""
        stored = self.meta.get(stream_key(leadership.incarnation))
        if stored is None:
            raise KeyDeletedError(f"stream {leadership.incarnation!r} has no cluster record")
        record = StreamMembers.decode(leadership.incarnation, stored)
        if record.epoch != leadership.epoch or record.leader != leadership.node:
            raise StaleEpochError(leadership.epoch, record.epoch)
        membership, disks = change(record)
        factor = record.target_voters if replication_factor is None else replication_factor
        if factor < 1:
            raise MembershipChangeError(f"replication factor must be >= 1, got {factor}")
        new = replace(record, membership=membership, replication_factor=factor, disks=disks)
        try:
            written = self.meta.put_if(
                stream_key(leadership.incarnation), new.encode(), stored.version, record.epoch
            )
        except EpochFencedError as exc:
            raise StaleEpochError(leadership.epoch, record.epoch + 1) from exc
        return Leadership(
            leadership.incarnation,
            leadership.node,
            record.epoch,
            membership,
            written.version,
            record.leader_lease_epoch,
        )

    def add_learner(
        self, leadership: Leadership, node: str, replication_factor: int | None = None
    ) -> Leadership:
        """Start a member change: ``node`` joins as a learner (one change at a time), with
        a fresh place to claim. ``replication_factor``: the stream's new target, if it
        changes with this."""
        return self._leader_update(
            leadership,
            lambda r: (r.membership.add_learner(node), r.disks.joined(node)),
            replication_factor,
        )

    def promote_learner(
        self, leadership: Leadership, node: str, learner_written: int, commit_offset: int
    ) -> Leadership:
        """Make a caught-up learner a voter; refused while its disk is not the one it
        claimed (lost, or its place not taken yet)."""

        def promote(record: StreamMembers) -> tuple[Membership, MemberDisks]:
            if record.disks.id_of(node) is not None and not record.disks.trusted(node):
                raise MembershipChangeError(f"learner {node!r} holds no trusted disk")
            return record.membership.promote(node, learner_written, commit_offset), record.disks

        return self._leader_update(leadership, promote)

    def remove_member(
        self, leadership: Leadership, node: str, replication_factor: int | None = None
    ) -> Leadership:
        return self._leader_update(
            leadership,
            lambda r: (r.membership.remove(node), r.disks.removed(node)),
            replication_factor,
        )

    def demote_voter(self, leadership: Leadership, node: str) -> Leadership:
        """A voter whose disk is lost becomes a learner with a fresh place to claim (it
        catches up and is promoted like any learner); the replication factor stays."""
        return self._leader_update(
            leadership, lambda r: (r.membership.demote(node), r.disks.joined(node))
        )

    def resign(self, leadership: Leadership) -> None:
        """Give the stream up (step-down, retirement): clear the leader, keep the epoch,
        so the next leader can take over without waiting for our node lease to expire.
        A no-op if a newer epoch already leads."""
        while True:
            stored = self.meta.get(stream_key(leadership.incarnation))
            if stored is None:
                return
            record = StreamMembers.decode(leadership.incarnation, stored)
            if record.epoch != leadership.epoch or record.leader != leadership.node:
                return
            new = replace(record, leader=None, leader_lease_epoch=0)
            try:
                self.meta.put_if(
                    stream_key(leadership.incarnation), new.encode(), stored.version, record.epoch
                )
                return
            except VersionConflictError:
                continue
