"""What a clustered stream's consumers may read: the local log up to the cluster commit.

A leader fsyncs a chunk before a majority of its members has written it; a failover can
drop such a chunk, so consumers must not see it. The view below caps the local commit
point at the cluster commit offset (the highest chunk written on a majority). Readers
compare one chunk id per chunk against it, as they do against the local commit point.
"""

from __future__ import annotations

import time

from tierlog.log.commit_point import CommitPoint
from tierlog.log.segment_files import SegmentRef
from tierlog.log.writer import StreamLog


class ClusterCommitView:
    """The local log as a clustered stream's consumers see it (a ``LogSource``).

    ``set_limit`` is called with each cluster commit (event loop); the visible commit
    point is the local one with its chunk id capped at that limit. The next offset stays
    the local one: a ``next`` reader attaches at the local end and waits there for the
    limit, and the reader's record-count check keeps its local bound.
    """

    def __init__(self, stream_log: StreamLog, limit: int = -1) -> None:
        self._log = stream_log
        self.limit = limit
        self.closed = False
        self.stream_dir = stream_log.stream_dir

    def set_limit(self, chunk_id: int) -> bool:
        """Raise the limit (it never goes down); True when it moved."""
        if chunk_id <= self.limit:
            return False
        self.limit = chunk_id
        return True

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        return self._log.segment_refs()

    def commit_point(self) -> CommitPoint:
        local = self._log.commit_point()
        limit = self.limit
        if local.chunk_id <= limit:
            return local
        return local._replace(chunk_id=limit)

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            point = self.commit_point()
            if point.chunk_id >= next_offset or self.closed or self._log.closed:
                return point
            if deadline is not None and time.monotonic() >= deadline:
                return point
            time.sleep(0.02)

    def trusted_from(self) -> int:
        return self._log.trusted_from()
