"""The one manifest walker: bounded walks equal a filter of the full walk, a strict walk
refuses a bad branch, a tolerant walk records it and goes on."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.remote.test_manifest_tree import STREAM, Store, build
from tierlog.formats.errors import FormatError
from tierlog.formats.manifest import decode_node
from tierlog.remote.errors import ManifestCorruptError
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.remote.manifest_walk import Bounds, ManifestWalker
from tierlog.storage.errors import NotFoundError


def walk(
    tree: ManifestTree, store: Store, bounds: Bounds = Bounds(), tolerant: bool = False
) -> tuple[ManifestWalker, list[FragmentEntry]]:
    walker = ManifestWalker("tl", STREAM, store.load, bounds, tolerant=tolerant)
    return walker, list(walker.walk(tree.root_entries(), tree.next_offset))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120),
    lo=st.none() | st.integers(0, 400),
    hi=st.none() | st.integers(0, 400),
    ts_lo=st.none() | st.integers(900, 1500),
    ts_hi=st.none() | st.integers(900, 1500),
)
def test_a_bounded_walk_is_the_full_walk_filtered(
    n: int, lo: int | None, hi: int | None, ts_lo: int | None, ts_hi: int | None
) -> None:
    tree, store, _ = build(n, m=3)
    _, full = walk(tree, store)
    assert [f.first_offset for f in full] == sorted(f.first_offset for f in full)
    assert all(a.next_offset == b.first_offset for a, b in itertools.pairwise(full))
    assert [f.key for f in full] == [loc.key for loc in tree.iter_fragments(store.load)]
    bounds = Bounds(lo, hi, ts_lo, ts_hi)
    _, got = walk(tree, store, bounds)
    expected = [
        f
        for f in full
        if (lo is None or f.next_offset > lo)
        and (hi is None or f.first_offset <= hi)
        and (ts_lo is None or f.max_timestamp >= ts_lo)
        and (ts_hi is None or f.min_timestamp <= ts_hi)
    ]
    assert got == expected


def damaged(store: Store, how: str) -> tuple[Store, str]:
    """A copy of ``store`` with one height-1 branch missing, corrupt or swapped."""
    groups = sorted(k for k in store if decode_node(store[k]).header.height == 1)
    victim, other = groups[0], groups[1]
    out = Store(store)
    if how == "missing":
        del out[victim]
    elif how == "corrupt":
        out[victim] = store[victim][:-1] + bytes([store[victim][-1] ^ 1])
    else:
        out[victim] = store[other]
    return out, victim


@pytest.mark.parametrize(
    ("how", "kind", "error"),
    [
        ("missing", "missing-branch", NotFoundError),
        ("corrupt", "corrupt-branch", FormatError),
        ("swapped", "branch-mismatch", ManifestCorruptError),
    ],
)
def test_bad_branches_stop_a_strict_walk_and_are_recorded_by_a_tolerant_one(
    how: str, kind: str, error: type[Exception]
) -> None:
    tree, store, _ = build(100, m=3)
    _, full = walk(tree, store)
    bad, victim = damaged(store, how)
    with pytest.raises(error):
        walk(tree, bad)
    tolerant, found = walk(tree, bad, tolerant=True)
    assert [(p.kind, p.key) for p in tolerant.problems] == [(kind, victim)]
    assert victim in tolerant.branch_keys
    lost = decode_node(store[victim]).header.total_fragments
    assert len(found) == len(full) - lost
    if how == "swapped":
        assert "first_offset: node" in tolerant.problems[0].detail
