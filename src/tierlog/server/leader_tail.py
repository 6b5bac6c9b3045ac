"""The committed tail of a clustered stream, as its leader tells other nodes.

A node that serves a stream it does not lead (a non-member, from the remote tier) asks
the leader over the replication link (``cluster.tail_queries``) where the part its
consumers may read ends, so ``next`` / ``last`` resolve as on the leader, and for a
producer's last publishing id, so QueryPublisherSequence is answered with the leader's
value instead of a guess. The leader answers from what its own consumers see: the
cluster commit (or, for ``ack = remote`` streams, the remote commit), turned into the
offset after that chunk and the last user chunk up to it by index lookups off the event
loop. No answer within ``timeout`` (the leader is unreachable, or the directory scan
named a node that no longer leads) is None: the asker falls back to the remote tier.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tierlog.formats import replication as wire
from tierlog.log.committed_chunk import chunk_end, last_user_chunk
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.catalog import StreamRecord
from tierlog.server.delayed_intake import publisher_sequence
from tierlog.server.remote_stream import CommittedTail

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService

log = get_logger("tierlog.server.leader_tail")

DEFAULT_TIMEOUT = 1.0


class LeaderTails:
    """Both sides on one node: ``answer`` for the streams it leads, ``ask`` for the
    others."""

    def __init__(self, service: ClusterService, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.service = service
        self.timeout = timeout

    async def answer(self, incarnation: str, reference: str) -> wire.Tail | None:
        """This node's committed tail of a stream it leads (None: it does not lead it,
        or its election has not ended)."""
        service = self.service
        leading = service.leading_now(incarnation)
        if leading is None:
            return None  # not leading, or elected and its consumers' view not set yet
        handle, leader = leading
        if handle.remote_ack is not None:
            commit = handle.remote_ack.view.commit_point().chunk_id
        else:
            view = service.read_views.get(incarnation)
            commit = (view or handle.log).commit_point().chunk_id
        if commit < 0:
            return None
        sequence = None
        if reference:
            broker = service.broker
            sequence = (
                handle.log.producer_sequence(reference)
                if broker is None
                else publisher_sequence(broker, handle, reference)
            )
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, _tail_of, handle.log, commit)
        if found is None:
            return None
        next_offset, last = found
        return wire.Tail(
            incarnation,
            leader.epoch,
            0,
            True,
            commit,
            next_offset,
            last,
            -1 if sequence is None else sequence,
        )

    async def ask(self, record: StreamRecord, reference: str = "") -> CommittedTail | None:
        """The leader's committed tail of ``record``'s stream (None: no leader known,
        this node leads it, no replication link, or no answer in time)."""
        hub = self.service.hub
        leader = self.service.leader_elsewhere(record.incarnation)
        if hub is None or leader is None:
            return None
        tail = await hub.query_tail(record.incarnation, leader, reference, timeout=self.timeout)
        if tail is None:
            log.info("leader_tail_unanswered", stream=record.name, leader=leader)
            return None
        sequence = None if tail.sequence < 0 else tail.sequence
        return CommittedTail(
            tail.next_offset, tail.last_user_chunk_id, sequence, tail.commit_chunk_id
        )


def _tail_of(stream_log: StreamLog, commit: int) -> tuple[int, int] | None:
    end = chunk_end(stream_log, commit)
    if end is None:
        return None
    return end.next_offset, last_user_chunk(stream_log, commit)
