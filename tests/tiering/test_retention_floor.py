"""The retention floor of delayed streams' system streams (``floor_trim_offset``): whole
fragments below the floor go, never one holding the floor or above, never the last."""

from __future__ import annotations

from tests.remote.test_manifest_tree import build
from tierlog.tiering.retention import floor_trim_offset


def test_floor_trims_whole_fragments_below_it_and_never_the_last() -> None:
    tree, store, frags = build(40, m=4)
    load = store.get
    ends = [f.next_offset for f in frags]
    assert floor_trim_offset(tree, load, 0) is None
    assert floor_trim_offset(tree, load, ends[0] - 1) is None  # inside the first fragment
    assert floor_trim_offset(tree, load, ends[0]) == ends[0]
    assert floor_trim_offset(tree, load, ends[10] + 1) == ends[10]  # not into fragment 11
    # at or past the tail: everything but the last fragment
    assert floor_trim_offset(tree, load, ends[-1]) == ends[-2]
    assert floor_trim_offset(tree, load, ends[-1] + 100) == ends[-2]
