"""The M-way manifest tree: the cached root, folding, lookups and front trimming.

Pure logic: it never does I/O. New branch objects come back as ``BranchWrite`` effects that
the commit protocol must write *before* the root that names them; lookups take a ``load``
function (key -> bytes) for branch nodes and keep decoded branches in a bounded LRU.

Fold rule: when the root holds 2M entries of one height, the oldest M of them become one
branch object of the next height, repeated upward with no cap on the height. Root entries stay
sorted by offset with non-increasing heights (oldest, highest first), so each height is one
contiguous run, kept here as one numpy array per height.
"""

from __future__ import annotations

import uuid as uuid_module
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

import numpy as np

from tierlog.formats.manifest import (
    ENTRY_DTYPE,
    ENTRY_FRAGMENT,
    ENTRY_SEGMENT,
    KIND_BRANCH,
    KIND_ROOT,
    ManifestEntry,
    ManifestNode,
    NodeHeader,
    decode_node,
    encode_node,
    entry_at,
    entry_next_offset,
    find_offset,
    find_timestamp,
    node_size,
    summarize,
)
from tierlog.remote.errors import (
    InvalidFragmentEntryError,
    ManifestCorruptError,
    ManifestGapError,
    OffsetBeyondEndError,
    OffsetOvertakenError,
)
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.keys import branch_key, fragment_key, new_uid, segment_data_key
from tierlog.remote.manifest_walk import Bounds, Loader, ManifestWalker, read_branch

DEFAULT_M = 1024
DEFAULT_CACHE_NODES = 64


