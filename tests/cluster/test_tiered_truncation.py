"""A member's truncation never cuts what the remote tier holds: the tierer tells the
log its committed remote offset after every manifest commit (and after resolution)."""

from __future__ import annotations

import pytest

from tests.plugins.tiering_world import World
from tierlog.log.errors import TruncateBelowTieredError


def test_truncation_refuses_to_cut_tiered_chunks(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    world.append(30)
    assert tierer.flush(timeout=30)
    durable = tierer.durable_next
    assert durable > 0
    chunk_ids = sorted(world.local_chunks())
    below = [cid for cid in chunk_ids if cid < durable]
    with pytest.raises(TruncateBelowTieredError):
        world.log.truncate_after(below[len(below) // 2])
    tierer.stop()
    # a restarted tierer learns it from resolution, before any new commit
    again = world.tierer()
    again.start()
    with pytest.raises(TruncateBelowTieredError):
        world.log.truncate_after(below[0])
    again.stop()
