"""Consumers on a member that does not lead the stream: served from its follower log up
to the cluster commit the member learned (``server.member_view``), and from the remote
tier below the log's first segment (a late joiner starts at a leader snapshot).

Everything else is what a non-member node does (``server.remote_stream``): publishing
is refused (STREAM_NOT_AVAILABLE: clients publish to the leader Metadata names),
StoreOffset and QueryOffset go to the leader (``server.leader_offsets``); when it does not
answer, StoreOffset goes to the MetaStore offsets which the leader takes over, and
QueryOffset is refused (STREAM_NOT_AVAILABLE) rather than answered lower.

A member serves consumers only while it follows its leader within a bound
(``MemberBound``): it heard from the leader it follows within one lease TTL
(``cluster.lease_ttl_seconds``, at least three replication heartbeats), its log did
not fail under its last write, and it is at most ``MEMBER_READ_MAX_BEHIND`` offsets
short of the commit its leader announced.
Outside it, Subscribe is answered STREAM_NOT_AVAILABLE and subscriptions already
attached get a MetadataUpdate (checked every ``BOUND_CHECK_SECONDS``), so clients look
the stream up again and read where Metadata names, never waiting on a stuck member.

A subscription on a member ends with a MetadataUpdate (clients look the stream up
again and resume at their offset) when the member stops following (it takes the
stream over, or leaves it) or drops a range its consumers were shown (it rejoins at
the leader's first segment); it never skips silently. A subscription made before the
member learned any commit waits for it. Following a new leader keeps
subscriptions going: the view only grows, over chunks the new leader confirmed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tierlog.formats.bloom import ChunkFilter
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.catalog import StreamRecord
from tierlog.server.chunk_source import ChunkCursor, DeliverableChunk
from tierlog.server.errors import SourceClosedError
from tierlog.server.member_view import MemberCommitView
from tierlog.server.remote_stream import RemoteStreamHandle, RemoteStreams
from tierlog.server.tiered_source import StreamChunkSource

log = get_logger("tierlog.server.member_reads")

MEMBER_READ_MAX_BEHIND = 100_000
"""Offsets a member may be short of the commit its leader announced and still serve
consumers (a member catching up from further away sends them to Metadata instead)."""

BOUND_CHECK_SECONDS = 1.0
"""How often the members' bound is checked for subscriptions already attached."""


