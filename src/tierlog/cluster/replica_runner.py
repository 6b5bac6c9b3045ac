"""The member side of replication: drives one stream's pure ``ReplicaSession``.

Frames for the stream are queued and handled one at a time by a task that exists only
while there is work (an idle followed stream costs no task, thread or connection). The
session's actions are carried out in order, log work on the stream's executor (its
writer lane): ``PersistEpoch`` (fsync the member epoch file before anything that
follows it is sent), ``Truncate`` (``StreamLog.truncate_after``), ``AppendChunks``
(``accept_chunks`` then ``sync_to_disk``: ``WRITTEN`` is only sent for fsynced chunks),
``SetCommit`` (the stream's ``on_commit`` callback) and ``Send``.

What a member reports is what is on its disk: ``WRITTEN`` and the tail of every fetch
come from the log's fsynced (durable) point, and chunks written before a refused one
are fsynced before anything is reported. A write or fdatasync that fails (a full
disk, an I/O error) does not stop the member for good: the log is recovered in place
(``StreamLog.recover_after_failure``: what the files hold, fsynced), the session is
rebuilt from it, and replication resumes from there, retried with a growing pause (up
to ``MAX_FAILURE_DELAY``) while the disk keeps refusing. The last failure stays in
``status()`` until a write succeeds again, or until the leader answers that the member
holds its whole log (nothing left to write: the member serves its consumers again).

A fetch that gets no answer within ``fetch_timeout`` (a cut link, a lost frame) is sent
again (logged as ``replica_fetch_timed_out`` and counted); only an answer to the fetch
in flight disarms that timer, never a ``COMMIT`` or a late answer to an earlier fetch,
and after every frame handled a followed stream has its timer armed again, so no
member can wait for good. A duplicate answer is harmless (the session ignores a range
that does not continue the log). A refusal (leader not serving yet, or not the leader) is retried
after ``retry_delay``. Frames from a newer epoch's leader (``ADOPT``, or chunks or a
commit in a newer epoch) switch the stream to that node.

``CatchUpRun`` is the same machine run by a new leader on its own log against the
member with the most up-to-date tail, until the log ends at that tail.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

from tierlog.cluster.errors import CatchUpError, StaleEpochError
from tierlog.cluster.fetch_server import log_history
from tierlog.cluster.log_history import NO_CHUNK, History, Tail, truncate_history
from tierlog.cluster.replication import (
    Action,
    AppendChunks,
    PersistEpoch,
    ReplicaSession,
    Send,
    SetCommit,
    Truncate,
)
from tierlog.formats import replication as wire
from tierlog.log.errors import AcceptError, SyncFailedError
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger

log = get_logger(__name__)

SendFn = Callable[[str, wire.Frame], None]

MAX_FAILURE_DELAY = 5.0
"""Seconds between attempts at most while the member's log keeps failing (full disk)."""

ReplicaState = Literal["idle", "following", "catching-up", "failed"]


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """What a member knows about its replication of one stream, for the operator view.

    ``state``: ``idle`` (no leader known yet), ``following`` (its log holds what the
    leader announced as committed), ``catching-up`` (``behind`` offsets short of the
    commit the leader announced), ``failed`` (its log failed under the last action:
    ``last_error`` says how, since ``failed_since`` (Unix seconds), ``failures`` in a
    row; it recovers and retries by itself). ``written_chunk_id``: the last chunk on its
    disk (fsynced), the one it reports; ``commit_chunk_id``: the commit it may show its
    consumers; ``leader_commit_chunk_id``: the highest commit the leader announced."""

    leader: str | None
    epoch: int | None
    state: ReplicaState
    written_chunk_id: int
    next_offset: int
    commit_chunk_id: int
    leader_commit_chunk_id: int
    behind: int
    last_error: str | None
    failed_since: float | None
    failures: int
    recoveries: int


class ByteBudget:
    """Chunk bytes received but not yet written, over all followed streams of a node.
    Links stop reading while it is over ``limit`` (TCP then slows the leaders), so many
    streams catching up at once cannot fill the memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._room = asyncio.Event()
        self._room.set()

    def take(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            self._room.clear()

    def give(self, size: int) -> None:
        self.used -= size
        if self.used <= self.limit:
            self._room.set()

    async def wait_for_room(self) -> None:
        await self._room.wait()


@dataclass(slots=True)
class ReplicaCounts:
    """The counters of followed streams summed, for node-wide metrics: a hub adds a
    stream's counts here when it stops following it, so the sums never go down."""

    fetch_timeouts: int = 0
    refusals: int = 0
    rejoins: int = 0
    refused_appends: int = 0

    def add(self, followed: FollowedStream) -> None:
        self.fetch_timeouts += followed.fetch_timeouts
        self.refusals += followed.refusals
        self.rejoins += followed.rejoins
        self.refused_appends += followed.errors


