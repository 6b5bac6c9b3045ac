"""Local retention by age reads each sealed segment's index once, not on every pass:
a full index read costs ~5 µs per chunk and runs on the stream's writer thread."""

from __future__ import annotations

from tests.plugins.tiering_world import World


def test_age_retention_reads_each_sealed_index_once_and_decides_the_same(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    world.append(60)
    assert tierer.flush(timeout=30)
    sealed = [s.first_offset for s in world.log.list_segments() if s.sealed]
    assert len(sealed) >= 2

    reads: list[int] = []
    read_index = world.log.segment_chunks

    def counted(first: int):  # type: ignore[no-untyped-def]
        reads.append(first)
        return read_index(first)

    world.log.segment_chunks = counted  # type: ignore[method-assign]
    newest = max(c.timestamp for f in sealed for c in read_index(f))
    oldest = min(read_index(f)[-1].timestamp for f in sealed)
    decisions = []
    for now_ms in (oldest, oldest + 1_500, newest + 1_000, newest + 10_000):
        decisions.append(tierer.local_segments_to_free(None, 1.0, now_ms))
    assert sorted(reads) == sorted(sealed)  # each sealed index read once, in the first pass
    assert decisions[-1] == sealed  # all old enough and durable: all freeable
    assert decisions[0] == []  # none older than 1 s yet

    # The same decisions as reading every index afresh (a tierer with nothing remembered).
    fresh = world.tierer()
    fresh.committer.load()
    for now_ms, decided in zip(
        (oldest, oldest + 1_500, newest + 1_000, newest + 10_000), decisions, strict=True
    ):
        assert fresh.local_segments_to_free(None, 1.0, now_ms) == decided

    # Freed segments are forgotten; new sealed segments are read once.
    for first in sealed[:1]:
        world.log.delete_segment(first)
    world.append(30)
    assert tierer.flush(timeout=30)
    reads.clear()
    tierer.local_segments_to_free(None, 1.0, newest)
    now_sealed = {s.first_offset for s in world.log.list_segments() if s.sealed}
    assert set(reads) == now_sealed - set(sealed)
    assert set(tierer._sealed_newest) <= now_sealed
