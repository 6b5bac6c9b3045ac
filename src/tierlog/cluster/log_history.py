"""A log as the cluster decisions see it: its tail and its epoch history.

Chunks are identified by their chunk id (first offset). Within one epoch only one
leader ever wrote, and members only append chunks they fetched from a leader after
cutting any suffix that leader does not hold, so two logs that hold a chunk with the
same (epoch, chunk id) hold the same chunks up to it (the log-matching property
Osiris and Raft rely on). That is why a log is summarised by its epoch history: for
each epoch the first and last chunk id written in it.

Truncation follows Osiris's acceptor rule: walk the leader's epoch history from the
newest epoch down; the first epoch whose last leader chunk the member holds (or of
which the member holds a prefix) marks the end of the common log; everything after it
is a divergent, uncommitted suffix and is cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NO_CHUNK = -1  # the chunk id of "nothing": an empty log's last chunk


@dataclass(frozen=True, slots=True, order=True)
class Tail:
    """A log's last chunk as (epoch, chunk id). Ordering is "more up to date":
    compare epochs first, then chunk ids. An empty log has ``Tail.EMPTY``."""

    epoch: int
    chunk_id: int

    @property
    def empty(self) -> bool:
        return self.chunk_id == NO_CHUNK


EMPTY_TAIL = Tail(0, NO_CHUNK)


@dataclass(frozen=True, slots=True)
class EpochRange:
    """The chunks one epoch wrote in a log: first and last chunk id (inclusive)."""

    epoch: int
    first_chunk_id: int
    last_chunk_id: int

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.first_chunk_id < 0 or self.last_chunk_id < self.first_chunk_id:
            raise ValueError(f"invalid epoch range {self}")


History = tuple[EpochRange, ...]


def history_of(chunks: Iterable[tuple[int, int]]) -> History:
    """The epoch history of a log given as ``(epoch, chunk id)`` pairs in log order.
    Raises ``ValueError`` if epochs go down or chunk ids do not increase (such a log
    breaks the rules and must not be summarised as if it were valid)."""
    ranges: list[EpochRange] = []
    last_id = NO_CHUNK
    for epoch, chunk_id in chunks:
        if chunk_id <= last_id:
            raise ValueError(f"chunk id {chunk_id} after {last_id}: ids must increase")
        if ranges and epoch < ranges[-1].epoch:
            raise ValueError(f"epoch {epoch} after {ranges[-1].epoch}: epochs must not go down")
        if ranges and ranges[-1].epoch == epoch:
            ranges[-1] = EpochRange(epoch, ranges[-1].first_chunk_id, chunk_id)
        else:
            ranges.append(EpochRange(epoch, chunk_id, chunk_id))
        last_id = chunk_id
    return tuple(ranges)


def tail_of(history: Sequence[EpochRange]) -> Tail:
    if not history:
        return EMPTY_TAIL
    last = history[-1]
    return Tail(last.epoch, last.last_chunk_id)


def max_epoch(history: Sequence[EpochRange]) -> int:
    return history[-1].epoch if history else 0


def common_prefix_end(local: Sequence[EpochRange], leader: Sequence[EpochRange]) -> int:
    """The last chunk id the member keeps before following ``leader`` (Osiris's
    acceptor truncation); ``NO_CHUNK`` means nothing is kept.

    For each leader epoch, newest first, with the leader's last chunk ``L`` in it:

    * the member holds chunk ``L`` in that epoch: both logs agree up to ``L``; keep
      up to ``L`` (anything after it locally was never written by the leader);
    * the member's chunks of that epoch all lie before ``L``: they are a prefix of the
      leader's chunks of the epoch; keep them, cut what follows;
    * otherwise (the member has no chunk of that epoch, or its chunks of that epoch
      start after ``L``): look at the leader's previous epoch.
    """
    by_epoch = {r.epoch: r for r in local}
    for theirs in sorted(leader, key=lambda r: r.epoch, reverse=True):
        mine = by_epoch.get(theirs.epoch)
        if mine is None:
            continue
        if mine.first_chunk_id <= theirs.last_chunk_id <= mine.last_chunk_id:
            return theirs.last_chunk_id
        if mine.last_chunk_id < theirs.last_chunk_id and mine.first_chunk_id >= (
            theirs.first_chunk_id
        ):
            return mine.last_chunk_id
    return NO_CHUNK


def holds(history: Sequence[EpochRange], tail: Tail) -> bool:
    """Whether a log with ``history`` holds the chunk ``tail`` (same epoch, same id),
    assuming ``tail.chunk_id`` is a chunk id of the log that wrote it. A leader checks
    a member's tail with this before serving it (Osiris's data-reader check): a member
    whose tail is not on the leader's log must truncate first."""
    if tail.empty:
        return True
    for r in history:
        if r.epoch == tail.epoch:
            return r.first_chunk_id <= tail.chunk_id <= r.last_chunk_id
    return False


def truncate_history(history: Sequence[EpochRange], keep_through: int) -> History:
    """The history after cutting every chunk with an id above ``keep_through``. The
    last kept range's end is ``keep_through`` only if that is a chunk id of the log,
    which callers guarantee by passing a value from ``common_prefix_end``."""
    kept: list[EpochRange] = []
    for r in history:
        if r.first_chunk_id > keep_through:
            break
        if r.last_chunk_id > keep_through:
            r = EpochRange(r.epoch, r.first_chunk_id, keep_through)
        kept.append(r)
    return tuple(kept)
