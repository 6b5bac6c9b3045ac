"""A stream's writer takes over the consumer offsets stored in the MetaStore while no
member could store them (``remote.consumer_offsets``: a read-only node served the stream).

When the writer opens the stream (after resolution, before it accepts anything), every
MetaStore offset of the incarnation not taken over yet is written into the log as a
StoreOffset (a tracking chunk, tiered like any other) and fsynced, then marked taken at the
log's next offset (unless it changed meanwhile). The key stays: a read-only node answers from
it until the remote tier holds the tracking chunk, and from the remote tier's tracking state
after. From then on the writer's log answers QueryOffset, as for any consumer that stored
through a member; a QueryOffset the log cannot answer looks in the MetaStore (``meta_offset``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tierlog.errors import TierlogError
from tierlog.log.errors import InvalidAppendError
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.consumer_offsets import ConsumerOffsets

if TYPE_CHECKING:
    from tierlog.server.broker import StreamHandle

log = get_logger("tierlog.server.meta_offsets")


def take_over(stream_log: StreamLog, offsets: ConsumerOffsets, incarnation: str) -> int:
    """Write the incarnation's MetaStore offsets not taken over yet into the log (writer
    thread, before the stream accepts anything), fsync, then mark them taken at the log's
    next offset; how many."""
    pending = {r: v for r, v in offsets.list(incarnation).items() if v.taken_at is None}
    if not pending:
        return 0
    written = []
    for reference, value in pending.items():
        try:
            stream_log.store_offset(reference, value.offset)
        except (InvalidAppendError, ValueError) as exc:
            log.warning("meta_offset_not_taken", reference=reference, error=repr(exc))
            continue
        written.append(reference)
    end = stream_log.sync().next_offset  # durable in the log before it is marked taken
    for reference in written:
        offsets.mark_taken(incarnation, pending[reference], reference, end)
    return len(written)


async def take_over_offsets(handle: StreamHandle, offsets: ConsumerOffsets) -> None:
    """``take_over`` on the stream's writer lane; a failure is logged and retried at the
    next open (the MetaStore keeps the offsets meanwhile)."""
    loop = asyncio.get_running_loop()
    try:
        taken = await loop.run_in_executor(
            handle.executor, take_over, handle.log, offsets, handle.record.incarnation
        )
    except (TierlogError, OSError) as exc:
        log.warning("meta_offsets_take_over_failed", stream=handle.name, error=repr(exc))
        return
    if taken:
        log.info("meta_offsets_taken_over", stream=handle.name, offsets=taken)


async def meta_offset(handle: StreamHandle, reference: str) -> int | None:
    """A consumer offset the MetaStore holds for the stream (stored on a read-only node
    and not taken over yet), for a QueryOffset the log has no answer to."""
    offsets = ConsumerOffsets(handle.broker.catalog.meta)
    loop = asyncio.get_running_loop()
    try:
        stored = await loop.run_in_executor(
            None, offsets.query, handle.record.incarnation, reference
        )
    except (TierlogError, OSError) as exc:
        log.warning("meta_offset_query_failed", stream=handle.name, error=repr(exc))
        return None
    return None if stored is None else stored.offset
