"""Read anywhere on a cluster node: a stream of which this node is not a member is served
read-only from the remote tier (``server.remote_stream``), the way a read-only node serves
every stream. Subscribe, QueryOffset and StoreOffset reach it; publishing and declaring a
publisher still get STREAM_NOT_AVAILABLE with Metadata naming the members (only members
write). StoreOffset goes to the MetaStore offsets, which the next leader takes over.

Why members are excluded: a member's consumers follow the cluster commit through the
leader, and a learner's local log would otherwise be shadowed by a slower remote copy.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tierlog.remote.catalog import Catalog
from tierlog.server.broker import LED_ELSEWHERE, Broker, StreamHandle
from tierlog.server.config import ServerConfig
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
        self.remote = RemoteStreams(config, catalog, store)

    def attach(self, broker: Broker) -> None:
        self.remote.start(asyncio.get_running_loop())
        broker.read_elsewhere = self.handle

    def handle(self, vhost: str, name: str) -> StreamHandle | None:
        """The read-only handle of a catalog stream led elsewhere of which this node is
        not a member (voter or learner); None otherwise."""
        broker = self.service.broker
        if broker is None:
            return None
        opening = broker.opening(vhost, name)
        if opening is None or opening.state != LED_ELSEWHERE:
            return None
        place = self.service.view.streams.get(opening.record.incarnation)
        if place is None or self.service.name in place.record.membership.members:
            return None
        handle: Any = self.remote.handle(opening.record)  # duck-typed, as on a read-only node
        return handle

    def close(self) -> None:
        self.remote.close()
