"""The leader side of replication: answering members' fetches from the local log.

A fetch is answered by the pure ``answer_fetch`` (serve chunks only to a member whose
tail is on our log, else our history so it truncates first); chunks go out as one
``CHUNKS`` header followed by a byte range of one segment file, sent with ``sendfile``
(``StreamLog.chunk_span`` finds the range with a few index reads, no per-chunk Python
work). A fetch with nothing new to send is parked until the log is written to
(``wake``) or until ``heartbeat`` seconds passed, when an empty ``CHUNKS`` carries the
commit offset back: members fetch again at once, so a member is heard at least once
per heartbeat. Every fetch in our epoch whose tail is on our log reports that tail as
the member's written chunk (a member's tail is always fsynced), which is also how the
leader hears its members for check-quorum.

The same answering serves a new leader's catch-up from a member (``answer``) with the
member's own log in the new leader's epoch.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from tierlog.cluster.log_history import NO_CHUNK, EpochRange, History, Tail, holds
from tierlog.cluster.replication import ServeChunks, answer_fetch
from tierlog.formats import replication as wire
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.errors import ChunkNotLocalError
from tierlog.log.writer import StreamLog

if TYPE_CHECKING:
    from tierlog.cluster.link import Link


class LeaderListener(Protocol):
    """What a leader hears from its members (called on the event loop)."""

    def member_written(self, member: str, chunk_id: int, epoch: int) -> None: ...

    def member_adopted(
        self, member: str, epoch: int, highest: int, tail_epoch: int, tail_chunk_id: int
    ) -> None: ...

    def member_refused(self, member: str, highest_epoch: int) -> None: ...


def log_history(log: StreamLog) -> History:
    return tuple(EpochRange(e, f, la) for e, f, la in log.epoch_history())


def segment_start_at_or_after(log: StreamLog, offset: int) -> int | None:
    """The first local segment starting at or after ``offset``: where an empty member
    may begin (its first chunk is a tracking snapshot, or tracking was empty there)."""
    for ref in log.segment_refs():
        if ref.first_offset >= offset:
            return ref.first_offset
    return None


def join_offset(log: StreamLog) -> int:
    """Where an empty member starts: the first segment the leader holds locally."""
    return log.first_offset


def answer(
    link: Link, stream: str, log: StreamLog, epoch: int, commit: int, fetch: wire.Fetch
) -> bool:
    """Answer ``fetch`` on ``link``; False when there is nothing to send yet (park it)."""
    history = log_history(log)
    result = answer_fetch(stream, epoch, history, log.next_offset, commit, fetch, join_offset(log))
    if not isinstance(result, ServeChunks):
        link.send(result)
        return True
    start = result.from_offset
    if fetch.tail_chunk_id == NO_CHUNK:
        # An empty member begins at one of our segment starts, never inside a segment:
        # its files then match ours and its tracking is complete. None: it waits for
        # our next roll (an empty log past our last segment start).
        first_segment = segment_start_at_or_after(log, result.from_offset)
        if first_segment is None:
            return False
        start = first_segment
    try:
        span = log.chunk_span(start, result.max_bytes)
    except ChunkNotLocalError:
        first = log.first_offset
        # below our first segment: local retention deleted it after it was tiered (so
        # it was committed); the member starts again at our log's start
        code = wire.RefusalCode.BELOW_LOCAL_LOG if start < first else wire.RefusalCode.OUT_OF_RANGE
        link.send(
            wire.Refused(
                stream, epoch, code, epoch, f"chunk {start} is not on the local log (from {first})"
            )
        )
        return True
    if span is None:
        return False
    header = wire.encode_chunks_header(
        stream,
        epoch,
        span.first_chunk_id,
        span.next_offset,
        commit,
        span.chunk_count,
        span.length,
        segment_start=span.position == FILE_HEADER_SIZE,
    )
    link.send_span(header, span.segment_path, span.position, span.length)
    return True


class LedStream:
    """One stream this node leads: parked fetches, the commit offset, the listener."""

    def __init__(
        self,
        stream: str,
        log: StreamLog,
        epoch: int,
        members: tuple[str, ...],
        listener: LeaderListener,
        heartbeat: float,
    ) -> None:
        self.stream = stream
        self.log = log
        self.epoch = epoch
        self.members = members
        self.listener = listener
        self.heartbeat = heartbeat
        self.serving = False
        self.commit = NO_CHUNK
        self.closed = False
        self._parked: dict[str, tuple[Link, wire.Fetch, asyncio.TimerHandle]] = {}
        self._told: dict[str, tuple[Link, tuple[int, int]]] = {}  # TIERED sent per member
        self._loop = asyncio.get_running_loop()
        self._listener_fn = self._on_local_commit
        log.add_commit_listener(self._listener_fn)

    def _on_local_commit(self, _point: object) -> None:
        # the writer thread: hop to the loop
        if not self.closed:
            self._loop.call_soon_threadsafe(self.wake)

    def on_fetch(self, link: Link, fetch: wire.Fetch) -> None:
        if self.closed:
            return
        if fetch.epoch > self.epoch:
            self.listener.member_refused(link.peer, fetch.epoch)  # a newer leader exists
        if fetch.epoch == self.epoch:
            tail = Tail(fetch.tail_epoch, fetch.tail_chunk_id)
            if holds(log_history(self.log), tail):
                self.listener.member_written(link.peer, fetch.tail_chunk_id, fetch.epoch)
        self._unpark(link.peer)
        if not self.serving and fetch.epoch <= self.epoch:
            link.send(
                wire.Refused(
                    self.stream,
                    self.epoch,
                    wire.RefusalCode.NOT_LEADER,
                    self.epoch,
                    "not serving yet (election in progress)",
                )
            )
            return
        self._tell_remote_position(link)
        if not answer(link, self.stream, self.log, self.epoch, self.commit, fetch):
            timer = self._loop.call_later(self.heartbeat, self._heartbeat, link.peer)
            self._parked[link.peer] = (link, fetch, timer)

    def _tell_remote_position(self, link: Link) -> None:
        """``TIERED`` to a member whenever our remote position changed since we last
        told it over this link (a new link: tell it again). Members fetch at least once
        per heartbeat, so they learn a manifest commit within one heartbeat."""
        position = self.log.remote_position()
        if position is None:
            return
        told = self._told.get(link.peer)
        if told is not None and told[0] is link and told[1] == position:
            return
        self._told[link.peer] = (link, position)
        link.send(wire.Tiered(self.stream, self.epoch, position[0], position[1]))

    def _unpark(self, member: str) -> tuple[Link, wire.Fetch] | None:
        parked = self._parked.pop(member, None)
        if parked is None:
            return None
        parked[2].cancel()
        return parked[0], parked[1]

    def _heartbeat(self, member: str) -> None:
        parked = self._parked.pop(member, None)
        if parked is None or self.closed:
            return
        link, fetch, _ = parked
        if link.closed:
            return
        if answer(link, self.stream, self.log, self.epoch, self.commit, fetch):
            return
        link.send(
            wire.Chunks(
                self.stream,
                self.epoch,
                fetch.from_chunk_id,
                fetch.from_chunk_id,
                self.commit,
                0,
                b"",
            )
        )

    def wake(self) -> None:
        """New chunks were written: answer parked fetches now."""
        if self.closed or not self.serving:
            return
        for member in list(self._parked):
            link, fetch, timer = self._parked[member]
            if link.closed:
                timer.cancel()
                del self._parked[member]
                continue
            if answer(link, self.stream, self.log, self.epoch, self.commit, fetch):
                timer.cancel()
                del self._parked[member]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for _link, _fetch, timer in self._parked.values():
            timer.cancel()
        self._parked.clear()
        self._told.clear()
        self.log.remove_commit_listener(self._listener_fn)
