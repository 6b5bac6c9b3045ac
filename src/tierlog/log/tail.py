"""The tail of a writable log: where the next chunk goes and what the last one was.

Two paths write chunks into a log: the leader's append path (``writer``), which makes
chunks, and a replica's acceptor path (``acceptor``), which takes a leader's chunks
verbatim. After a chunk both must leave the same tail behind — the next offset, the last
chunk's id and timestamp, the first timestamp (set once), the epochs — so the log holds
its tail in one ``LogTail`` value that both paths advance with the same rule
(``LogTail.wrote``), instead of the acceptor assigning the writer's fields one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierlog.log.commit_point import CommitPoint
from tierlog.log.recovery import RecoveredLog
from tierlog.log.segments import OpenSegment

NO_CHUNK = -1


@dataclass(slots=True)
class LogTail:
    """The writer-thread state at the end of one log (mutable; readers in other threads
    look at the commit point, never at this)."""

    next_offset: int
    """The offset the next chunk gets (written, not necessarily committed)."""
    last_chunk_id: int
    """The last written chunk's id (``NO_CHUNK`` when the log is empty)."""
    last_timestamp: int
    """The last chunk's timestamp: a new chunk's is never below it."""
    first_timestamp: int
    """The first local chunk's timestamp (0 while the log is empty): tracking snapshots
    carry it."""
    epoch: int
    """The epoch new chunks are written with."""
    max_epoch: int
    """The largest epoch in the log (never above ``epoch`` while writing)."""

    @classmethod
    def recovered(cls, recovered: RecoveredLog, epoch: int, max_epoch: int) -> LogTail:
        """The tail of a log as recovery found it on disk, written with ``epoch``."""
        last = recovered.last_chunk
        first_timestamp = next(
            (s.first_chunk.timestamp for s in recovered.segments if s.first_chunk), 0
        )
        return cls(
            next_offset=recovered.next_offset,
            last_chunk_id=last.chunk_id if last else NO_CHUNK,
            last_timestamp=recovered.last_timestamp,
            first_timestamp=first_timestamp,
            epoch=epoch,
            max_epoch=max_epoch,
        )

    def wrote(
        self, chunk_id: int, next_offset: int, timestamp: int, epoch: int, first_timestamp: int
    ) -> None:
        """Chunks up to ``chunk_id`` (ending at ``next_offset``, the last one with
        ``timestamp`` and ``epoch``) are written; ``first_timestamp`` is the first
        one's. A chunk of a higher epoch raises the writer's epoch too: the log never
        writes below an epoch it holds."""
        self.next_offset = next_offset
        self.last_chunk_id = chunk_id
        self.last_timestamp = timestamp
        if self.first_timestamp == 0:
            self.first_timestamp = first_timestamp
        if epoch > self.max_epoch:
            self.max_epoch = epoch
        if epoch > self.epoch:
            self.epoch = epoch

    def commit_point(self, active: OpenSegment) -> CommitPoint:
        """The point after the last written chunk, in the ``active`` segment."""
        return CommitPoint(
            self.last_chunk_id, self.next_offset, active.ref.first_offset, active.size
        )
