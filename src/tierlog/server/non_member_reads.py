"""Read anywhere on a cluster node: a stream of which this node is not a member is served
read-only from the remote tier (``server.remote_stream``), the way a read-only node serves
every stream. Subscribe, QueryOffset and StoreOffset reach it; publishing and declaring a
publisher still get STREAM_NOT_AVAILABLE with Metadata naming the members (only members
write). StoreOffset and QueryOffset go to the leader (``server.leader_offsets``); when it
does not answer, a StoreOffset goes to the MetaStore offsets, which the leader takes over,
and a QueryOffset is refused (STREAM_NOT_AVAILABLE) rather than answered lower.
``next`` / ``last`` and QueryPublisherSequence ask the leader (``server.leader_tail``).

Members (voters and learners) that do not lead serve consumers from their own follower
log up to the cluster commit they learned (``server.member_reads``); the handle is
chosen here for both. An ``ack = remote`` stream's consumers read only what the remote
tier committed, on its leader too, so its members serve them from the remote tier.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tierlog.remote.catalog import Catalog
from tierlog.server.broker import LED_ELSEWHERE, Broker, StreamHandle
from tierlog.server.config import ServerConfig
from tierlog.server.leader_offsets import LeaderOffsets
from tierlog.server.leader_tail import LeaderTails
from tierlog.server.member_reads import (
    BOUND_CHECK_SECONDS,
    MemberBound,
    MemberReads,
    ReplicaProgress,
)
from tierlog.server.remote_stream import RemoteStreams
from tierlog.storage.object_store import ObjectStore

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService


class NonMemberReads:
    """The read-only handles of the streams this cluster node is not a member of."""

    def __init__(
        self,
        config: ServerConfig,
        catalog: Catalog,
        store: ObjectStore,
        service: ClusterService,
    ) -> None:
        self.service = service
        self.tails = LeaderTails(service)
        self.offsets = LeaderOffsets(service)
        forward = self.offsets.forward if service.hub is not None else None
        self.remote = RemoteStreams(
            config, catalog, store, leader_tail=self.tails.ask, forward_offset=forward
        )
        self.members = MemberReads(self.remote)
        # one lease TTL, and never less than a few replication heartbeats (an idle
        # leader answers a fetch once per heartbeat)
        heartbeats = 3 * service.hub.heartbeat if service.hub is not None else 0.0
        self.members.bound = MemberBound(
            heard_within=max(config.cluster.lease_ttl_seconds, heartbeats)
        )
        self._bounds: asyncio.Task[None] | None = None

    def attach(self, broker: Broker) -> None:
        self.remote.start(asyncio.get_running_loop())
        broker.read_elsewhere = self.handle
        if self.service.hub is not None:  # the leader answers the others' tail queries
            self.service.hub.tail_answerer = self.tails.answer
            self.service.hub.offset_answerer = self.offsets.answer
        followers = self.service.followers
        if followers is not None:  # replication runs here: members serve consumers
            followers.reads = self.members
            for follower in followers.streams.values():
                self.members.opened(follower.record, follower.log)
            self.service.replicas_serve = True
            self.members.progress = self._progress
            self.service.member_refusal = self.members.refusal
            self._bounds = asyncio.create_task(self._check_bounds())

    def _progress(self, incarnation: str) -> tuple[ReplicaProgress, float] | None:
        """A followed stream's replication progress and the seconds since its leader
        was last heard, from the replica runner."""
        hub = self.service.hub
        followed = None if hub is None else hub.followed.get(incarnation)
        if followed is None:
            return None
        age = asyncio.get_running_loop().time() - followed.heard_at
        return followed.status(), age

    async def _check_bounds(self) -> None:
        while True:
            await asyncio.sleep(BOUND_CHECK_SECONDS)
            self.members.check_bounds()

    def handle(self, vhost: str, name: str) -> StreamHandle | None:
        """The consumers' handle of a catalog stream led elsewhere: the member handle
        when this node is a member (voter or learner), else the read-only one."""
        broker = self.service.broker
        if broker is None:
            return None
        opening = broker.opening(vhost, name)
        if opening is None or opening.state != LED_ELSEWHERE:
            return None
        place = self.service.view.streams.get(opening.record.incarnation)
        if place is None:
            return None
        handle: Any  # duck-typed, as on a read-only node
        if (
            self.service.name in place.record.membership.members
            and opening.record.settings.ack != "remote"  # its consumers read the remote tier
        ):
            handle = self.members.handle(opening.record)
        else:
            handle = self.remote.handle(opening.record)
        return handle

    def close(self) -> None:
        if self._bounds is not None:
            self._bounds.cancel()
        self.members.close()
        self.remote.close()