class ReplicaProgress(Protocol):
    """What the bound reads of a member's replication (``cluster.replica_runner``'s
    ``ReplicaStatus``)."""

    @property
    def leader(self) -> str | None: ...

    @property
    def state(self) -> str: ...

    @property
    def behind(self) -> int: ...

    @property
    def last_error(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class MemberBound:
    """When a member serves consumers: it heard from its leader within ``heard_within``
    seconds and is at most ``max_behind`` offsets short of the announced commit."""

    heard_within: float
    max_behind: int = MEMBER_READ_MAX_BEHIND

    def refusal(self, progress: ReplicaProgress, heard_age: float) -> str | None:
        """Why the member must not serve (None: it may). Pure."""
        if progress.state == "failed":
            return f"failed: {progress.last_error}"
        if heard_age > self.heard_within:
            return f"no word from leader {progress.leader} for {heard_age:.1f} s"
        if progress.behind > self.max_behind:
            return f"catching up from {progress.behind:,} offsets behind the commit"
        return None


Progress = Callable[[str], tuple[ReplicaProgress, float] | None]
"""``incarnation`` → (the member's replication progress, seconds since it heard from
its leader), None while it does not replicate the stream."""


class WaitingCursor:
    """A cursor attached before the member learned any commit: it attaches for real
    once it has one, so ``next`` / ``last`` mean the commit it learned, never the start
    of a log nothing of which may be shown yet."""

    def __init__(
        self,
        handle: MemberStreamHandle,
        spec: OffsetSpec,
        want_file: bool,
        chunk_filter: ChunkFilter | None = None,
    ) -> None:
        self._handle = handle
        self._spec = spec
        self._want_file = want_file
        self._filter = chunk_filter
        self._cursor: ChunkCursor | None = None

    @property
    def next_offset(self) -> int:
        return -1 if self._cursor is None else self._cursor.next_offset

    def _attached(self) -> ChunkCursor | None:
        if self._cursor is None and self._handle.view.limit >= 0:
            self._cursor = self._handle.chunks.attach(
                self._spec, want_file=self._want_file, chunk_filter=self._filter
            )
        return self._cursor

    async def read(self) -> DeliverableChunk | None:
        if self._handle.notifier.closed:
            raise SourceClosedError("stream closed")
        cursor = self._attached()
        return None if cursor is None else await cursor.read()

    async def wait(self, timeout: float | None = None) -> None:
        cursor = self._attached()
        if cursor is None:
            await self._handle.notifier.wait(timeout)  # woken by the first commit
        else:
            await cursor.wait(timeout)

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()


class MemberStreamHandle(RemoteStreamHandle):
    """A followed stream as the handlers see it: reads from the follower log through
    the member's commit view (cross-tier below it), the rest as on a non-member."""

    def __init__(
        self,
        streams: RemoteStreams,
        record: StreamRecord,
        view: MemberCommitView,
        refusal: Callable[[], str | None] = lambda: None,
    ):
        super().__init__(streams, record)
        self.view = view
        self.refusal = refusal
        """Why this member must not serve a new subscription now (None: it may)."""
        self.chunks = StreamChunkSource(
            view, self.notifier, lambda: self.record.settings.read_strategy
        )
        self.chunks.tier_started(self.manifest_view)
        self.source = self

    def attach(  # type: ignore[override]
        self, spec: OffsetSpec, *, want_file: bool = False, chunk_filter: ChunkFilter | None = None
    ) -> ChunkCursor:
        """Subscriptions on the member (they wait for its first commit if need be)."""
        if self.view.limit < 0:
            return WaitingCursor(self, spec, want_file, chunk_filter)
        return self.chunks.attach(spec, want_file=want_file, chunk_filter=chunk_filter)

    def first_offset(self) -> int:
        """The stream's first offset as this member's readers see it: the remote tier's
        once it holds anything (a segment the member kept below it holds data retention
        removed, which readers refuse as overtaken), else the follower log's."""
        tree = self.manifest_view.loaded_tree()
        local = self.view.segment_refs()[0].first_offset
        if tree is None or tree.is_empty:
            return local
        return tree.first_offset

    def commit_moved(self) -> None:
        self.notifier.notify()

    def status(self) -> dict[str, Any]:
        status = super().status()
        point = self.view.commit_point()
        status["state"] = "following"
        status["local"] = {
            "first_offset": self.view.segment_refs()[0].first_offset,
            "committed_chunk_id": point.chunk_id,
            "next_offset": point.next_offset,
        }
        return status


@dataclass(slots=True)
class _Followed:
    record: StreamRecord
    log: StreamLog
    view: MemberCommitView


class MemberReads:
    """The consumer side of every stream this node follows (``Followers`` tells it when
    a follower log opens, learns a commit, is cut and stops)."""

    def __init__(self, remote: RemoteStreams) -> None:
        self.remote = remote
        self._followed: dict[str, _Followed] = {}
        self._handles: dict[str, MemberStreamHandle] = {}
        self.progress: Progress | None = None  # set when replication runs here
        self.bound = MemberBound(heard_within=10.0)
        self._out: dict[str, str] = {}  # incarnations out of bound, and why

    # -- the bound -----------------------------------------------------------------------
    def refusal(self, incarnation: str) -> str | None:
        """Why this member must not serve consumers of the stream now (None: it may)."""
        got = None if self.progress is None else self.progress(incarnation)
        if got is None:
            return None
        return self.bound.refusal(*got)

    def check_bounds(self) -> None:
        """Tell the subscriptions of members that fell out of bound (MetadataUpdate);
        log each crossing once, both ways. Only streams whose consumers use this member
        (an open handle) or that were out of bound are looked at: the cost follows the
        streams read here, not the streams followed."""
        for incarnation in set(self._handles) | set(self._out):
            followed = self._followed.get(incarnation)
            if followed is None:
                continue
            reason = self.refusal(incarnation)
            was = self._out.get(incarnation)
            if reason is None:
                if was is not None:
                    del self._out[incarnation]
                    log.info("member_reads_serving_again", stream=followed.record.name)
                continue
            if was is None:
                log.warning("member_reads_out_of_bound", stream=followed.record.name, reason=reason)
            self._out[incarnation] = reason
            if incarnation in self._handles:
                self._close_handle(incarnation, reason)

    # -- told by the followers -----------------------------------------------------------
    def opened(self, record: StreamRecord, stream_log: StreamLog) -> None:
        self._close_handle(record.incarnation, "follower log reopened")
        self._followed[record.incarnation] = _Followed(
            record, stream_log, MemberCommitView(stream_log)
        )

    def committed(self, incarnation: str, chunk_id: int) -> None:
        followed = self._followed.get(incarnation)
        if followed is None or not followed.view.set_limit(chunk_id):
            return
        handle = self._handles.get(incarnation)
        if handle is not None:
            handle.commit_moved()

    def truncated(self, incarnation: str, keep_through: int) -> None:
        followed = self._followed.get(incarnation)
        if followed is None or followed.view.truncated(keep_through):
            return
        # the member dropped chunks its consumers were shown (it rejoins at the leader's
        # first segment): they are told and look the stream up again
        log.warning(
            "member_reads_view_reset",
            incarnation=incarnation,
            keep_through=keep_through,
            shown=followed.view.limit,
        )
        self._close_handle(incarnation, "member log cut below the commit shown")
        followed.view = MemberCommitView(followed.log)

    def stopped(self, incarnation: str) -> None:
        self._close_handle(incarnation, "no longer following")
        followed = self._followed.pop(incarnation, None)
        self._out.pop(incarnation, None)
        if followed is not None:
            followed.view.closed = True

    # -- asked by the handlers -----------------------------------------------------------
    def handle(self, record: StreamRecord) -> MemberStreamHandle | None:
        """The consumers' handle of a stream this node follows; None while it does not
        (yet) hold a follower log of it."""
        followed = self._followed.get(record.incarnation)
        if followed is None:
            return None
        handle = self._handles.get(record.incarnation)
        if handle is None or handle.closed:
            self.remote.drop(record.vhost, record.name)  # a member reads its own log now
            incarnation = record.incarnation
            handle = MemberStreamHandle(
                self.remote, record, followed.view, lambda: self.refusal(incarnation)
            )
            self._handles[record.incarnation] = handle
        return handle

    def readers_remote_next(self, incarnation: str) -> int | None:
        """None while nobody reads the stream here; else the remote tail the consumers'
        view of the manifest holds (polled while they read): the member's local
        retention frees nothing past it, so a reader finds every freed offset there."""
        handle = self._handles.get(incarnation)
        if handle is None or handle.closed or not handle.listeners:
            return None
        tree = handle.manifest_view.loaded_tree()
        return 0 if tree is None else tree.next_offset

    def following(self, incarnation: str) -> bool:
        return incarnation in self._followed

    def _close_handle(self, incarnation: str, reason: str) -> None:
        handle = self._handles.pop(incarnation, None)
        if handle is not None:
            log.info("member_reads_closed", stream=handle.name, reason=reason)
            handle.close()

    def close(self) -> None:
        for incarnation in list(self._handles):
            self._close_handle(incarnation, "shutting down")
        self._followed.clear()
