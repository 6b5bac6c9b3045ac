"""What each side of a replication connection decides, per stream, frame by frame.

Pure like ``cluster.state``: frames (``formats.replication``) and local outcomes in,
frames to send and local actions out. The network loop and the log's acceptor path are
the shell around it.

Member side (``ReplicaSession``): answers ``ADOPT`` after persisting the epoch, fetches
from the leader from its next offset with its tail, cuts its divergent suffix when the
leader answers with its history, appends ``CHUNKS`` verbatim only when they continue its
log exactly, reports ``WRITTEN`` after fsync, and refuses anything from an older epoch.

Leader side (``answer_fetch``): serves a fetch only from a member whose tail is on the
leader's log (Osiris's data-reader check), else sends its history so the member can
truncate first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierlog.cluster.errors import StaleEpochError
from tierlog.cluster.log_history import (
    NO_CHUNK,
    EpochRange,
    History,
    Tail,
    common_prefix_end,
    holds,
    tail_of,
)
from tierlog.cluster.state import MemberEpoch
from tierlog.formats import replication as wire

DEFAULT_FETCH_BYTES = 8 << 20

# --- member side: local actions -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class PersistEpoch:
    """fsync the new highest epoch before sending what follows it."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Cut every chunk after ``keep_through`` (``NO_CHUNK``: everything), then report
    ``truncated`` with the log's new next offset."""

    keep_through: int


@dataclass(frozen=True, slots=True)
class AppendChunks:
    """Append the frame's chunk bytes verbatim (the acceptor checks each chunk's CRC and
    that chunk ids continue), fsync, then report ``written``."""

    chunks: wire.Chunks


@dataclass(frozen=True, slots=True)
class SetCommit:
    """Consumers on this member may read through ``chunk_id``."""

    chunk_id: int


@dataclass(frozen=True, slots=True)
class Send:
    frame: wire.Frame


Action = PersistEpoch | Truncate | AppendChunks | SetCommit | Send