class FragmentSpan(Protocol):
    """What the tree needs to know about a fragment (``FragmentTrailer`` has these fields)."""

    @property
    def first_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def min_timestamp(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def data_size(self) -> int: ...
    @property
    def chunk_count(self) -> int: ...


@dataclass(frozen=True, slots=True)
class BranchWrite:
    """A new branch object to write (create-only) before the root that names it."""

    key: str
    data: bytes
    entry: ManifestEntry


@dataclass(frozen=True, slots=True)
class FragmentLocation:
    """A located fragment and the branch loads the lookup took."""

    entry: FragmentEntry
    loads: int

    @property
    def next_offset(self) -> int:
        return self.entry.next_offset

    @property
    def key(self) -> str:
        return self.entry.key


@dataclass(slots=True)
class TrimResult:
    """Effects of ``trim_front``: write ``writes`` before the new root; then delete (after the
    commit, through the pending-deletion list) every key in ``deletes``."""

    writes: list[BranchWrite] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    removed_fragments: int = 0
    removed_bytes: int = 0
    loads: int = 0


class ManifestTree:
    """The in-memory root of one stream's manifest tree."""

    def __init__(
        self,
        prefix: str,
        stream_dir: str,
        *,
        m: int = DEFAULT_M,
        epoch: int = 1,
        next_offset: int = 0,
        cache_nodes: int = DEFAULT_CACHE_NODES,
        uid_factory: Callable[[], bytes] = new_uid,
    ) -> None:
        if m < 2:
            raise ValueError(f"branching factor m must be >= 2, got {m}")
        self.prefix = prefix
        self.stream_dir = stream_dir
        self.m = m
        self.epoch = epoch
        self._next_offset = next_offset
        self._levels: list[np.ndarray] = []  # index = height
        self._buf = self._empty()  # level 0 is always self._buf[: self._fill]
        self._fill = 0
        self._root: np.ndarray | None = np.zeros(0, dtype=ENTRY_DTYPE)
        self._cache: OrderedDict[str, ManifestNode] = OrderedDict()
        self._cache_nodes = cache_nodes
        self._uid_factory = uid_factory
        self.sealed = False
        """Read from a pointer saying the manifest is sealed (see ``from_root``)."""

    # ----- construction and encoding -------------------------------------------------------

    @classmethod
    def from_root(
        cls,
        data: bytes | bytearray | memoryview,
        prefix: str,
        *,
        m: int = DEFAULT_M,
        cache_nodes: int = DEFAULT_CACHE_NODES,
        uid_factory: Callable[[], bytes] = new_uid,
        sealed: bool = False,
    ) -> ManifestTree:
        """Rebuild the cached root from an encoded root object (checked while decoding).
        ``sealed``: its pointer says the manifest is sealed, so branches and offloaded
        segment indexes read through the tree must be sealed too."""
        node = decode_node(data)
        h = node.header
        if h.kind != KIND_ROOT:
            raise ManifestCorruptError("expected a root node, got a branch")
        tree = cls(
            prefix,
            h.stream_dir,
            m=m,
            epoch=h.epoch,
            next_offset=h.next_offset,
            cache_nodes=cache_nodes,
            uid_factory=uid_factory,
        )
        tree._set_root(node.entries)
        tree.sealed = sealed
        return tree

    def header(self, epoch: int | None = None) -> NodeHeader:
        e = self.epoch if epoch is None else epoch
        return summarize(KIND_ROOT, e, self.stream_dir, self.root_entries(), self._next_offset)

    def encode_root(self, epoch: int | None = None) -> bytes:
        """The root object's bytes (the caller names it ``root.{fresh uid}.manifest``)."""
        return encode_node(self.header(epoch), self.root_entries())

    def root_size(self) -> int:
        """Encoded size of the root, without encoding it."""
        return node_size(self.entry_count, self.stream_dir)

    # ----- state ---------------------------------------------------------------------------

    def root_entries(self) -> np.ndarray:
        """All root entries, oldest first (a cached array: do not modify)."""
        if self._root is None:
            self._root = np.concatenate(self._levels[::-1]) if self._levels else self._empty()
        return self._root

    @property
    def entry_count(self) -> int:
        return sum(len(level) for level in self._levels)

    @property
    def height(self) -> int:
        """1 + highest root entry height; 0 for an empty tree, 1 when only fragments."""
        return len(self._levels)

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def first_offset(self) -> int:
        entries = self.root_entries()
        return int(entries["first_offset"][0]) if len(entries) else self._next_offset

    @property
    def is_empty(self) -> bool:
        return self.entry_count == 0

    def level_counts(self) -> list[int]:
        """Number of root entries per height (index = height)."""
        return [len(level) for level in self._levels]

    # ----- append and fold -----------------------------------------------------------------

    def append(self, fragments: Sequence[FragmentSpan]) -> list[BranchWrite]:
        """Append a contiguous run of new fragments; return the branch objects folding made."""
        if not fragments:
            return []
        for a, b in pairwise(fragments):
            if a.next_offset != b.first_offset:
                raise ManifestGapError(
                    f"fragment ending at {a.next_offset} followed by one at {b.first_offset}"
                )
        arr = np.zeros(len(fragments), dtype=ENTRY_DTYPE)
        arr["first_offset"] = [f.first_offset for f in fragments]
        arr["min_timestamp"] = [f.min_timestamp for f in fragments]
        arr["max_timestamp"] = [f.max_timestamp for f in fragments]
        arr["data_size"] = [f.data_size for f in fragments]
        arr["chunk_count"] = [f.chunk_count for f in fragments]
        arr["fragment_count"] = 1
        for i, f in enumerate(fragments):
            kind = getattr(f, "entry_kind", ENTRY_FRAGMENT)
            if kind != ENTRY_FRAGMENT:
                arr["entry_kind"][i] = kind
                arr["uid"][i] = np.frombuffer(f.uid, dtype=np.uint8)  # type: ignore[attr-defined]
        return self.append_array(arr, fragments[-1].next_offset)

    def append_array(self, entries: np.ndarray, next_offset: int) -> list[BranchWrite]:
        """Fast path of ``append``: fragment entries (``ENTRY_DTYPE``, height 0) ending at
        ``next_offset``. The tree is unchanged when this raises."""
        if len(entries) == 0:
            return []
        if entries.dtype != ENTRY_DTYPE:
            raise InvalidFragmentEntryError(
                f"entries must have dtype ENTRY_DTYPE, got {entries.dtype}"
            )
        firsts = entries["first_offset"]
        start = int(firsts[0])
        if start != self._next_offset and not (self.is_empty and start > self._next_offset):
            raise ManifestGapError(
                f"fragments start at {start}, the manifest continues at {self._next_offset}"
            )
        nexts = np.append(firsts[1:], np.uint64(next_offset))
        if next_offset <= int(firsts[-1]) or not bool(np.all(firsts[1:] > firsts[:-1])):
            raise ManifestGapError("fragment offsets must be strictly ascending")
        chunks = entries["chunk_count"]
        kinds = entries["entry_kind"]
        fragment = kinds == ENTRY_FRAGMENT
        if not (
            bool(np.all(entries["height"] == 0))
            and bool(np.all(fragment | (kinds == ENTRY_SEGMENT)))
            and bool(np.all(entries["uid"].any(axis=1) != fragment))
            and bool(np.all(entries["fragment_count"] == 1))
            and bool(np.all((chunks >= 1) & (chunks <= nexts - firsts)))
            and bool(np.all(entries["data_size"] >= chunks))
            and bool(np.all(entries["min_timestamp"] <= entries["max_timestamp"]))
        ):
            raise InvalidFragmentEntryError("fragment entries malformed")
        self._push_fragments(entries)
        self._next_offset = next_offset
        self._root = None
        return self._fold()

    def _fold(self) -> list[BranchWrite]:
        writes: list[BranchWrite] = []
        m = self.m
        h = 0
        while h < len(self._levels):
            level = self._levels[h]
            if len(level) >= 2 * m:
                folds = (len(level) - m) // m  # leaves between M and 2M - 1 entries
                new = np.zeros(folds, dtype=ENTRY_DTYPE)
                for k in range(folds):
                    group = level[k * m : (k + 1) * m]
                    next_offset = int(level["first_offset"][(k + 1) * m])
                    write = self._make_branch(group, next_offset, h + 1)
                    writes.append(write)
                    new[k] = _entry_row(write.entry)
                if h == 0:
                    self._set_level0(level[folds * m :])
                else:
                    self._levels[h] = level[folds * m :].copy()
                if h + 1 == len(self._levels):
                    self._levels.append(self._empty())
                self._levels[h + 1] = np.concatenate((self._levels[h + 1], new))
            h += 1
        return writes

    def _make_branch(self, children: np.ndarray, next_offset: int, height: int) -> BranchWrite:
        uid = self._uid_factory()
        header = summarize(KIND_BRANCH, self.epoch, self.stream_dir, children, next_offset)
        entry = ManifestEntry(
            first_offset=header.first_offset,
            min_timestamp=header.min_timestamp,
            max_timestamp=header.max_timestamp,
            data_size=header.total_bytes,
            chunk_count=header.total_chunks,
            fragment_count=header.total_fragments,
            height=height,
            uid=uid,
        )
        key = branch_key(self.prefix, self.stream_dir, header.first_offset, uid, height)
        return BranchWrite(key, encode_node(header, children), entry)

    # ----- lookups -------------------------------------------------------------------------

    def locate_offset(self, offset: int, load: Loader) -> FragmentLocation:
        """The fragment holding ``offset``: binary search from the root down."""
        if offset < self.first_offset:
            raise OffsetOvertakenError(offset, self.first_offset)
        if offset >= self._next_offset:
            raise OffsetBeyondEndError(f"offset {offset} is at or past {self._next_offset}")
        entries, node_next, loads = self.root_entries(), self._next_offset, 0
        while True:
            i = find_offset(entries, offset)
            entry = entry_at(entries, i)
            nxt = entry_next_offset(entries, i, node_next)
            if entry.height == 0:
                return FragmentLocation(self._fragment(entry, nxt), loads)
            node, loaded = self._branch(entry, nxt, load)
            loads += loaded
            entries, node_next = node.entries, node.header.next_offset

    def locate_timestamp(self, timestamp: int, load: Loader) -> FragmentLocation | None:
        """The first fragment with a chunk at or after ``timestamp``; None if all are older.

        Timestamps never decrease within a stream, so max timestamps are sorted.
        """
        entries, node_next, loads = self.root_entries(), self._next_offset, 0
        while True:
            i = find_timestamp(entries, timestamp)
            if i >= len(entries):
                if loads:
                    raise ManifestCorruptError("branch max timestamp below its parent entry's")
                return None
            entry = entry_at(entries, i)
            nxt = entry_next_offset(entries, i, node_next)
            if entry.height == 0:
                return FragmentLocation(self._fragment(entry, nxt), loads)
            node, loaded = self._branch(entry, nxt, load)
            loads += loaded
            entries, node_next = node.entries, node.header.next_offset

    def iter_fragments(self, load: Loader, start_offset: int = 0) -> Iterator[FragmentLocation]:
        """Every fragment whose range ends after ``start_offset``, in offset order."""
        for entry in self.walker(load, Bounds(min_offset=start_offset)).walk(
            self.root_entries(), self._next_offset
        ):
            yield FragmentLocation(entry, 0)

    def walker(self, load: Loader, bounds: Bounds = Bounds()) -> ManifestWalker:
        """A walk of this tree within ``bounds``, reading branches through its cache."""
        return ManifestWalker(
            self.prefix,
            self.stream_dir,
            load,
            bounds,
            branch=lambda entry, nxt: self._branch(entry, nxt, load)[0],
            require_sealed=self.sealed,
        )

    def _fragment(self, entry: ManifestEntry, next_offset: int) -> FragmentEntry:
        if entry.entry_kind == ENTRY_SEGMENT:
            key = segment_data_key(
                self.prefix, self.stream_dir, entry.first_offset, uuid_module.UUID(bytes=entry.uid)
            )
        else:
            key = fragment_key(self.prefix, self.stream_dir, entry.first_offset)
        return FragmentEntry(
            key=key,
            first_offset=entry.first_offset,
            next_offset=next_offset,
            min_timestamp=entry.min_timestamp,
            max_timestamp=entry.max_timestamp,
            data_size=entry.data_size,
            chunk_count=entry.chunk_count,
            entry_kind=entry.entry_kind,
            uid=entry.uid,
        )

    def branch_key_of(self, entry: ManifestEntry) -> str:
        return branch_key(self.prefix, self.stream_dir, entry.first_offset, entry.uid, entry.height)

    def clear_cache(self) -> None:
        self._cache.clear()

    def _branch(
        self, entry: ManifestEntry, next_offset: int, load: Loader
    ) -> tuple[ManifestNode, int]:
        """The branch node ``entry`` points to (cached), checked against the entry."""
        key = self.branch_key_of(entry)
        node = self._cache.get(key)
        if node is not None:
            self._cache.move_to_end(key)
            return node, 0
        node = read_branch(
            load, key, entry, self.stream_dir, next_offset, require_sealed=self.sealed
        )
        if self._cache_nodes > 0:
            self._cache[key] = node
            while len(self._cache) > self._cache_nodes:
                self._cache.popitem(last=False)
        return node, 1

    # ----- retention -----------------------------------------------------------------------

    def trim_front(self, offset: int, load: Loader) -> TrimResult:
        """Remove every fragment that ends at or before ``offset`` (whole fragments only).

        In place when the root holds the fragments; otherwise the straddling branch (and its
        straddling descendants) are rewritten under new uids as ``writes``, and every removed
        fragment and superseded branch goes to ``deletes`` (children before parents).
        """
        result = TrimResult()
        entries = self.root_entries()
        if offset <= self.first_offset or not len(entries):
            return result
        before = self.header()
        kept = self._trim_entries(entries, self._next_offset, offset, load, result)
        self._set_root(kept)
        after = self.header()
        result.removed_fragments = before.total_fragments - after.total_fragments
        result.removed_bytes = before.total_bytes - after.total_bytes
        return result

    def _trim_entries(
        self, entries: np.ndarray, node_next: int, offset: int, load: Loader, result: TrimResult
    ) -> np.ndarray:
        """Entries that survive trimming below ``offset`` (a new array)."""
        j = 0
        while j < len(entries) and entry_next_offset(entries, j, node_next) <= offset:
            self._delete_subtree(
                entry_at(entries, j), entry_next_offset(entries, j, node_next), load, result
            )
            j += 1
        kept = entries[j:].copy()
        if len(kept) and int(kept["height"][0]) > 0 and int(kept["first_offset"][0]) < offset:
            entry = entry_at(kept, 0)
            new_entry = self._trim_branch(
                entry, entry_next_offset(kept, 0, node_next), offset, load, result
            )
            kept[0] = _entry_row(new_entry)
        return kept

    def _trim_branch(
        self, entry: ManifestEntry, next_offset: int, offset: int, load: Loader, result: TrimResult
    ) -> ManifestEntry:
        node, loaded = self._branch(entry, next_offset, load)
        result.loads += loaded
        kept = self._trim_entries(node.entries, next_offset, offset, load, result)
        write = self._make_branch(kept, next_offset, entry.height)
        result.writes.append(write)
        old_key = self.branch_key_of(entry)
        result.deletes.append(old_key)
        self._cache.pop(old_key, None)
        return write.entry

    def _delete_subtree(
        self, entry: ManifestEntry, next_offset: int, load: Loader, result: TrimResult
    ) -> None:
        if entry.height == 0:
            result.deletes.extend(self._fragment(entry, next_offset).object_keys)
            return
        node, loaded = self._branch(entry, next_offset, load)
        result.loads += loaded
        children = node.entries
        for i in range(len(children)):
            child_next = entry_next_offset(children, i, next_offset)
            self._delete_subtree(entry_at(children, i), child_next, load, result)
        key = self.branch_key_of(entry)
        result.deletes.append(key)
        self._cache.pop(key, None)

    # ----- helpers -------------------------------------------------------------------------

    def _set_root(self, entries: np.ndarray) -> None:
        heights = entries["height"]
        top = int(heights.max()) + 1 if len(entries) else 0
        self._levels = [entries[heights == h].copy() for h in range(top)]
        if self._levels:
            self._set_level0(self._levels[0])
        self._root = entries.copy()

    def _set_level0(self, fragments: np.ndarray) -> None:
        """Root fragments live at the front of a buffer with room for appends, so a commit
        copies only its new entries (not the whole root). The room is twice the entries
        (appends double it): a node's thousands of small streams do not each hold room
        for a full root (2M entries, ~128 KiB)."""
        n = len(fragments)
        capacity = max(16, 2 * n)
        if len(self._buf) < capacity or len(self._buf) > 4 * capacity:
            buf = np.zeros(capacity, dtype=ENTRY_DTYPE)
            buf[:n] = fragments
            self._buf = buf
        else:
            self._buf[:n] = fragments  # numpy copes with the overlap of a view of _buf
        self._fill = n
        self._levels[0] = self._buf[:n]

    def _push_fragments(self, entries: np.ndarray) -> None:
        if not self._levels:
            self._levels.append(self._empty())
            self._set_level0(self._levels[0])
        n, fill = len(entries), self._fill
        if fill + n > len(self._buf):
            buf = np.zeros(max(2 * len(self._buf), fill + n), dtype=ENTRY_DTYPE)
            buf[:fill] = self._buf[:fill]
            self._buf = buf
        self._buf[fill : fill + n] = entries
        self._fill = fill + n
        self._levels[0] = self._buf[: self._fill]

    @staticmethod
    def _empty() -> np.ndarray:
        return np.zeros(0, dtype=ENTRY_DTYPE)


def _entry_row(entry: ManifestEntry) -> tuple[object, ...]:
    return (
        entry.first_offset,
        entry.min_timestamp,
        entry.max_timestamp,
        entry.data_size,
        entry.chunk_count,
        entry.fragment_count,
        np.frombuffer(entry.uid, dtype=np.uint8),
        entry.height,
        entry.entry_kind,
    )
