"""Resolution decisions without I/O: chain following, the adoption rule, where the local
log continues. Fragments are real encoded fragments, decoded back as the tierer reads them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.formats.fragment import (
    FragmentChunkInfo,
    FragmentPlacement,
    decode_index,
    decode_trailer,
    encode_fragment,
    index_range,
)
from tierlog.remote.fragments import RemoteFragment
from tierlog.storage.errors import TransientError
from tierlog.tiering.errors import FragmentConflictError
from tierlog.tiering.resolution import (
    Chain,
    CommittedRange,
    Fetched,
    LocalChunk,
    LocalLog,
    adopted_before,
    adoption_problem,
    fetched_end,
    follow_chain,
    needs_committed_tail,
    resolve,
    stream_first_offset,
)

CHUNK = 64  # bytes per fake chunk


def fragment(
    first: int, records: list[int], *, epoch: int = 1, segment: int = 0, seq: int = 0
) -> RemoteFragment:
    """A fragment of one chunk per entry of ``records`` (records per chunk)."""
    infos, chunks, at = [], [], first
    for n in records:
        infos.append(FragmentChunkInfo(at, 1000 + at, epoch, CHUNK, n, crc=at * 7 + 1))
        chunks.append(bytes(CHUNK))
        at += n
    parts, _ = encode_fragment(FragmentPlacement(seq, segment, 8), chunks, infos)
    data = b"".join(parts)
    trailer = decode_trailer(data)
    start, end = index_range(trailer.data_size, trailer.chunk_count)
    return RemoteFragment(f"data/{first:020d}", trailer, decode_index(data[start:end], trailer))


def local_of(*fragments: RemoteFragment, epoch: int = 1) -> dict[int, LocalChunk]:
    out = {}
    for f in fragments:
        for i in range(len(f.index)):
            info, _ = f.index.chunk(i)
            out[info.chunk_id] = LocalChunk(epoch=epoch, crc=info.crc, size=info.size)
    return out


def chain_of(start: int, sizes: list[int]) -> list[RemoteFragment]:
    out, at = [], start
    for seq, n in enumerate(sizes):
        out.append(fragment(at, [n], seq=seq))
        at += n
    return out


# -- the adoption rule ---------------------------------------------------------------------


def test_adoption_rule() -> None:
    f = fragment(10, [3, 4], epoch=2)
    assert adoption_problem(f, 2, {}) is None
    assert adoption_problem(f, 2, local_of(f, epoch=2)) is None
    assert "epoch 2 > writer epoch 1" in (adoption_problem(f, 1, {}) or "")
    local = local_of(f, epoch=2)
    local[13] = LocalChunk(epoch=2, crc=local[13].crc ^ 1, size=local[13].size)
    assert adoption_problem(f, 2, local) == "fragment 10: chunk 13 differs from the local log"
    local = local_of(f, epoch=1)  # same bytes, written under another epoch locally
    assert adoption_problem(f, 2, local) is not None
    # chunks the local log no longer holds are not compared
    assert adoption_problem(f, 2, {99: LocalChunk(1, 0, 0)}) is None


# -- following the chain -------------------------------------------------------------------


def test_chain_follows_next_offsets_and_stops_at_an_absent_object() -> None:
    a, b, c = chain_of(5, [3, 2, 4])
    orphan = fragment(100, [1])
    fetched: dict[int, Fetched] = {5: a, 8: b, 10: c, 14: None, 100: orphan}
    chain = follow_chain(5, fetched, 1, local_of(a, b, c))
    assert [f.trailer.first_offset for f in chain.fragments] == [5, 8, 10]
    assert (chain.next_offset, chain.unfetched) == (14, None)
    assert chain.last_position() == (0, 2)  # segment 0, third fragment
    assert [e.first_offset for e in chain.entries()] == [5, 8, 10]
    assert chain.entries()[0].key == a.key


def test_chain_asks_for_an_offset_it_has_not_fetched() -> None:
    a, b = chain_of(0, [3, 2])
    chain = follow_chain(0, {0: a}, 1, {})
    assert (chain.next_offset, chain.unfetched) == (3, 3)
    chain = follow_chain(0, {0: a, 3: b}, 1, {})
    assert chain.unfetched == 5


def test_read_errors_count_only_where_the_chain_reaches() -> None:
    a, b = chain_of(0, [3, 2])
    boom = TransientError("slow down")
    # an unreachable fragment that could not be read does not matter
    chain = follow_chain(0, {0: a, 3: b, 5: None, 50: boom}, 1, {})
    assert chain.next_offset == 5
    with pytest.raises(TransientError):
        follow_chain(0, {0: a, 3: boom}, 1, {})


def test_chain_stops_with_a_conflict_at_the_first_bad_fragment() -> None:
    a = fragment(0, [3])
    newer = fragment(3, [2], epoch=9)
    with pytest.raises(FragmentConflictError, match="epoch 9"):
        follow_chain(0, {0: a, 3: newer}, 1, {})


def test_fetched_end_covers_every_fetched_fragment() -> None:
    a, b = chain_of(4, [3, 2])
    assert fetched_end(4, {}) == 4
    assert fetched_end(4, {4: a, 7: b, 9: None, 20: TransientError("x")}) == 9


@settings(max_examples=150, deadline=None)
@given(
    start=st.integers(0, 1000),
    sizes=st.lists(st.integers(1, 9), max_size=12),
    orphans=st.lists(st.integers(1, 40), max_size=4),
    listed=st.lists(st.booleans(), min_size=20, max_size=20),
    batch=st.integers(1, 6),
)
def test_any_listing_gives_the_chain_of_one_read_at_a_time(
    start: int, sizes: list[int], orphans: list[int], listed: list[bool], batch: int
) -> None:
    """Speculative reads from any (incomplete) listing end with the same chain as reading
    one fragment after another, and never read an offset twice."""
    chain = chain_of(start, sizes)
    end = start + sum(sizes)
    objects: dict[int, RemoteFragment] = {f.trailer.first_offset: f for f in chain}
    for gap in orphans:  # uploaded by a crashed writer past a hole: never reached
        objects.setdefault(end + gap, fragment(end + gap, [1]))
    offsets = sorted(objects)
    seen = {o for i, o in enumerate(offsets) if listed[i % len(listed)]}

    def list_from(at: int) -> list[int]:
        return [o for o in offsets if o >= at and o in seen][:batch]

    reads: list[int] = []
    fetched: dict[int, Fetched] = {}
    want = list_from(start)
    while True:  # the shell's loop
        for o in want:
            if o not in fetched:
                reads.append(o)
                fetched[o] = objects.get(o)
        got = follow_chain(start, fetched, 1, local_of(*chain))
        if got.unfetched is None:
            break
        want = [got.unfetched, *list_from(got.unfetched)]
    assert [f.trailer.first_offset for f in got.fragments] == [
        f.trailer.first_offset for f in chain
    ]
    assert got.next_offset == end
    assert len(reads) == len(set(reads))


# -- deciding where the logs continue ---------------------------------------------------------


def test_remote_ahead_restarts_the_local_log_with_a_newer_epoch() -> None:
    a, b = chain_of(10, [5, 5])
    chain = Chain((a, b), 20)
    committed = CommittedRange(0, 10, empty=False)
    got = resolve(committed, chain, LocalLog(0, 12, max_epoch=3), epoch=2, committed_tail=(0, 4))
    assert (got.next_offset, got.restart_epoch, got.last_fragment) == (20, 4, None)
    assert [e.first_offset for e in got.adopted] == [10, 15]
    got = resolve(committed, chain, LocalLog(0, 12, max_epoch=1), epoch=2)
    assert got.restart_epoch == 2


def test_local_log_past_the_remote_end_is_a_conflict() -> None:
    committed = CommittedRange(0, 10, empty=False)
    with pytest.raises(FragmentConflictError, match="offsets in between are lost"):
        resolve(committed, Chain((), 10), LocalLog(15, 30, 1), epoch=1)


def test_fragment_numbering_continues_from_the_chain_or_the_committed_tail() -> None:
    a = fragment(10, [5], segment=7, seq=3)
    committed = CommittedRange(0, 10, empty=False)
    local = LocalLog(0, 40, 1)
    with_chain = Chain((a,), 15)
    assert not needs_committed_tail(committed, with_chain)
    assert resolve(committed, with_chain, local, 1, None).last_fragment == (7, 3)
    alone = Chain((), 10)
    assert needs_committed_tail(committed, alone)
    assert resolve(committed, alone, local, 1, (7, 2)).last_fragment == (7, 2)
    assert resolve(committed, alone, local, 1, (7, 2)).restart_epoch is None
    assert not needs_committed_tail(CommittedRange(0, 0, empty=True), alone)


def test_stream_first_offset_and_adopted_lookup() -> None:
    assert stream_first_offset(CommittedRange(5, 9, empty=False)) == 5
    assert stream_first_offset(CommittedRange(9, 9, empty=True)) == 0
    a, b = chain_of(10, [5, 5])
    assert adopted_before((a, b), 9) is None
    assert adopted_before((a, b), 12) is a
    assert adopted_before((a, b), 19) is b
    assert adopted_before((a, b), 30) is b