class ReplicaSession:
    """One member's replication of one stream from its current leader."""

    def __init__(
        self,
        stream: str,
        history: History,
        next_offset: int,
        highest_epoch: int,
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
    ) -> None:
        self.stream = stream
        self.history = history
        self.next_offset = next_offset
        self.guard = MemberEpoch(highest_epoch)
        self.fetch_bytes = fetch_bytes
        self.leader_epoch: int | None = None  # the epoch we follow
        self.commit = NO_CHUNK
        self._pending_append: wire.Chunks | None = None
        self._leader_commit = NO_CHUNK  # the highest commit the leader announced
        # the last chunk known to be on the followed leader's log too (its answer to a
        # fetch from our tail, its history, or chunks it sent): only up to here may a
        # commit be shown, a divergent suffix not cut yet holds other chunks at those ids
        self._agreed = NO_CHUNK

    @property
    def tail(self) -> Tail:
        return tail_of(self.history)

    @property
    def leader_commit(self) -> int:
        """The highest commit (chunk id) the followed leader announced."""
        return self._leader_commit

    def _refuse(self, epoch: int, actions: list[Action]) -> None:
        actions.append(
            Send(
                wire.Refused(
                    self.stream,
                    self.guard.highest,
                    wire.RefusalCode.STALE_EPOCH,
                    self.guard.highest,
                    f"epoch {epoch} is older than {self.guard.highest}",
                )
            )
        )

    def _accept_epoch(self, epoch: int, actions: list[Action]) -> bool:
        try:
            raised = self.guard.check(epoch)
        except StaleEpochError:
            self._refuse(epoch, actions)
            return False
        if raised:
            actions.append(PersistEpoch(epoch))
        return True

    def fetch(self) -> wire.Fetch:
        assert self.leader_epoch is not None
        tail = self.tail
        return wire.Fetch(
            self.stream,
            self.leader_epoch,
            self.next_offset,
            tail.epoch,
            tail.chunk_id,
            self.fetch_bytes,
        )

    def follow(self, epoch: int) -> list[Action]:
        """Start following the leader of ``epoch`` (the cluster directory named it):
        persist the epoch if it is new, then fetch. Raises ``StaleEpochError`` for an
        epoch older than one already seen."""
        actions: list[Action] = []
        if self.guard.check(epoch):
            actions.append(PersistEpoch(epoch))
        if self.leader_epoch != epoch:
            self.leader_epoch = epoch
            self._pending_append = None
            self._leader_commit = NO_CHUNK
            self._agreed = NO_CHUNK
        actions.append(Send(self.fetch()))
        return actions

    def on_frame(self, frame: wire.Frame) -> list[Action]:
        actions: list[Action] = []
        if isinstance(frame, wire.Adopt):
            if self._accept_epoch(frame.epoch, actions):
                if self.leader_epoch != frame.epoch:
                    self._leader_commit = NO_CHUNK
                    self._agreed = NO_CHUNK  # a new leader's log may not hold our suffix
                self.leader_epoch = frame.epoch
                tail = self.tail
                adopted = wire.Adopted(
                    self.stream, frame.epoch, True, self.guard.highest, tail.epoch, tail.chunk_id
                )
                actions.append(Send(adopted))
            return actions
        if isinstance(frame, wire.History | wire.Chunks | wire.Commit):
            if not self._accept_epoch(frame.epoch, actions):
                return actions
            if self.leader_epoch != frame.epoch:
                self.leader_epoch = frame.epoch
                self._pending_append = None
                self._leader_commit = NO_CHUNK
                self._agreed = NO_CHUNK
        if isinstance(frame, wire.History):
            ranges = tuple(EpochRange(e, first, last) for e, first, last in frame.ranges)
            keep = common_prefix_end(self.history, ranges)
            if keep < self.tail.chunk_id:
                actions.append(Truncate(keep))  # the shell reports ``truncated`` next
            else:
                actions.append(Send(self.fetch()))
            self._agreed = min(keep, self.tail.chunk_id)
            self._set_commit(frame.commit_chunk_id, actions)
        elif isinstance(frame, wire.Chunks):
            continues = frame.first_chunk_id == self.next_offset or (
                self.tail.empty and frame.first_chunk_id > self.next_offset  # late joiner
            )
            if frame.first_chunk_id == self.next_offset:
                # the leader serves a fetch only from a tail on its log: ours is
                self._agreed = self.tail.chunk_id
            if frame.chunk_count and continues:
                if self._pending_append is None:
                    self._pending_append = frame
                    actions.append(AppendChunks(frame))
            elif not frame.chunk_count:
                actions.append(Send(self.fetch()))  # nothing new yet: ask again
            # A range that does not continue our log is a stale answer: ignore it.
            self._set_commit(frame.commit_chunk_id, actions)
        elif isinstance(frame, wire.Commit):
            self._set_commit(frame.chunk_id, actions)
        return actions

    def _set_commit(self, chunk_id: int, actions: list[Action]) -> None:
        # Never past what we hold and know to be the leader's chunks: its commit may be
        # ahead of our log, and a suffix of ours not cut yet may differ from its log.
        self._leader_commit = max(self._leader_commit, chunk_id)
        tail = self.tail
        if tail.epoch == self.leader_epoch:
            # one leader per epoch: chunks of its epoch (and all before them) are its own
            self._agreed = max(self._agreed, tail.chunk_id)
        visible = min(self._leader_commit, self._agreed, tail.chunk_id)
        if visible > self.commit:
            self.commit = visible
            actions.append(SetCommit(visible))

    def below_local_log(self, epoch: int) -> list[Action]:
        """The leader of ``epoch`` no longer holds the chunks after our tail locally:
        its retention deleted them once they were tiered, so they are committed and in
        the remote tier. Our copy is dropped and we start again where its log starts
        (as a late joiner), instead of asking for the missing range for ever. From
        another epoch's leader (a stale answer) this does nothing, and neither does a
        second refusal once our copy is dropped: it answers a fetch that was in flight
        before the drop (an empty member's fetch is never below the leader's log)."""
        if epoch != self.leader_epoch or self.tail.chunk_id == NO_CHUNK:
            return []
        self._pending_append = None
        return [Truncate(NO_CHUNK)]

    def truncated(self, history: History, next_offset: int) -> list[Action]:
        """The shell cut the log as asked; continue fetching from its new end."""
        self.history, self.next_offset = history, next_offset
        self.commit = min(self.commit, self.tail.chunk_id)
        self._leader_commit = min(self._leader_commit, self.tail.chunk_id)
        self._agreed = min(self._agreed, self.tail.chunk_id)
        return [Send(self.fetch())] if self.leader_epoch is not None else []

    def written(self, history: History, next_offset: int) -> list[Action]:
        """The appended chunks are fsynced: ack them and fetch the next range."""
        self._pending_append = None
        agreed_before = self._agreed == tail_of(self.history).chunk_id
        self.history, self.next_offset = history, next_offset
        if agreed_before:  # the appended chunks continued an agreed log: the leader's
            self._agreed = self.tail.chunk_id
        if self.leader_epoch is None:
            return []
        actions: list[Action] = [
            Send(wire.Written(self.stream, self.leader_epoch, self.tail.chunk_id))
        ]
        self._set_commit(self._leader_commit, actions)
        actions.append(Send(self.fetch()))
        return actions


# --- leader side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServeChunks:
    """Send chunks of the local log from ``from_offset``, at most ``max_bytes``."""

    from_offset: int
    max_bytes: int


FetchAnswer = ServeChunks | wire.History | wire.Refused


def answer_fetch(
    stream: str,
    epoch: int,
    history: Sequence[EpochRange],
    next_offset: int,
    commit: int,
    fetch: wire.Fetch,
    join_offset: int = 0,
) -> FetchAnswer:
    """How the leader of ``epoch`` answers a member's fetch. ``join_offset``: where an
    empty member starts, the first tracking-snapshot chunk the leader still holds
    locally (older chunks are in the remote tier)."""
    if fetch.epoch > epoch:
        return wire.Refused(
            stream, epoch, wire.RefusalCode.NOT_LEADER, fetch.epoch, "a newer epoch leads"
        )
    if fetch.epoch < epoch or not holds(history, Tail(fetch.tail_epoch, fetch.tail_chunk_id)):
        ranges = tuple((r.epoch, r.first_chunk_id, r.last_chunk_id) for r in history)
        return wire.History(stream, epoch, commit, ranges)
    if fetch.tail_chunk_id == NO_CHUNK and fetch.from_chunk_id < join_offset:
        return ServeChunks(join_offset, fetch.max_bytes)
    first = history[0].first_chunk_id if history else next_offset
    if fetch.from_chunk_id > next_offset or (
        fetch.tail_chunk_id != NO_CHUNK and fetch.tail_chunk_id < first - 1
    ):
        return wire.Refused(
            stream, epoch, wire.RefusalCode.OUT_OF_RANGE, epoch, "fetch outside the local log"
        )
    return ServeChunks(fetch.from_chunk_id, fetch.max_bytes)
