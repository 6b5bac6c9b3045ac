"""A stream's writer takes over the consumer offsets stored in the MetaStore while it
could not store them (``remote.consumer_offsets``: a read-only node served the stream, or a
node's StoreOffset forwarded to the leader got no answer in time).

A MetaStore offset not taken over yet (pending) is written into the log as a StoreOffset (a
tracking chunk, tiered like any other) and fsynced, then marked taken at the log's next
offset (unless it changed meanwhile). That happens when the writer opens the stream (after
resolution, before it accepts anything) and whenever a QueryOffset reaches the leader
(``leader_query_offset``: its own consumers' and those forwarded to it), which every
QueryOffset does while the stream has a reachable leader. So a value stored in the MetaStore
while a leader was up is never shadowed by an older one in the log.

Which is newer: consumer offsets only go up (as within one epoch of the MetaStore values),
so a pending value at or below the log's is an older store that reached the MetaStore after
a newer one reached the log; it is marked taken without being written.

The key stays: a read-only node answers from it until the remote tier holds the tracking
chunk, and from the remote tier's tracking state after.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tierlog.errors import TierlogError
from tierlog.log.errors import InvalidAppendError
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.consumer_offsets import ConsumerOffsets
from tierlog.server.errors import OffsetUnavailableError

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
        logged = stream_log.query_offset(reference)
        if logged is not None and logged >= value.offset:
            written.append(reference)  # an older store: the log's value stays
            continue
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


COMMIT_TIMEOUT = 5.0
"""How long a leader's offset answer waits for the cluster commit of what it answers."""


async def leader_query_offset(handle: StreamHandle, reference: str) -> int | None:
    """QueryOffset on the stream's writer: ``writer_offset``, answered only once the
    stream's cluster commit holds it (``committed_on_leader``): a value read from chunks
    only this leader wrote could be gone after a failover, and the consumer would be
    answered a lower offset by the next leader. Raises ``OffsetUnavailableError`` when
    the commit does not come."""
    offset = await writer_offset(handle, reference)
    if not await committed_on_leader(handle):
        raise OffsetUnavailableError(
            f"{handle.name}: the chunk holding the offset of {reference!r} is not committed"
        )
    return offset


async def committed_on_leader(handle: StreamHandle, timeout: float = COMMIT_TIMEOUT) -> bool:
    """Whether everything the stream's log holds now (its last written chunk, after what
    was queued so far is written) reaches the cluster commit within ``timeout``; True at
    once on a single node (no cluster: the local fsync is the commit)."""
    await handle.flush()
    gate = handle.confirm_gate
    if gate is None:
        return True
    # no await between the flush and here: nothing is being written, the end is stable
    return await gate.committed(handle.log.last_chunk_id, timeout)


async def writer_offset(handle: StreamHandle, reference: str) -> int | None:
    """The consumer's offset on the stream's writer: the log's value, unless the
    MetaStore holds a pending higher one (stored where the leader could not be reached),
    which is taken over into the log first; the MetaStore's value when the log has none."""
    offsets = ConsumerOffsets(handle.broker.catalog.meta)
    loop = asyncio.get_running_loop()
    logged = handle.log.query_offset(reference)
    try:
        stored = await loop.run_in_executor(
            None, offsets.query, handle.record.incarnation, reference
        )
    except (TierlogError, OSError) as exc:
        log.warning("meta_offset_query_failed", stream=handle.name, error=repr(exc))
        return logged
    if stored is None:
        return logged
    if stored.taken_at is None and (logged is None or stored.offset > logged):
        # through the stream's own write path (its group commit and replication)
        handle.submit_store_offset(reference, stored.offset)
        await handle.flush()
        if handle.log.query_offset(reference) == stored.offset:
            at = handle.log.next_offset
            incarnation = handle.record.incarnation
            try:
                await loop.run_in_executor(
                    None, offsets.mark_taken, incarnation, stored, reference, at
                )
            except (TierlogError, OSError) as exc:  # taken over again later: same value
                log.warning("meta_offset_mark_failed", stream=handle.name, error=repr(exc))
            log.info("meta_offset_taken_over", stream=handle.name, reference=reference)
        return stored.offset
    if stored.taken_at is None and logged is not None and await committed_on_leader(handle):
        # an older store that reached the MetaStore after a newer one reached the log
        # (committed: a failover keeps it): marked taken, so that no node answers the
        # older one while the leader is away
        at = handle.log.next_offset
        try:
            await loop.run_in_executor(
                None, offsets.mark_taken, handle.record.incarnation, stored, reference, at
            )
        except (TierlogError, OSError) as exc:  # marked at the next query or open
            log.warning("meta_offset_mark_failed", stream=handle.name, error=repr(exc))
    return logged if logged is not None else stored.offset
