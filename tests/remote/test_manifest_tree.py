"""The M-way manifest tree and the object keys: folding, lookups, trimming, restarts."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import (
    FragmentChunkInfo,
    FragmentPlacement,
    decode_trailer,
    encode_fragment,
)
from tierlog.formats.manifest import ENTRY_DTYPE, decode_node, node_size
from tierlog.remote.errors import (
    InvalidFragmentEntryError,
    ManifestCorruptError,
    ManifestGapError,
    OffsetBeyondEndError,
    OffsetOvertakenError,
)
from tierlog.remote.keys import (
    BranchKey,
    FragmentKey,
    RootKey,
    branch_key,
    branch_kind,
    data_prefix,
    fragment_key,
    metadata_prefix,
    new_uid,
    parse_key,
    root_key,
)
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.storage.errors import InvalidKeyError, NotFoundError

STREAM = "vh_orders_1700000000000000000"


@dataclass(frozen=True)
class Frag:
    first_offset: int
    next_offset: int
    min_timestamp: int
    max_timestamp: int
    data_size: int
    chunk_count: int


def frags(first: int, spans: list[int], ts: int = 1_000) -> list[Frag]:
    out = []
    for span in spans:
        out.append(Frag(first, first + span, ts, ts + span, 1000 * span, span))
        first, ts = first + span, ts + span
    return out


class Store(dict[str, bytes]):
    """Branch objects by key, with create-only semantics and a GET counter."""

    gets = 0

    def put_new(self, key: str, data: bytes) -> None:
        assert key not in self, f"branch object {key} rewritten"
        self[key] = data

    def load(self, key: str) -> bytes:
        self.gets += 1
        try:
            return self[key]
        except KeyError:
            raise NotFoundError(key) from None


def uid_factory() -> Callable[[], bytes]:
    """Deterministic uids, so two trees fed the same appends encode the same bytes."""
    counter = itertools.count(1)
    return lambda: next(counter).to_bytes(16, "big")


# ----- keys --------------------------------------------------------------------------------


def test_keys_have_the_documented_shape() -> None:
    uid = bytes.fromhex("00112233445566778899aabbccddeeff")
    assert (
        fragment_key("tl", STREAM, 1234) == f"tl/stream/{STREAM}/data/00000000000000001234.fragment"
    )
    assert root_key("tl", STREAM, uid) == f"tl/stream/{STREAM}/metadata/root.{uid.hex()}.manifest"
    assert branch_key("tl/", STREAM, 5, uid, 1).endswith(
        f"/metadata/00000000000000000005.{uid.hex()}.group"
    )
    assert (
        branch_key("", STREAM, 5, uid, 2)
        == f"stream/{STREAM}/metadata/00000000000000000005.{uid.hex()}.kgroup"
    )
    assert [branch_kind(h) for h in (1, 2, 3, 4, 17)] == [
        "group",
        "kgroup",
        "mgroup",
        "h4group",
        "h17group",
    ]
    assert data_prefix("a/b", STREAM) == f"a/b/stream/{STREAM}/data/"
    assert metadata_prefix("", STREAM) == f"stream/{STREAM}/metadata/"
    # zero-padded offsets sort like numbers
    assert fragment_key("p", "s", 99) < fragment_key("p", "s", 100)


@given(
    prefix=st.sampled_from(["", "tl", "a/b/c", "/x/"]),
    stream=st.text(st.characters(blacklist_characters="/\\\x00"), min_size=1, max_size=30).filter(
        lambda s: s not in (".", "..")
    ),
    offset=st.integers(0, 2**64 - 1),
    uid=st.binary(min_size=16, max_size=16).filter(any),
    height=st.integers(1, 300),
)
def test_keys_parse_back(prefix: str, stream: str, offset: int, uid: bytes, height: int) -> None:
    assert parse_key(fragment_key(prefix, stream, offset), prefix) == FragmentKey(stream, offset)
    assert parse_key(root_key(prefix, stream, uid), prefix) == RootKey(stream, uid)
    key = branch_key(prefix, stream, offset, uid, height)
    assert parse_key(key, prefix) == BranchKey(stream, offset, uid, height)


@pytest.mark.parametrize(
    "key",
    [
        "tl/stream/s/data/123.fragment",
        "tl/stream/s/data/00000000000000000123.fragmentx",
        "tl/stream/s/metadata/root.00.manifest",
        "tl/stream/s/metadata/root.00112233445566778899AABBCCDDEEFF.manifest",
        "tl/stream/s/metadata/00000000000000000005.00112233445566778899aabbccddeeff.h2group",
        "tl/stream/s/metadata/00000000000000000005.00112233445566778899aabbccddeeff.h0group",
        "tl/stream/s/metadata/00000000000000000005.00000000000000000000000000000000.group",
        "tl/stream/s/other/00000000000000000123.fragment",
        "tl/stream/s/x/data/00000000000000000123.fragment",
        "other/stream/s/data/00000000000000000123.fragment",
        "tl/stream/s/data/99999999999999999999.fragment",
    ],
)
def test_bad_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidKeyError):
        parse_key(key, "tl")


def test_key_builders_reject_bad_input() -> None:
    for stream in ["", "a/b", ".", ".."]:
        with pytest.raises(InvalidKeyError):
            fragment_key("p", stream, 0)
    with pytest.raises(InvalidKeyError):
        fragment_key("p", "s", -1)
    with pytest.raises(InvalidKeyError):
        root_key("p", "s", b"short")
    with pytest.raises(InvalidKeyError):
        root_key("p", "s", bytes(16))
    with pytest.raises(InvalidKeyError):
        branch_kind(0)
    assert len(new_uid()) == 16 and new_uid() != new_uid()


# ----- append and fold ---------------------------------------------------------------------


def build(n: int, m: int, batch: int = 7) -> tuple[ManifestTree, Store, list[Frag]]:
    tree = ManifestTree("tl", STREAM, m=m, uid_factory=uid_factory())
    store = Store()
    all_frags = frags(0, [1 + (i % 5) for i in range(n)])
    for i in range(0, n, batch):
        for w in tree.append(all_frags[i : i + batch]):
            store.put_new(w.key, w.data)
    return tree, store, all_frags


def test_fold_rule_keeps_fewer_than_2m_per_height() -> None:
    tree, store, all_frags = build(1000, m=4)
    counts = tree.level_counts()
    assert all(c < 8 for c in counts)
    assert counts[0] >= 4  # folding leaves at least M fragments in the root
    # 1000 fragments: level sizes in base M, with 4..7 left per level
    assert sum(c * 4**h for h, c in enumerate(counts)) == 1000
    assert tree.height == len(counts) >= 4
    header = tree.header()
    assert (header.first_offset, header.next_offset) == (0, all_frags[-1].next_offset)
    assert header.total_fragments == 1000
    assert header.total_bytes == sum(f.data_size for f in all_frags)
    assert header.total_chunks == sum(f.chunk_count for f in all_frags)
    assert (header.min_timestamp, header.max_timestamp) == (1_000, all_frags[-1].max_timestamp)
    # every branch object is a valid node of exactly M entries of one height
    for data in store.values():
        node = decode_node(data)
        assert node.header.entry_count == 4
        assert set(node.entries["height"].tolist()) == {node.header.height - 1}
        assert node.header.stream_dir == STREAM


def test_no_fold_below_2m() -> None:
    tree, store, _ = build(7, m=4)
    assert tree.level_counts() == [7] and not store
    writes = tree.append(frags(tree.next_offset, [1]))
    assert len(writes) == 1 and tree.level_counts() == [4, 1]
    assert writes[0].entry.first_offset == 0 and writes[0].entry.fragment_count == 4


def test_one_large_append_folds_like_many_small_ones() -> None:
    small, _, all_frags = build(500, m=3, batch=1)
    big = ManifestTree("tl", STREAM, m=3, uid_factory=uid_factory())
    big.append(all_frags)
    assert big.level_counts() == small.level_counts()
    assert big.header() == small.header()
    fields = [f for f in ENTRY_DTYPE.names or () if f != "uid"]  # uids come in another order
    assert big.root_entries()[fields].tolist() == small.root_entries()[fields].tolist()


def test_gaps_and_overlaps_are_rejected_and_leave_the_tree_unchanged() -> None:
    tree, _, _ = build(10, m=4)
    before = tree.encode_root()
    nxt = tree.next_offset
    with pytest.raises(ManifestGapError):
        tree.append(frags(nxt + 1, [2]))  # gap
    with pytest.raises(ManifestGapError):
        tree.append(frags(nxt - 1, [2]))  # overlap
    with pytest.raises(ManifestGapError):
        tree.append([*frags(nxt, [2]), *frags(nxt + 3, [2])])  # gap inside the batch
    with pytest.raises(InvalidFragmentEntryError):
        tree.append([Frag(nxt, nxt + 2, 5, 4, 100, 1)])  # min ts > max ts
    with pytest.raises(InvalidFragmentEntryError):
        tree.append([Frag(nxt, nxt + 2, 5, 5, 100, 3)])  # more chunks than offsets
    with pytest.raises(ManifestGapError):
        tree.append([Frag(nxt, nxt, 5, 5, 100, 1)])  # empty range
    assert tree.encode_root() == before
    assert tree.append([]) == []


def test_empty_tree_starts_anywhere_at_or_after_its_next_offset() -> None:
    tree = ManifestTree("tl", STREAM, m=4, next_offset=100)
    with pytest.raises(ManifestGapError):
        tree.append(frags(99, [3]))  # would reuse a tiered offset
    tree.append(frags(150, [3]))
    assert (tree.first_offset, tree.next_offset) == (150, 153)
    with pytest.raises(ManifestGapError):
        tree.append(frags(160, [3]))  # non-empty: strictly contiguous


def test_root_round_trip_and_epoch() -> None:
    tree, _, _ = build(300, m=4)
    data = tree.encode_root(epoch=9)
    again = ManifestTree.from_root(data, "tl", m=4)
    assert again.epoch == 9 and again.level_counts() == tree.level_counts()
    assert again.encode_root() == data
    assert len(data) == tree.root_size() == node_size(tree.entry_count, STREAM)
    branch = next(iter(build(300, m=4)[1].values()))
    with pytest.raises(ManifestCorruptError):
        ManifestTree.from_root(branch, "tl")
    with pytest.raises(FormatError):
        ManifestTree.from_root(data[:-1], "tl")


# ----- lookups -----------------------------------------------------------------------------


def test_every_offset_locates_its_fragment_with_bounded_loads() -> None:
    tree, store, all_frags = build(400, m=3)
    tree = ManifestTree.from_root(tree.encode_root(), "tl", m=3, cache_nodes=0)
    for f in all_frags:
        for offset in (f.first_offset, f.next_offset - 1):
            loc = tree.locate_offset(offset, store.load)
            assert (loc.entry.first_offset, loc.next_offset) == (f.first_offset, f.next_offset)
            assert loc.entry.data_size == f.data_size
            assert loc.key == fragment_key("tl", STREAM, f.first_offset)
            assert loc.loads <= tree.height - 1
    oldest = tree.locate_offset(0, store.load)
    assert oldest.loads == tree.height - 1
    with pytest.raises(OffsetBeyondEndError):
        tree.locate_offset(tree.next_offset, store.load)


def test_timestamps_locate_the_first_fragment_not_older() -> None:
    tree, store, all_frags = build(200, m=3)
    for f in all_frags[::7]:
        loc = tree.locate_timestamp(f.max_timestamp, store.load)
        assert loc is not None
        expected = next(g for g in all_frags if g.max_timestamp >= f.max_timestamp)
        assert loc.entry.first_offset == expected.first_offset
    first = tree.locate_timestamp(-5, store.load)
    assert first is not None and first.entry.first_offset == 0
    assert tree.locate_timestamp(all_frags[-1].max_timestamp + 1, store.load) is None


def test_cache_avoids_repeated_loads() -> None:
    tree, store, _ = build(300, m=3)
    store.gets = 0
    tree.locate_offset(0, store.load)
    first = store.gets
    tree.locate_offset(1, store.load)
    assert first == tree.height - 1 and store.gets == first
    tree.clear_cache()
    tree.locate_offset(1, store.load)
    assert store.gets == 2 * first


def test_wrong_or_missing_branch_objects_are_detected() -> None:
    tree, store, _ = build(100, m=3)
    tree = ManifestTree.from_root(tree.encode_root(), "tl", m=3, cache_nodes=0)
    loaded: list[str] = []
    tree.locate_offset(0, lambda key: loaded.append(key) or store[key])
    group = loaded[-1]  # the height-1 group holding offset 0
    assert decode_node(store[group]).header.height == 1
    other = next(k for k in store if k != group and decode_node(store[k]).header.height == 1)
    swapped = Store(store)
    swapped[group] = store[other]
    with pytest.raises(ManifestCorruptError):
        tree.locate_offset(0, swapped.load)
    flipped = Store(store)
    flipped[group] = store[group][:-1] + bytes([store[group][-1] ^ 1])
    with pytest.raises(FormatError):
        tree.locate_offset(0, flipped.load)
    missing = Store(store)
    del missing[group]
    with pytest.raises(NotFoundError):
        tree.locate_offset(0, missing.load)


def test_iter_fragments_walks_everything_in_order() -> None:
    tree, store, all_frags = build(250, m=3)
    got = [(loc.entry.first_offset, loc.next_offset) for loc in tree.iter_fragments(store.load)]
    assert got == [(f.first_offset, f.next_offset) for f in all_frags]
    start = all_frags[101].first_offset + 1  # inside a fragment of span 2
    got = [loc.entry.first_offset for loc in tree.iter_fragments(store.load, start)]
    assert got == [f.first_offset for f in all_frags[101:]]


# ----- trimming ----------------------------------------------------------------------------


def test_trim_in_place_when_the_root_has_no_branches() -> None:
    tree, store, all_frags = build(6, m=4)
    result = tree.trim_front(all_frags[2].first_offset + 1, store.load)
    assert not result.writes and result.loads == 0
    assert result.deletes == [fragment_key("tl", STREAM, f.first_offset) for f in all_frags[:2]]
    assert tree.first_offset == all_frags[2].first_offset
    assert result.removed_fragments == 2
    assert result.removed_bytes == all_frags[0].data_size + all_frags[1].data_size
    with pytest.raises(OffsetOvertakenError):
        tree.locate_offset(all_frags[1].first_offset, store.load)
    assert tree.trim_front(0, store.load).deletes == []  # nothing below the first offset


def test_trim_through_branches() -> None:
    tree, store, all_frags = build(300, m=3)
    cut = all_frags[137].first_offset + 1
    result = tree.trim_front(cut, store.load)
    assert result.writes and result.loads > 0
    for w in result.writes:
        store.put_new(w.key, w.data)
    removed = {fragment_key("tl", STREAM, f.first_offset) for f in all_frags[:137]}
    deleted_fragments = {k for k in result.deletes if k.endswith(".fragment")}
    assert deleted_fragments == removed
    for key in result.deletes:
        store.pop(key, None)
    tree = ManifestTree.from_root(tree.encode_root(), "tl", m=3, cache_nodes=0)
    got = [(loc.entry.first_offset, loc.next_offset) for loc in tree.iter_fragments(store.load)]
    assert got == [(f.first_offset, f.next_offset) for f in all_frags[137:]]
    assert tree.header().total_fragments == 300 - 137
    # Appending keeps working after a trim.
    more = frags(tree.next_offset, [2] * 50)
    for w in tree.append(more):
        store.put_new(w.key, w.data)
    assert (
        tree.locate_offset(more[-1].first_offset, store.load).entry.first_offset
        == more[-1].first_offset
    )


def test_trim_everything() -> None:
    tree, store, all_frags = build(50, m=3)
    result = tree.trim_front(10**9, store.load)
    assert tree.is_empty and tree.first_offset == tree.next_offset == all_frags[-1].next_offset
    assert len([k for k in result.deletes if k.endswith(".fragment")]) == 50
    assert {k for k in result.deletes if not k.endswith(".fragment")} == set(store)
    tree.append(frags(tree.next_offset, [1]))
    assert tree.first_offset == all_frags[-1].next_offset


# ----- the stateful machine ----------------------------------------------------------------


class ManifestMachine(RuleBasedStateMachine):
    """Random appends, folds, trims, lookups and root reloads against a flat model."""

    def __init__(self) -> None:
        super().__init__()
        self.m = 2
        self.tree: ManifestTree | None = None
        self.store = Store()
        self.model: list[Frag] = []  # live fragments, oldest first
        self.next_offset = 0
        self.ts = 0

    @rule(m=st.integers(2, 4), start=st.integers(0, 1000))
    @precondition(lambda self: self.tree is None)
    def create(self, m: int, start: int) -> None:
        self.m = m
        self.tree = ManifestTree("tl", STREAM, m=m, next_offset=start, cache_nodes=3)
        self.next_offset = start

    @rule(spans=st.lists(st.integers(1, 9), min_size=1, max_size=12))
    @precondition(lambda self: self.tree is not None)
    def append(self, spans: list[int]) -> None:
        assert self.tree is not None
        batch = frags(self.next_offset, spans, self.ts)
        for w in self.tree.append(batch):
            self.store.put_new(w.key, w.data)
        self.model.extend(batch)
        self.next_offset, self.ts = batch[-1].next_offset, batch[-1].max_timestamp

    @rule(delta=st.integers(1, 5))
    @precondition(lambda self: self.tree is not None)
    def append_with_gap_is_rejected(self, delta: int) -> None:
        assert self.tree is not None
        if not self.model:
            return  # an empty tree may start later
        with pytest.raises(ManifestGapError):
            self.tree.append(frags(self.next_offset + delta, [1]))

    @rule(data=st.data())
    @precondition(lambda self: self.tree is not None and len(self.model) > 0)
    def trim(self, data: st.DataObject) -> None:
        assert self.tree is not None
        cut = data.draw(st.integers(self.model[0].first_offset, self.next_offset + 2))
        result = self.tree.trim_front(cut, self.store.load)
        for w in result.writes:
            self.store.put_new(w.key, w.data)
        kept = [f for f in self.model if f.next_offset > cut]
        gone = {
            fragment_key("tl", STREAM, f.first_offset)
            for f in self.model[: len(self.model) - len(kept)]
        }
        assert {k for k in result.deletes if k.endswith(".fragment")} == gone
        for key in result.deletes:  # superseded objects really go away
            if not key.endswith(".fragment"):
                del self.store[key]
        self.model = kept

    @rule()
    @precondition(lambda self: self.tree is not None)
    def reload_root(self) -> None:
        assert self.tree is not None
        data = self.tree.encode_root()
        self.tree = ManifestTree.from_root(data, "tl", m=self.m, cache_nodes=2)
        assert self.tree.encode_root() == data

    @rule(data=st.data())
    @precondition(lambda self: self.tree is not None and len(self.model) > 0)
    def locate(self, data: st.DataObject) -> None:
        assert self.tree is not None
        f = data.draw(st.sampled_from(self.model))
        offset = data.draw(st.integers(f.first_offset, f.next_offset - 1))
        loc = self.tree.locate_offset(offset, self.store.load)
        assert (loc.entry.first_offset, loc.next_offset) == (f.first_offset, f.next_offset)
        assert loc.loads <= self.tree.height - 1
        by_ts = self.tree.locate_timestamp(f.min_timestamp, self.store.load)
        assert by_ts is not None
        expected = next(g for g in self.model if g.max_timestamp >= f.min_timestamp)
        assert by_ts.entry.first_offset == expected.first_offset

    @invariant()
    def covers_exactly_the_model(self) -> None:
        if self.tree is None:
            return
        tree = self.tree
        header = tree.header()
        assert header.next_offset == self.next_offset
        if self.model:
            assert header.first_offset == self.model[0].first_offset
            assert header.total_bytes == sum(f.data_size for f in self.model)
            assert header.total_chunks == sum(f.chunk_count for f in self.model)
            assert header.total_fragments == len(self.model)
            assert header.min_timestamp == self.model[0].min_timestamp
            assert header.max_timestamp == self.model[-1].max_timestamp
        else:
            assert tree.is_empty and header.first_offset == self.next_offset
        walked = [
            (loc.entry.first_offset, loc.next_offset)
            for loc in tree.iter_fragments(self.store.load)
        ]
        assert walked == [(f.first_offset, f.next_offset) for f in self.model]
        # no gap, no overlap
        assert all(a[1] == b[0] for a, b in itertools.pairwise(walked))

    @invariant()
    def root_stays_small(self) -> None:
        if self.tree is None:
            return
        counts = self.tree.level_counts()
        assert all(c < 2 * self.m for c in counts)
        assert self.tree.root_size() <= node_size((2 * self.m - 1) * max(len(counts), 1), STREAM)
        heights = self.tree.root_entries()["height"]
        assert bool(np.all(heights[1:] <= heights[:-1]))


TestManifestMachine = ManifestMachine.TestCase
TestManifestMachine.settings = settings(stateful_step_count=40, deadline=None)


def test_entry_dtype_is_native() -> None:
    assert ENTRY_DTYPE.isnative


def test_fragment_trailers_append_directly() -> None:
    """The trailer decoded from an uploaded fragment is what the tree appends."""

    trailers = []
    for seq in range(3):
        offset = seq
        data = struct.pack(">I", 1) + b"x"
        crc = zlib.crc32(data)
        header = struct.pack(">BBHIqQQIIIB3x", 0x50, 0, 1, 1, 10 + seq, 1, offset, crc, 5, 0, 0)
        info = FragmentChunkInfo(offset, 10 + seq, 1, len(header) + 5, 1, crc)
        parts, _ = encode_fragment(FragmentPlacement(seq, 0, 8), [header + data], [info])
        trailers.append(decode_trailer(b"".join(parts)))
    tree = ManifestTree("tl", STREAM, m=4)
    tree.append(trailers)
    assert (tree.first_offset, tree.next_offset, tree.header().total_bytes) == (0, 3, 3 * 53)
    assert tree.locate_offset(2, Store().load).entry.min_timestamp == 12
