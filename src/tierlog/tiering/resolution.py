"""Resolution as pure decisions: what a starting writer adopts, where its log continues.

When a writer starts, the committed manifest may be followed by fragments that an earlier
writer uploaded but never committed. Nothing here does I/O: the shell
(``tiering.tierer``) fetches the fragments' metadata (concurrently, speculatively from a
listing) and the local log's chunk records, and this module decides:

* the chain: from the committed next offset, follow next offsets through fetched fragments;
  it ends at the first offset where no object exists. An offset the shell has not fetched
  yet (a listing may miss objects) stops the chain as *unfetched*: the shell reads it and
  asks again. A read error is only an error when the chain reaches its offset.
* adoption: a fragment of the chain is adopted only if its max epoch is not newer than
  the writer's and, for chunks the local log still holds, its index matches them
  (epoch, CRC, size). Anything else is a conflict that stops tiering the stream.
* the local log: when the remote tier ends past the local log, the local log restarts at
  the remote end under an epoch above every epoch it holds; when the local log starts
  past the remote end, the offsets in between are lost (a conflict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tierlog.remote.fragments import FragmentEntry, RemoteFragment
from tierlog.tiering.errors import FragmentConflictError


@dataclass(frozen=True, slots=True)
class LocalChunk:
    """What the adoption rule compares with a remote fragment's index record."""

    epoch: int
    crc: int
    size: int


@dataclass(frozen=True, slots=True)
class LocalLog:
    """The local log's range and the highest epoch it holds."""

    first_offset: int
    next_offset: int
    max_epoch: int


@dataclass(frozen=True, slots=True)
class CommittedRange:
    """The committed manifest's ``[first, next)``; ``empty`` when it holds no fragment."""

    first_offset: int
    next_offset: int
    empty: bool


Fetched = RemoteFragment | None | Exception
"""One fetch outcome: the fragment, None when no object exists at that first offset, or
the error the read gave (raised only when the chain reaches that offset)."""


@dataclass(frozen=True, slots=True)
class Chain:
    """The adoptable fragments after the committed manifest, in offset order."""

    fragments: tuple[RemoteFragment, ...]
    next_offset: int
    unfetched: int | None = None  # the chain goes on at an offset not fetched yet

    def entries(self) -> tuple[FragmentEntry, ...]:
        return tuple(f.entry() for f in self.fragments)

    def last_position(self) -> tuple[int, int] | None:
        """``(segment first offset, fragment seq)`` of the chain's last fragment."""
        if not self.fragments:
            return None
        t = self.fragments[-1].trailer
        return (t.segment_first_offset, t.seq_no)


@dataclass(frozen=True, slots=True)
class Resolution:
    """What to carry out: adopt ``adopted`` in the fencing commit, continue tiering at
    ``next_offset``; with ``restart_epoch`` first restart the local log there."""

    next_offset: int
    adopted: tuple[FragmentEntry, ...]
    restart_epoch: int | None
    last_fragment: tuple[int, int] | None


def adoption_problem(
    fragment: RemoteFragment, epoch: int, local: Mapping[int, LocalChunk]
) -> str | None:
    """Why the writer must not adopt ``fragment``, or None when it may: its CRC is valid
    (checked while decoding), its max epoch is not newer than the writer's, and for
    chunks still held locally its index matches them."""
    t = fragment.trailer
    if t.max_epoch > epoch:
        return f"fragment {t.first_offset} has epoch {t.max_epoch} > writer epoch {epoch}"
    if not local:
        return None
    records = fragment.index.records
    ids = records["chunk_id"].tolist()
    epochs = records["epoch"].tolist()
    crcs = records["crc"].tolist()
    sizes = records["size"].tolist()
    for chunk_id, e, crc, size in zip(ids, epochs, crcs, sizes, strict=True):
        mine = local.get(chunk_id)
        if mine is not None and (e, crc, size) != (mine.epoch, mine.crc, mine.size):
            return f"fragment {t.first_offset}: chunk {chunk_id} differs from the local log"
    return None


def follow_chain(
    start: int, fetched: Mapping[int, Fetched], epoch: int, local: Mapping[int, LocalChunk]
) -> Chain:
    """The chain of adoptable fragments from ``start`` through ``fetched``.

    Raises FragmentConflictError at the first fragment the writer must not adopt, or the
    stored read error of a fragment the chain reaches."""
    chain: list[RemoteFragment] = []
    at = start
    while True:
        if at not in fetched:
            return Chain(tuple(chain), at, unfetched=at)
        found = fetched[at]
        if found is None:
            return Chain(tuple(chain), at)
        if isinstance(found, Exception):
            raise found
        problem = adoption_problem(found, epoch, local)
        if problem is not None:
            raise FragmentConflictError(problem)
        chain.append(found)
        at = found.trailer.next_offset


def fetched_end(start: int, fetched: Mapping[int, Fetched]) -> int:
    """The end of the offsets any fetched fragment covers (at least ``start``): the range
    of local chunks the adoption rule needs."""
    ends = [f.trailer.next_offset for f in fetched.values() if isinstance(f, RemoteFragment)]
    return max([start, *ends])


def needs_committed_tail(committed: CommittedRange, chain: Chain) -> bool:
    """Whether the position of the committed manifest's last fragment is needed (to carry
    on its segment's fragment numbering): only when nothing is adopted after it."""
    return not chain.fragments and not committed.empty


def stream_first_offset(committed: CommittedRange) -> int:
    """The stream's first offset as the remote tier holds it (0 before any commit)."""
    return 0 if committed.empty else committed.first_offset


def resolve(
    committed: CommittedRange,
    chain: Chain,
    local: LocalLog,
    epoch: int,
    committed_tail: tuple[int, int] | None = None,
) -> Resolution:
    """Decide the outcome of resolution; FragmentConflictError when offsets are lost."""
    next_offset = chain.next_offset
    last = chain.last_position() or committed_tail
    restart_epoch = None
    if next_offset > local.next_offset:
        restart_epoch = max(epoch, local.max_epoch + 1)
        last = None  # the local log continues in a new segment
    elif next_offset < local.first_offset:
        raise FragmentConflictError(
            f"local log starts at {local.first_offset} but the remote tier ends at "
            f"{next_offset}: offsets in between are lost"
        )
    return Resolution(next_offset, chain.entries(), restart_epoch, last)


def adopted_before(chain: Sequence[RemoteFragment], target: int) -> RemoteFragment | None:
    """The chain's fragment holding ``target`` (or the last one starting at or before it)."""
    found = None
    for fragment in chain:
        if fragment.trailer.first_offset > target:
            break
        found = fragment
    return found