class _Refetch:
    """Inbox item: send the fetch again (timeout or retry after a refusal)."""


class _Follow:
    def __init__(self, leader: str, epoch: int) -> None:
        self.leader, self.epoch = leader, epoch


_REFETCH = _Refetch()


class FollowedStream:
    """One stream this node replicates as a member."""

    def __init__(
        self,
        stream: str,
        log: StreamLog,
        executor: Executor,
        send: SendFn,
        *,
        on_commit: Callable[[int], None] | None = None,
        fetch_bytes: int,
        fetch_timeout: float,
        retry_delay: float,
        budget: ByteBudget | None = None,
    ) -> None:
        self.stream = stream
        self.budget = budget
        self.log = log
        self.executor = executor
        self._send = send
        self.on_commit = on_commit
        self.on_truncate: Callable[[int], None] | None = None
        """Told ``keep_through`` after the log was cut (readers of the log must know)."""
        self.fetch_bytes = fetch_bytes
        self.fetch_timeout = fetch_timeout
        self.retry_delay = retry_delay
        self.leader: str | None = None
        self._epoch: int | None = None  # the leader epoch followed (survives a rebuild)
        self.session: ReplicaSession | None = None
        self.closed = False
        self.errors = 0  # refused appends (bad chunks from the leader)
        self.refusals = 0  # fetches the leader refused (retried after ``retry_delay``)
        self.rejoins = 0  # local copies dropped: the leader's retention passed our tail
        self._inbox: deque[tuple[str | None, Any]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._outstanding: wire.Fetch | None = None  # the last fetch sent
        self.fetch_timeouts = 0  # fetches sent again for want of an answer
        self.last_error: str | None = None  # the log's last failure, until a write succeeds
        self.failed_since: float | None = None
        self.failures = 0  # failures in a row (the retry pause grows with them)
        self.recoveries = 0  # in-place recoveries of the log after a failed write
        self._recover = False  # the log failed under a write: recover it first
        self._loop = asyncio.get_running_loop()
        # when a frame of the leader followed (anything but a refusal) was last taken
        # up, on the loop clock: a member whose log work is stuck takes up nothing. A
        # new follower or leader counts from when it was told to follow, so its
        # readers get a grace period (``server.member_reads`` bounds it)
        self.heard_at = self._loop.time()

    # -- input -----------------------------------------------------------------------
    def follow(self, leader: str, epoch: int) -> None:
        if leader != self.leader:
            self.heard_at = self._loop.time()
        self._put(None, _Follow(leader, epoch))

    def deliver(self, peer: str, frame: wire.Frame) -> None:
        if peer == self.leader and self._answers_outstanding_fetch(frame):
            self._cancel_timer()
            self._outstanding = None
        if self.closed:
            return
        if self.budget is not None and isinstance(frame, wire.Chunks):
            self.budget.take(len(frame.data))
        self._put(peer, frame)

    def refetch(self) -> None:
        self._put(None, _REFETCH)

    def _answers_outstanding_fetch(self, frame: wire.Frame) -> bool:
        """Whether ``frame`` answers the fetch in flight. A ``COMMIT``, or a late answer
        to an earlier fetch (it starts below the one in flight), leaves the timer armed:
        if the fetch in flight was lost, the timer sends it again."""
        fetch = self._outstanding
        if fetch is None or isinstance(frame, wire.Refused):
            return isinstance(frame, wire.Refused)
        if isinstance(frame, wire.History):
            return frame.epoch >= fetch.epoch
        return (
            isinstance(frame, wire.Chunks)
            and frame.epoch >= fetch.epoch
            and frame.first_chunk_id >= fetch.from_chunk_id
        )

    def _fetch_timed_out(self) -> None:
        self._timer = None
        if self._outstanding is not None:
            self.fetch_timeouts += 1
            log.info(
                "replica_fetch_timed_out",
                stream=self.stream,
                leader=self.leader,
                from_chunk_id=self._outstanding.from_chunk_id,
                timeouts=self.fetch_timeouts,
            )
        self.refetch()

    def _put(self, peer: str | None, item: object) -> None:
        if self.closed:
            return
        self._inbox.append((peer, item))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name=f"replica-{self.stream}")

    # -- processing ------------------------------------------------------------------
    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._loop.run_in_executor(self.executor, fn, *args)

    def _state(self) -> tuple[History, int]:
        """The log as the member may report it: up to its fsynced chunk only. Written
        and durable differ only after a failure, which recovery resolves before the
        next report; this keeps a report from ever naming a chunk not on the disk."""
        durable = self.log.durable_point()
        history = log_history(self.log)
        if durable.chunk_id == self.log.last_chunk_id:
            return history, self.log.next_offset
        return truncate_history(history, durable.chunk_id), durable.next_offset

    async def _start_session(self) -> ReplicaSession:
        highest = await self._run(self.log.read_member_epoch)
        history, next_offset = await self._run(self._state)
        self.session = ReplicaSession(self.stream, history, next_offset, highest, self.fetch_bytes)
        return self.session

    async def _drain(self) -> None:
        try:
            while self._inbox and not self.closed:
                peer, item = self._inbox.popleft()
                try:
                    await self._handle(peer, item)
                finally:
                    if self.budget is not None and isinstance(item, wire.Chunks):
                        self.budget.give(len(item.data))
        except Exception as exc:
            # the log failed under an action (disk, closed): start again from what is
            # on disk, in the epoch we followed
            self._failed(exc)
        finally:
            self._task = None
            if self._inbox and not self.closed:
                self._task = asyncio.create_task(self._drain(), name=f"replica-{self.stream}")

    def _failed(self, exc: Exception) -> None:
        """The log failed under an action: forget the session (it is rebuilt from the
        disk) and try again after a pause that grows while failures repeat. A failed
        write or fdatasync (``OSError``, ``SyncFailedError``) has the log recovered in
        place first; logged once, then every 50th time, without a traceback."""
        self.failures += 1
        self.last_error = repr(exc)
        if self.failed_since is None:
            self.failed_since = time.time()
        io_failure = isinstance(exc, OSError | SyncFailedError) or self.log.write_failed
        if io_failure and not self.log.closed:
            self._recover = True
        delay = min(MAX_FAILURE_DELAY, self.retry_delay * 2 ** min(self.failures - 1, 16))
        if self.failures == 1 or self.failures % 50 == 0:
            fields = {
                "stream": self.stream,
                "error": repr(exc),
                "failures": self.failures,
                "retry_in": round(delay, 3),
            }
            if io_failure:
                log.error("replica_write_failed", **fields)
            else:
                log.exception("replica_stream_failed", **fields)
        if self.session is not None and self.session.leader_epoch is not None:
            self._epoch = self.session.leader_epoch
        self.session = None
        self._arm(delay)

    def _succeeded(self) -> None:
        """A write reached the disk: the member replicates again."""
        if self.failures:
            log.warning(
                "replica_write_resumed",
                stream=self.stream,
                failures=self.failures,
                failed_for=round(time.time() - (self.failed_since or time.time()), 3),
            )
        self.failures = 0
        self.last_error = None
        self.failed_since = None

    async def _recover_log(self) -> None:
        """Recover the failed log in place (what the disk holds, fsynced); readers of
        the member are told if that cut chunks they may have been shown."""
        before = self.log.last_chunk_id
        next_offset = await self._run(self.log.recover_after_failure)
        self._recover = False
        self.recoveries += 1
        after = self.log.last_chunk_id
        log.warning(
            "replica_log_recovered",
            stream=self.stream,
            next_offset=next_offset,
            cut_chunks_after=after if after < before else None,
        )
        if after < before and self.on_truncate is not None:
            self.on_truncate(after)

    async def _handle(self, peer: str | None, item: object) -> None:
        if peer is not None and peer == self.leader and not isinstance(item, wire.Refused):
            self.heard_at = self._loop.time()
        if self._recover:
            await self._recover_log()
        session = self.session or await self._start_session()
        actions: list[Action]
        if isinstance(item, _Follow):
            try:
                actions = session.follow(item.epoch)
            except StaleEpochError as exc:
                log.warning("replica_follow_stale", stream=self.stream, error=str(exc))
                return
            self.leader = item.leader
        elif item is _REFETCH:
            if self.leader is None:
                return
            if session.leader_epoch is None:
                if self._epoch is None:
                    return
                actions = session.follow(self._epoch)  # a session rebuilt after a failure
            else:
                actions = [Send(session.fetch())]
        elif isinstance(item, wire.Refused):
            if peer != self.leader:
                return
            self.refusals += 1
            if item.code is wire.RefusalCode.BELOW_LOCAL_LOG:
                actions = session.below_local_log(item.epoch)
                if actions:
                    self.rejoins += 1
                    log.warning(
                        "replica_rejoining_at_leader_log_start",
                        stream=self.stream,
                        leader=peer,
                        tail=session.tail.chunk_id,
                        reason=item.message,
                    )
            else:
                if self.refusals == 1 or self.refusals % 100 == 0:
                    log.warning(
                        "replica_fetch_refused",
                        stream=self.stream,
                        leader=peer,
                        code=item.code.name,
                        refusals=self.refusals,
                        reason=item.message,
                    )
                self._arm(self.retry_delay)
                return
        else:
            assert isinstance(item, wire.Adopt | wire.History | wire.Chunks | wire.Commit)
            before = session.leader_epoch
            actions = session.on_frame(item)
            if self.failures and self._holds_leaders_log(peer, item, session):
                self._succeeded()
            if (
                peer is not None
                and session.leader_epoch == item.epoch
                and session.guard.highest == session.leader_epoch
                and (before != session.leader_epoch or isinstance(item, wire.Adopt))
            ):
                self.leader = peer  # a newer leader (or one that adopted us)
                if isinstance(item, wire.Adopt):
                    actions.append(Send(session.fetch()))  # follow it from now on
        await self._execute(actions, peer)
        self._epoch = session.leader_epoch
        if self._timer is None and self.leader is not None and session.leader_epoch is not None:
            # whatever the frame was, a followed stream always has a timer: an answer
            # that asked for nothing more (stale, refused append) cannot stall it
            self._arm(self.fetch_timeout)

    def _holds_leaders_log(
        self, peer: str | None, frame: wire.Frame, session: ReplicaSession
    ) -> bool:
        """Whether ``frame`` is the followed leader saying it has nothing past our log (an
        empty answer at our next offset, in the epoch we follow). After a failure that
        lost nothing (the log recovered as it was, the session rebuilt) this ends the
        failed state: with no new chunk to write, a successful write would never come,
        and a member caught up on an idle stream would refuse its consumers for good."""
        return (
            peer == self.leader
            and isinstance(frame, wire.Chunks)
            and not frame.chunk_count
            and frame.epoch == session.leader_epoch
            and frame.first_chunk_id == session.next_offset
        )

    async def _execute(self, actions: list[Action], peer: str | None) -> None:
        session = self.session
        assert session is not None
        queue = deque(actions)
        while queue and not self.closed:
            action = queue.popleft()
            if isinstance(action, PersistEpoch):
                await self._run(self.log.persist_member_epoch, action.epoch)
                self._succeeded()
            elif isinstance(action, Truncate):
                await self._run(self.log.truncate_after, action.keep_through)
                self._succeeded()
                if self.on_truncate is not None:
                    self.on_truncate(action.keep_through)
                history, next_offset = await self._run(self._state)
                queue.extend(session.truncated(history, next_offset))
            elif isinstance(action, AppendChunks):
                refused = False
                try:
                    await self._run(self._append, action.chunks)
                except AcceptError as exc:
                    self.errors += 1
                    refused = True
                    log.warning("replica_chunks_refused", stream=self.stream, error=str(exc))
                else:
                    self._succeeded()
                history, next_offset = await self._run(self._state)
                follow_up = session.written(history, next_offset)
                if refused:
                    # ask again after a pause, not at once: the same bytes would come back
                    follow_up = [
                        a
                        for a in follow_up
                        if not (isinstance(a, Send) and isinstance(a.frame, wire.Fetch))
                    ]
                    self._arm(self.retry_delay)
                queue.extend(follow_up)
                self.after_written(session)
            elif isinstance(action, SetCommit):
                if self.on_commit is not None:
                    self.on_commit(action.chunk_id)
            elif isinstance(action, Send):
                frame = action.frame
                to_leader = isinstance(frame, wire.Fetch | wire.Written)
                dest = self.leader if to_leader or peer is None else peer
                if dest is None:
                    continue
                self._send(dest, frame)
                if isinstance(frame, wire.Fetch):
                    self._outstanding = frame
                    self._arm(self.fetch_timeout)

    def _append(self, chunks: wire.Chunks) -> None:
        try:
            self.log.accept_chunks(chunks.data, segment_start=chunks.segment_start)
        except AcceptError:
            # the chunks before the refused one are written: on the disk before they
            # are reported (a failed fdatasync here is a failed write, recovered)
            self.log.sync_to_disk()
            raise
        self.log.sync_to_disk()

    def after_written(self, session: ReplicaSession) -> None:
        """Hook for subclasses: the log grew."""

    # -- timers ----------------------------------------------------------------------
    def _arm(self, delay: float) -> None:
        self._cancel_timer()
        if not self.closed:
            self._timer = self._loop.call_later(delay, self._fetch_timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self.budget is not None:
            for _peer, item in self._inbox:
                if isinstance(item, wire.Chunks):
                    self.budget.give(len(item.data))
        self._inbox.clear()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    def status(self) -> ReplicaStatus:
        """This member's replication of the stream as it stands (event loop thread)."""
        session = self.session
        durable = self.log.durable_point()
        leader_commit = session.leader_commit if session is not None else NO_CHUNK
        behind = max(0, leader_commit + 1 - durable.next_offset) if leader_commit >= 0 else 0
        state: ReplicaState
        if self.last_error is not None:
            state = "failed"
        elif self.leader is None:
            state = "idle"
        elif behind:
            state = "catching-up"
        else:
            state = "following"
        return ReplicaStatus(
            leader=self.leader,
            epoch=session.leader_epoch if session is not None else self._epoch,
            state=state,
            written_chunk_id=durable.chunk_id,
            next_offset=durable.next_offset,
            commit_chunk_id=session.commit if session is not None else NO_CHUNK,
            leader_commit_chunk_id=leader_commit,
            behind=behind,
            last_error=self.last_error,
            failed_since=self.failed_since,
            failures=self.failures,
            recoveries=self.recoveries,
        )

    def serving_epoch(self) -> int | None:
        """The epoch this member adopted, in which it answers its leader's catch-up."""
        session = self.session
        if session is None or session.leader_epoch is None:
            return None
        return session.leader_epoch if session.guard.highest == session.leader_epoch else None


class CatchUpRun(FollowedStream):
    """A new leader taking ``source``'s log up to ``target`` (LeaderState's CatchUp)."""

    def __init__(
        self,
        stream: str,
        log: StreamLog,
        executor: Executor,
        send: SendFn,
        *,
        source: str,
        epoch: int,
        target: Tail,
        fetch_bytes: int,
        fetch_timeout: float,
        retry_delay: float,
        give_up_after: float,
    ) -> None:
        super().__init__(
            stream,
            log,
            executor,
            send,
            fetch_bytes=fetch_bytes,
            fetch_timeout=fetch_timeout,
            retry_delay=retry_delay,
        )
        self.target = target
        self.done: asyncio.Future[Tail] = self._loop.create_future()
        self._give_up = self._loop.call_later(give_up_after, self._fail, "timed out")
        self.follow(source, epoch)

    def deliver(self, peer: str, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Refused) and frame.code is not wire.RefusalCode.NOT_LEADER:
            self._fail(f"{peer} refused: {frame.message}")
            return
        super().deliver(peer, frame)

    async def _execute(self, actions: list[Action], peer: str | None) -> None:
        # a catch-up never reports WRITTEN and has no commit to show
        kept: list[Action] = [
            a
            for a in actions
            if not isinstance(a, SetCommit)
            and not (isinstance(a, Send) and isinstance(a.frame, wire.Written))
        ]
        await super()._execute(kept, peer)
        self.after_written(self.session)  # type: ignore[arg-type]

    def after_written(self, session: ReplicaSession) -> None:
        if session is not None and session.tail >= self.target and not self.done.done():
            self.done.set_result(session.tail)
            self.close()

    def _fail(self, why: str) -> None:
        if not self.done.done():
            self.done.set_exception(CatchUpError(f"catch-up of {self.stream}: {why}"))
        self.close()

    def close(self) -> None:
        self._give_up.cancel()
        super().close()
