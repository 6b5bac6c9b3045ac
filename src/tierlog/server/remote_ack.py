"""``ack = remote`` streams inside the server: confirms held until the remote tier has
committed them, and consumers capped at the remote-committed offset.

The broker hands every finished write group of such a stream to its ``RemoteAckGate``
(instead of confirming at once); the gate holds the confirms in a ``ConfirmLedger`` and
releases them on the event loop when the stream's manifest committer reports a commit
that covers them. Subscriptions read the local log through ``CappedLog``, whose commit
point is the newest local commit point the remote tier holds (``VisibleTail``), so a
consumer never sees a message that losing the disk could take back.

Until tiering has started (resolution pending, or tiering off) nothing is confirmed and
nothing local is visible: the stream waits rather than weakening its promise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tierlog.errors import ConfigError
from tierlog.formats.chunk import HEADER_SIZE, decode_header
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.commit_point import CommitPoint
from tierlog.log.segment_files import IndexView, SegmentRef, pread_exact
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.settings import StreamSettings
from tierlog.tiering.remote_ack import ConfirmLedger, VisibleTail, is_remote_ack

if TYPE_CHECKING:
    from tierlog.server.broker import StreamHandle
    from tierlog.server.config import ServerConfig
    from tierlog.tiering.tierer import StreamTierer

log = get_logger("tierlog.server.remote_ack")

Done = Callable[[int], None]


def check_creatable(config: ServerConfig, settings: StreamSettings) -> None:
    """A stream with ``ack = remote`` needs tiering: without it no confirm would ever come."""
    if is_remote_ack(settings) and not config.tier.enabled:
        raise ConfigError("x-tierlog-ack=remote needs tiering (tier.enabled = true)")


def point_at(stream_log: StreamLog, next_offset: int) -> CommitPoint | None:
    """The commit point of the local log ending at chunk boundary ``next_offset`` (None
    when the local log has no chunk boundary there)."""
    commit = stream_log.commit_point()
    if next_offset >= commit.next_offset:
        return commit
    refs = stream_log.segment_refs()
    below = [r for r in refs if r.first_offset <= next_offset]
    if not below:
        return None
    ref = below[-1]
    if ref.first_offset == next_offset:
        return CommitPoint(next_offset - 1, next_offset, ref.first_offset, FILE_HEADER_SIZE)
    index = IndexView.load(ref.index_path)
    record = index.last_at_or_below(next_offset, index.limit_to(commit.chunk_id))
    if record is None:
        return None
    if record.chunk_id == next_offset:
        return CommitPoint(next_offset - 1, next_offset, ref.first_offset, record.position)
    return _point_after(ref, record.position, next_offset)


def _point_after(ref: SegmentRef, position: int, next_offset: int) -> CommitPoint | None:
    fd = os.open(ref.segment_path, os.O_RDONLY)
    try:
        header = decode_header(pread_exact(fd, HEADER_SIZE, position))
    finally:
        os.close(fd)
    if header.next_offset != next_offset:
        return None
    return CommitPoint(header.chunk_id, next_offset, ref.first_offset, position + header.total_size)


def _nothing_visible(stream_log: StreamLog) -> CommitPoint:
    first = stream_log.segment_refs()[0].first_offset
    return CommitPoint(first - 1, first, first, FILE_HEADER_SIZE)


class CappedLog:
    """The local log as consumers of an ``ack = remote`` stream see it: committed up to
    what the remote tier has committed (a ``LogSource``)."""

    def __init__(self, stream_log: StreamLog, gate: RemoteAckGate) -> None:
        self._log = stream_log
        self._gate = gate
        self.stream_dir = stream_log.stream_dir

    def segment_refs(self) -> tuple[SegmentRef, ...]:
        return self._log.segment_refs()

    def commit_point(self) -> CommitPoint:
        return self._gate.tail.visible

    def wait_for_commit(self, next_offset: int, timeout: float | None = None) -> CommitPoint:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            point = self._gate.tail.visible
            if point.next_offset > next_offset or self._gate.closed:
                return point
            if deadline is not None and time.monotonic() >= deadline:
                return point
            time.sleep(0.02)

    def trusted_from(self) -> int:
        return self._log.trusted_from()


class RemoteAckGate:
    """One ``ack = remote`` stream's held confirms and visible tail (event-loop side)."""

    def __init__(self, handle: StreamHandle, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = handle
        self.loop = loop
        self.ledger: ConfirmLedger[Done] = ConfirmLedger()
        self.tail = VisibleTail(_nothing_visible(handle.log))
        self.view = CappedLog(handle.log, self)
        self.tierer: StreamTierer | None = None
        self.closed = False

    @property
    def held(self) -> int:
        """Publishes written locally whose confirm waits for the remote tier."""
        return self.ledger.count

    def after_group(self, results: list[tuple[Done, int]]) -> None:
        """A write group is done: failures are answered now, successes held until the
        remote tier holds everything the group wrote."""
        point = self.handle.log.commit_point()
        self.tail.note(point)
        waiting: list[Done] = []
        for done, code in results:
            if code != ResponseCode.OK:
                done(code)
            elif self.closed:  # written, but the stream closes: the client resends
                done(ResponseCode.STREAM_NOT_AVAILABLE)
            else:
                waiting.append(done)
        self.ledger.hold(point.next_offset, waiting)
        self.advance()

    def tiering_started(self, tierer: StreamTierer) -> None:
        """From now on ``tierer``'s manifest commits release confirms."""
        self.tierer = tierer
        previous = tierer.committer.on_commit_seconds

        def on_commit(seconds: float) -> None:  # a committer thread, after every commit
            previous(seconds)
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
                self.loop.call_soon_threadsafe(self.advance)

        tierer.committer.on_commit_seconds = on_commit
        self.advance()

    def advance(self) -> None:
        """Release what the remote tier committed; let consumers read up to it."""
        tierer = self.tierer
        if tierer is None or self.closed:
            return
        durable = tierer.durable_next
        for done in self.ledger.release(durable):
            done(ResponseCode.OK)
        before = self.tail.visible.next_offset
        if self.tail.advance(durable) is False:
            try:
                exact = point_at(self.handle.log, durable)
            except (OSError, ValueError) as exc:
                log.warning("remote_ack_tail_unknown", stream=self.handle.name, error=repr(exc))
                exact = None
            if exact is not None:
                self.tail.set(exact)
        visible = self.tail.visible
        if visible.next_offset != before:
            # a point at the very end of a segment that has rolled since names the next
            # segment's start instead (local retention may free the sealed one)
            for ref in self.handle.log.segment_refs():
                if ref.first_offset == visible.next_offset != visible.segment_first_offset:
                    self.tail.visible = CommitPoint(
                        visible.chunk_id, visible.next_offset, ref.first_offset, FILE_HEADER_SIZE
                    )
                    break
            self.handle.notifier.notify()

    def close(self) -> None:
        """The stream closes: held confirms are answered STREAM_NOT_AVAILABLE (the
        client resends; a named producer's resend is deduplicated)."""
        self.advance()
        self.closed = True
        for done in self.ledger.drain():
            done(ResponseCode.STREAM_NOT_AVAILABLE)


def install(handle: StreamHandle) -> RemoteAckGate | None:
    """Give an ``ack = remote`` stream its gate (once, before anything is read or
    confirmed); None for other streams."""
    if not is_remote_ack(handle.record.settings):
        return None
    if handle.remote_ack is None:
        from tierlog.server.tiered_source import StreamChunkSource

        gate = RemoteAckGate(handle, asyncio.get_running_loop())
        handle.remote_ack = gate
        source = handle.source
        assert isinstance(source, StreamChunkSource)
        source.limit_reads(gate.view)
    return handle.remote_ack
