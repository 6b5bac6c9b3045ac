"""Consumer offsets of a clustered stream kept by its leader, for consumers on any node.

A node that serves consumers of a stream it does not lead (a member reading its follower
log, or a non-member reading the remote tier) forwards their StoreOffset and QueryOffset to
the leader over the replication link (``cluster.offset_requests``): the leader's log is the
one place that holds them while the stream has a reachable leader, so a consumer that stores
on one node and queries on another gets the latest value. The leader answers a store once
it is written through the stream's write path (``StreamHandle.flush``) and the stream's
cluster commit holds it, and a query with ``leader_query_offset`` (the log's value, or a
newer one pending in the MetaStore, taken over first; also only once committed): an
answer never rests on a chunk a failover could drop.

No answer within ``timeout`` (no leader known, it is unreachable, it lost the stream, or it
cannot commit) is None: the asker keeps a store in the MetaStore instead
(``remote.consumer_offsets``), which the leader takes over when it next answers a
QueryOffset or opens the stream, and refuses a query (STREAM_NOT_AVAILABLE).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tierlog.cluster.offset_requests import NOT_LEADING
from tierlog.logs import get_logger
from tierlog.remote.catalog import StreamRecord
from tierlog.server.errors import OffsetUnavailableError
from tierlog.server.meta_offsets import committed_on_leader, leader_query_offset
from tierlog.server.remote_stream import LeaderOffset

if TYPE_CHECKING:
    from tierlog.cluster.hub import ReplicationHub
    from tierlog.server.broker import StreamHandle
    from tierlog.server.cluster_service import ClusterService

log = get_logger("tierlog.server.leader_offsets")

DEFAULT_TIMEOUT = 1.0
ANSWER_TIMEOUT = 10.0  # the asker gave up long before


class LeaderOffsets:
    """Both sides on one node: ``answer`` for the streams it leads, ``forward`` for the
    others."""

    def __init__(self, service: ClusterService, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.service = service
        self.timeout = timeout

    async def answer(self, incarnation: str, reference: str, store: int | None) -> object:
        """Store ``store`` for ``reference`` (None: only query) as the stream's leader;
        the consumer's offset then (None: none stored), or ``NOT_LEADING`` when this node
        does not lead the stream or did not store it."""
        leading = self.service.leading_now(incarnation)
        if leading is None:
            return NOT_LEADING
        return await answer_as_writer(leading[0], reference, store)

    async def forward(
        self, record: StreamRecord, reference: str, store: int | None
    ) -> LeaderOffset | None:
        """Send a StoreOffset (``store``) or QueryOffset (None) to the stream's leader;
        None when there is no other leader to send it to or it did not answer in time."""
        hub = self.service.hub
        leader = self.service.leader_elsewhere(record.incarnation)
        if hub is None or leader is None:
            return None
        return await forward_to(hub, record, leader, reference, store, self.timeout)


async def answer_as_writer(handle: StreamHandle, reference: str, store: int | None) -> object:
    """A forwarded StoreOffset (``store``) or QueryOffset (None) answered by the stream's
    writer: the consumer's offset after it (None: none stored), or ``NOT_LEADING`` when
    the store was not written (the asker keeps it in the MetaStore then)."""
    if handle.closed or handle.unavailable is not None:
        return NOT_LEADING  # refusing writes: its answers may be behind
    if not reference or len(reference.encode("utf-8")) > 255:
        return NOT_LEADING
    if store is not None:
        handle.submit_store_offset(reference, store)
        if not await _flushed(handle):
            return NOT_LEADING
        if handle.closed or handle.unavailable is not None:
            return NOT_LEADING  # the write failed, or the stream went away meanwhile
        # written (later stores of the consumer, queued with it, may have replaced it)
        found = handle.log.query_offset(reference)
        if not await committed_on_leader(handle):
            return NOT_LEADING  # not on a majority: the asker keeps it in the MetaStore
        return found
    if not await _flushed(handle):
        return NOT_LEADING
    try:
        return await leader_query_offset(handle, reference)
    except OffsetUnavailableError:
        return NOT_LEADING


async def _flushed(handle: StreamHandle) -> bool:
    """Whether what the stream queued so far was written within ``ANSWER_TIMEOUT`` (a
    leader that cannot commit does not keep answers waiting for ever)."""
    try:
        await asyncio.wait_for(handle.flush(), ANSWER_TIMEOUT)
    except TimeoutError:
        return False
    return True


async def forward_to(
    hub: ReplicationHub,
    record: StreamRecord,
    leader: str,
    reference: str,
    store: int | None,
    timeout: float,
) -> LeaderOffset | None:
    """Send a StoreOffset or QueryOffset to ``leader`` over ``hub``; its answer, or None
    (logged) when none came within ``timeout``."""
    answer = await hub.forward_offset(record.incarnation, leader, reference, store, timeout=timeout)
    if answer is None:
        log.info(
            "leader_offset_unanswered", stream=record.name, leader=leader, store=store is not None
        )
        return None
    return LeaderOffset(None if answer.offset < 0 else answer.offset)
