"""What consumers on a member (not the leader) of a clustered stream may read: its
follower log up to the cluster commit offset the member learned from its leader.

A follower appends the leader's chunks before a majority holds them, and may later cut
a suffix that a new leader never wrote (Osiris's truncation). Consumers on the member
therefore read only up to the commit offset its leader announced, and only over chunks
known to be the leader's (``cluster.replication.ReplicaSession`` decides that limit).

Unlike the leader's view (``server.cluster_reads``), every part of the commit point a
reader attaches at is the committed chunk's own: its next offset and the end of that
chunk in its segment file. A ``next`` reader therefore waits right after the last
committed chunk, never past a suffix the member may cut, and nothing a reader holds
(position, chunk id) lies in a range truncation can remove. A truncation below what the
view showed (the member dropped its copy to rejoin at the leader's first segment)
breaks the view: its readers are told (``broken``), never silently moved.
"""

from __future__ import annotations

import threading
import time

from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.commit_point import CommitPoint
from tierlog.log.committed_chunk import chunk_end
from tierlog.log.reader import LogSource
from tierlog.log.segment_files import SegmentRef

NOTHING = -1


class MemberCommitView:
    """A follower log as the member's consumers see it (a ``LogSource``).

    ``set_limit`` (event loop) raises the cluster commit the member may show; the exact
    commit point of that chunk is looked up when a reader first asks for it (readers ask
    on every read: the lookup runs once per new limit, never per read).
    """

    def __init__(self, stream_log: LogSource) -> None:
        self._log = stream_log
        self.limit = NOTHING
        self.broken = False
        self.closed = False
        self._lock = threading.Lock()
        refs = stream_log.segment_refs()
        self._point = CommitPoint(
            NOTHING, refs[0].first_offset, refs[0].first_offset, FILE_HEADER_SIZE
        )

    def set_limit(self, chunk_id: int) -> bool:
        """Raise the limit (it never goes down); True when it moved."""
        if chunk_id <= self.limit or self.broken:
            return False
        self.limit = chunk_id
        return True

    def truncated(self, keep_through: int) -> bool:
        """The follower log was cut after ``keep_through``; False (the view is broken
        from now on) when that removed a chunk the view had shown."""
        if keep_through < self.limit:
            self.broken = True
        return not self.broken

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        return self._log.segment_refs()

    def commit_point(self) -> CommitPoint:
        point = self._point
        if point.chunk_id >= self.limit or self.broken:
            return point
        with self._lock:
            point = self._point
            target = self.limit
            if point.chunk_id >= target:
                return point
            local = self._log.commit_point()
            if local.chunk_id <= target:
                found: CommitPoint | None = local  # exact already (a quiet stream)
            else:
                found = chunk_end(self._log, target)
            if found is not None and found.chunk_id > point.chunk_id:
                self._point = point = found
            return point

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            point = self.commit_point()
            if point.chunk_id >= next_offset or self.closed or self.broken:
                return point
            if deadline is not None and time.monotonic() >= deadline:
                return point
            time.sleep(0.02)

    def trusted_from(self) -> int:
        return self._log.trusted_from()
