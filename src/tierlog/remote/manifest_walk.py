"""The one walk of a manifest tree: top-down, pruned by bounds, every branch checked.

Every branch node is loaded by its key and checked against the entry that names it (kind,
height, stream, offsets, timestamps, bytes, chunks, fragments) before anything below it is
trusted. Entries are tested a whole node at a time (numpy), so a bounded walk descends
only into branches whose offset and timestamp ranges overlap the bounds. The tree's
lookups, retention, the cross-tier reader, Spark planning and the Spark jobs all walk
through here; a tolerant walk (the scrub and GC jobs) records what is wrong and goes on.
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from tierlog.formats.errors import FormatError
from tierlog.formats.manifest import (
    ENTRY_SEGMENT,
    KIND_BRANCH,
    ManifestEntry,
    ManifestNode,
    NodeHeader,
    decode_node,
    entry_at,
)
from tierlog.remote.errors import ManifestCorruptError
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.keys import branch_key, fragment_keys, segment_data_key
from tierlog.remote.sealing import open_object
from tierlog.storage.errors import NotFoundError

Loader = Callable[[str], bytes]
BranchReader = Callable[[ManifestEntry, int], ManifestNode]
"""``(entry, its next offset) -> the checked branch node it names``."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """Inclusive bounds on record offset and chunk timestamp (ms); None means unbounded."""

    min_offset: int | None = None
    max_offset: int | None = None
    min_ts: int | None = None
    max_ts: int | None = None

    def intersect(self, other: Bounds) -> Bounds:
        return Bounds(
            _max(self.min_offset, other.min_offset),
            _min(self.max_offset, other.max_offset),
            _max(self.min_ts, other.min_ts),
            _min(self.max_ts, other.max_ts),
        )

    @property
    def is_empty(self) -> bool:
        return (
            self.min_offset is not None
            and self.max_offset is not None
            and self.min_offset > self.max_offset
        ) or (self.min_ts is not None and self.max_ts is not None and self.min_ts > self.max_ts)

    def covers(self, fragment: FragmentEntry) -> bool:
        """True when every record of ``fragment`` is inside the bounds (no row filter)."""
        return (
            (self.min_offset is None or self.min_offset <= fragment.first_offset)
            and (self.max_offset is None or self.max_offset >= fragment.next_offset - 1)
            and (self.min_ts is None or self.min_ts <= fragment.min_timestamp)
            and (self.max_ts is None or self.max_ts >= fragment.max_timestamp)
        )


def branch_mismatch(h: NodeHeader, e: ManifestEntry, stream_dir: str, next_offset: int) -> str:
    """How a branch node's header contradicts the entry naming it ("" when it does not)."""
    expected = {
        "kind": KIND_BRANCH,
        "height": e.height,
        "stream": stream_dir,
        "first_offset": e.first_offset,
        "next_offset": next_offset,
        "min_timestamp": e.min_timestamp,
        "max_timestamp": e.max_timestamp,
        "bytes": e.data_size,
        "chunks": e.chunk_count,
        "fragments": e.fragment_count,
    }
    actual = {
        "kind": h.kind,
        "height": h.height,
        "stream": h.stream_dir,
        "first_offset": h.first_offset,
        "next_offset": h.next_offset,
        "min_timestamp": h.min_timestamp,
        "max_timestamp": h.max_timestamp,
        "bytes": h.total_bytes,
        "chunks": h.total_chunks,
        "fragments": h.total_fragments,
    }
    diffs = [f"{k}: node {actual[k]} != entry {v}" for k, v in expected.items() if actual[k] != v]
    return "; ".join(diffs)


def read_branch(
    load: Loader,
    key: str,
    entry: ManifestEntry,
    stream_dir: str,
    next_offset: int,
    *,
    require_sealed: bool = False,
) -> ManifestNode:
    """Load and decode the branch ``key`` and check it against ``entry``.

    Raises the loader's errors (NotFoundError), FormatError for bad bytes (and for a
    plaintext branch where ``require_sealed``: a manifest sealed since its first commit)
    and ManifestCorruptError when the node contradicts its entry."""
    node = decode_node(open_object(key, load(key), require_sealed=require_sealed))
    mismatch = branch_mismatch(node.header, entry, stream_dir, next_offset)
    if mismatch:
        raise ManifestCorruptError(f"branch {key} does not match its entry: {mismatch}", mismatch)
    return node


