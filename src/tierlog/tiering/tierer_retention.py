"""The stream tierer's retention duties: trimming the remote tier by the stream's policy,
running the node's deletion pass, and choosing which local segments may be freed.

The decisions themselves are the pure functions of ``tiering.retention``; this mixin
holds the parts that need the running tierer (its committed manifest, its log, its
shared timer and upload pool), kept out of ``tiering.tierer`` so the tierer reads as
the event loop it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.fragments import RemoteStream
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.retention import (
    RetentionPolicy,
    describe_segments,
    floor_trim_offset,
    local_segments_to_free,
    remote_trim_offset,
)
from tierlog.tiering.runtime import TieringRuntime
from tierlog.tiering.task_health import TaskHealth

log = get_logger(__name__)


class RetentionMixin:
    """Retention of one stream; mixed into ``StreamTierer``, which sets these fields."""

    log: StreamLog
    remote: RemoteStream
    committer: ManifestCommitter
    deletions: DeletionQueue
    runtime: TieringRuntime
    task_health: TaskHealth
    clock: Callable[[], float]
    halted: str | None
    retention: RetentionPolicy
    retention_floor: int | None
    """Every whole fragment below this offset may go, whatever the policy (a delayed
    stream's system stream: its last checkpoint); None: no floor."""
    retention_interval: float
    retention_trims: int
    _next_retention: float
    _retention_running: threading.Lock
    _retention_timer: object | None
    _sealed_newest: dict[int, int]
    _running: bool
    _stopping: bool

    def _submit(self, name: str, fn: Callable[..., None], *args: object) -> bool:
        raise NotImplementedError  # the tierer's upload pool

    def set_retention(self, policy: RetentionPolicy) -> None:
        self.retention = policy
        self._next_retention = 0.0
        if self._running:
            self._maybe_retention()

    def set_retention_if_changed(self, policy: RetentionPolicy) -> None:
        if policy != self.retention:
            self.set_retention(policy)

    def set_retention_floor(self, floor: int) -> None:
        """Raise the floor (never lowers it); the next retention pass trims below it."""
        if self.retention_floor is None or floor > self.retention_floor:
            self.retention_floor = floor
            self._next_retention = 0.0

    def _maybe_retention(self) -> None:
        now = self.clock()
        if now < self._next_retention or self._stopping:
            return
        active = self.retention.active or self.retention_floor is not None
        if not active and not self.deletions.shared_pass_due(self.retention_interval):
            return  # nothing to trim and the node's deletion pass is not due
        self._next_retention = now + self.retention_interval
        if self._retention_running.acquire(blocking=False) and not self._submit(
            "retention", self._run_retention
        ):
            self._retention_running.release()

    def _run_retention(self) -> None:
        try:
            self.trim_remote()
            # the deletion list is the node's: one pass per interval, whichever stream
            self.deletions.run_due_shared(self.remote.store, self.retention_interval)
        except Exception:
            log.exception("remote_retention_failed", stream_dir=self.remote.stream_dir)
        finally:
            self._retention_running.release()

    def apply_retention(self, now_ms: int | None = None) -> int | None:
        """Trim the remote tier by the stream's retention (idle streams too); delete
        objects whose grace passed. Returns the new first offset if it trimmed."""
        trimmed = self.trim_remote(now_ms)
        self.deletions.run_due(self.remote.store)
        return trimmed

    def trim_remote(self, now_ms: int | None = None) -> int | None:
        """Trim the remote tier by the stream's retention; the new first offset if it did."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        trimmed = None
        floor = self.retention_floor
        if (self.retention.active or floor is not None) and not self.halted:
            tree = self.committer.tree
            trim_to = remote_trim_offset(tree, self.remote.load, self.retention, now_ms)
            if floor is not None:
                floor = min(floor, self._tail_segment_start(tree.next_offset, tree.first_offset))
                below = floor_trim_offset(tree, self.remote.load, floor)
                if below is not None and (trim_to is None or below > trim_to):
                    trim_to = below
            if trim_to is not None and trim_to > tree.first_offset:
                self.committer.commit([], trim_to=trim_to)
                self.retention_trims += 1
                trimmed = self.committer.tree.first_offset
                self.log.set_stream_first_offset(trimmed)
                log.info(
                    "remote_retention_trimmed",
                    stream_dir=self.remote.stream_dir,
                    first_offset=trimmed,
                )
        return trimmed

    def _tail_segment_start(self, remote_next: int, remote_first: int) -> int:
        """Where the local segment holding the remote tail starts: a floor never trims
        into it, because a node that lost its disk rebuilds the stream's tracking
        (producer sequences, consumer offsets) by replaying that segment's fragments from
        its first one. When that segment is not local, nothing is trimmed."""
        tail = remote_next - 1
        for ref in reversed(self.log.segment_refs()):
            if ref.first_offset <= tail:
                return ref.first_offset
        return remote_first

    def local_segments_to_free(
        self, max_bytes: int | None, max_age_seconds: float | None, now_ms: int | None = None
    ) -> list[int]:
        """Local segments that local retention may delete now: only those below the durably
        committed manifest's next offset (``retention.local_segments_to_free``)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms

        # A sealed segment never changes once all its chunks are committed: its newest
        # timestamp is read from its index once, not on every pass (~5 µs per chunk).
        listed = self.log.list_segments()
        chunk_counts = {s.first_offset: s.num_chunks for s in listed}
        known = self._sealed_newest

        def newest(first: int) -> int:
            if max_age_seconds is None:
                return 0  # not needed: spare reading the segment's index
            if first in known:
                return known[first]
            chunks = self.log.segment_chunks(first)
            stamp = chunks[-1].timestamp if chunks else 0
            if len(chunks) == chunk_counts[first]:
                known[first] = stamp
            return stamp

        segments = describe_segments(
            [(s.first_offset, s.next_offset, s.size, s.sealed) for s in listed], newest
        )
        self._sealed_newest = {f: known[f] for f in chunk_counts if f in known}
        tree = self.committer.tree
        return local_segments_to_free(
            segments, tree.next_offset, tree.first_offset, max_bytes, max_age_seconds, now_ms
        )

    def apply_local_retention(
        self, max_bytes: int | None, max_age_seconds: float | None, now_ms: int | None = None
    ) -> list[int]:
        """Free local segments; call it on the log's writer thread."""
        freed = self.local_segments_to_free(max_bytes, max_age_seconds, now_ms)
        for first in freed:
            self.log.delete_segment(first)
        return freed

    def _arm_retention(self) -> None:
        if self._stopping:
            return
        interval = max(0.01, self.retention_interval)
        self._retention_timer = self.runtime.timer.call_later(interval, self._retention_due)

    def _retention_due(self) -> None:
        self.task_health.check_stalls()
        self._maybe_retention()
        self._arm_retention()
