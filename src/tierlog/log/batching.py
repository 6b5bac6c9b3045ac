"""Fsync batching and the commit point.

The writer records each chunk it writes (``wrote``); the commit point moves up to
the last written chunk only after an fsync of the active segment, which the fsync
policy batches: every chunk (``chunk``), at most every ``fsync_interval_ms``
(``interval``), or only when asked / on roll and close (``never``). Readers in any
thread read ``committed`` and may block in ``wait_for_commit``; commit listeners are
called in the writer thread whenever the commit point advances.

With ``LogConfig.sync == "os"`` the commit point does not wait for the disk: a
``sync()`` commits what was written (the writes are in the OS page cache, visible to
every reader of the files) and skips the fdatasync; ``durable`` then trails
``committed`` until a roll or close fsyncs the segment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tierlog.log.commit_point import CommitPoint
from tierlog.log.config import LogConfig
from tierlog.logs import get_logger

log = get_logger(__name__)

CommitListener = Callable[[CommitPoint], None]


class CommitBatcher:
    """The written and committed points of one log, and its fsync policy."""

    def __init__(self, config: LogConfig, point: CommitPoint, sync_data: Callable[[], None]):
        self._config = config
        self._sync_data = sync_data
        self.written = point
        self.committed = point
        self.durable = point
        """The last chunk known to be on disk (fdatasynced); equals ``committed`` in
        ``fsync`` mode."""
        self._fsync_on_commit = config.sync == "fsync"
        self.closed = False
        self._cond = threading.Condition()
        self._listeners: list[CommitListener] = []
        self._last_sync = time.monotonic()

    @property
    def pending(self) -> bool:
        """Chunks are written but not yet committed."""
        return self.written != self.committed

    @property
    def not_durable(self) -> bool:
        """Chunks are written but not yet fdatasynced (committed or not)."""
        return self.written != self.durable

    def wrote(self, point: CommitPoint) -> None:
        self.written = point

    def sync(self) -> CommitPoint:
        """Commit everything written: after an fsync (``fsync`` mode) or at once
        (``os`` mode, the writes already reached the OS)."""
        if self.written != self.committed:
            if self._fsync_on_commit:
                self._sync_data()
                self.durable = self.written
            self.publish(self.written)
        self._last_sync = time.monotonic()
        return self.committed

    @property
    def sync_mode(self) -> str:
        return "fsync" if self._fsync_on_commit else "os"

    def set_sync_mode(self, mode: str) -> None:
        """Switch between ``fsync`` and ``os`` for the following commits."""
        if mode not in ("fsync", "os"):
            raise ValueError(f"sync mode must be 'fsync' or 'os', not {mode!r}")
        self._fsync_on_commit = mode == "fsync"

    def sync_to_disk(self) -> CommitPoint:
        """Fdatasync whatever is not yet on disk and commit everything written, in
        either mode (close, and an owner that wants durability now)."""
        if self.durable != self.written:
            self._sync_data()
            self.durable = self.written
        return self.sync()

    def maybe_sync(self, now: float | None = None) -> bool:
        """Drive the ``interval`` cadence; True when it synced."""
        if self._config.fsync != "interval" or self.written == self.committed:
            return False
        now = time.monotonic() if now is None else now
        if (now - self._last_sync) * 1000.0 >= self._config.fsync_interval_ms:
            self.sync()
            return True
        return False

    def after_write(self) -> None:
        """Apply the fsync policy after an append."""
        if self._config.fsync == "chunk":
            self.sync()
        elif self._config.fsync == "interval":
            self.maybe_sync()

    def synced_by_roll(self) -> None:
        """A roll fsynced the sealed segment: commit what was written."""
        self.durable = self.written
        if self.written != self.committed:
            self.publish(self.written)
            self._last_sync = time.monotonic()

    def rebind(self, sync_data: Callable[[], None]) -> None:
        """The log's segment set was replaced (a cut, a recovery): fdatasync the new one."""
        self._sync_data = sync_data

    def rewind(self, point: CommitPoint) -> None:
        """The log was cut (a replica's divergent suffix): written, committed and
        durable all become ``point`` (fsynced by the cut). Listeners are not called:
        the cluster's commit offset, not this local point, is what consumers follow."""
        with self._cond:
            self.written = self.committed = self.durable = point
            self._cond.notify_all()

    def publish(self, point: CommitPoint) -> None:
        with self._cond:
            self.committed = point
            self._cond.notify_all()
        for listener in list(self._listeners):
            try:
                listener(point)
            except Exception:
                log.exception("commit_listener_failed", listener=repr(listener))

    def add_listener(self, listener: CommitListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: CommitListener) -> None:
        self._listeners.remove(listener)

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        with self._cond:
            self._cond.wait_for(
                lambda: self.committed.next_offset > next_offset or self.closed, timeout
            )
            return self.committed

    def close(self) -> None:
        self.closed = True
        with self._cond:
            self._cond.notify_all()