@dataclass(frozen=True, slots=True)
class WalkProblem:
    """Something a tolerant walk found wrong: ``missing-branch``, ``corrupt-branch`` or
    ``branch-mismatch``, with the branch key and a detail."""

    kind: str
    key: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "key": self.key, "detail": self.detail}


@dataclass
class ManifestWalker:
    """Walks one stream's tree from a node's entries down to its fragments.

    ``branch`` reads a checked branch node (a cache may sit in it; by default every branch
    is loaded with ``load``). With ``tolerant`` a branch that is missing, corrupt or
    contradicts its entry is recorded in ``problems`` and skipped; otherwise its error
    propagates."""

    prefix: str
    stream_dir: str
    load: Loader
    bounds: Bounds = Bounds()
    branch: BranchReader | None = None
    tolerant: bool = False
    require_sealed: bool = False
    loads: int = 0
    branch_keys: list[str] = field(default_factory=list)
    problems: list[WalkProblem] = field(default_factory=list)

    def walk(self, entries: np.ndarray, node_next: int) -> Iterator[FragmentEntry]:
        """Every fragment below ``entries`` (a node ending at ``node_next``) that may hold
        a record inside the bounds, in offset order."""
        if not len(entries):
            return
        first = entries["first_offset"].astype(np.int64)
        nexts = np.append(first[1:], np.int64(node_next))
        keep = np.ones(len(entries), dtype=bool)
        b = self.bounds
        if b.min_offset is not None:
            keep &= nexts > b.min_offset
        if b.max_offset is not None:
            keep &= first <= b.max_offset
        if b.min_ts is not None:
            keep &= entries["max_timestamp"] >= b.min_ts
        if b.max_ts is not None:
            keep &= entries["min_timestamp"] <= b.max_ts
        rows = np.flatnonzero(keep)
        heights = entries["height"][rows].tolist()
        firsts = first[rows].tolist()
        ends = nexts[rows].tolist()
        min_ts = entries["min_timestamp"][rows].tolist()
        max_ts = entries["max_timestamp"][rows].tolist()
        sizes = entries["data_size"][rows].tolist()
        chunks = entries["chunk_count"][rows].tolist()
        kinds = entries["entry_kind"][rows].tolist()
        names = fragment_keys(self.prefix, self.stream_dir, firsts)
        for j, i in enumerate(rows.tolist()):
            if heights[j] == 0:
                if kinds[j] == ENTRY_SEGMENT:
                    uid = entries["uid"][i].tobytes()
                    key = segment_data_key(
                        self.prefix, self.stream_dir, firsts[j], uuid_module.UUID(bytes=uid)
                    )
                    yield FragmentEntry(
                        key, firsts[j], ends[j], min_ts[j], max_ts[j], sizes[j], chunks[j],
                        ENTRY_SEGMENT, uid,
                    )  # fmt: skip
                    continue
                yield FragmentEntry(
                    names[j], firsts[j], ends[j], min_ts[j], max_ts[j], sizes[j], chunks[j]
                )
                continue
            node = self._read(entry_at(entries, i), ends[j])
            if node is not None:
                yield from self.walk(node.entries, ends[j])

    def _read(self, entry: ManifestEntry, next_offset: int) -> ManifestNode | None:
        key = branch_key(self.prefix, self.stream_dir, entry.first_offset, entry.uid, entry.height)
        self.branch_keys.append(key)
        self.loads += 1
        try:
            if self.branch is not None:
                return self.branch(entry, next_offset)
            return read_branch(
                self.load,
                key,
                entry,
                self.stream_dir,
                next_offset,
                require_sealed=self.require_sealed,
            )
        except NotFoundError:
            if not self.tolerant:
                raise
            self.problems.append(WalkProblem("missing-branch", key, "referenced branch is missing"))
        except FormatError as exc:
            if not self.tolerant:
                raise
            self.problems.append(WalkProblem("corrupt-branch", key, str(exc)))
        except ManifestCorruptError as exc:
            if not self.tolerant:
                raise
            self.problems.append(WalkProblem("branch-mismatch", key, exc.detail))
        return None


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
