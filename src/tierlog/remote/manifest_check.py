"""A checked walk of one stream incarnation's committed manifest tree: everything reachable
from the root its pointer names, and what was wrong on the way.

Garbage collection (the server's and ``tierlog spark gc``) needs the complete set of keys a
committed manifest references before it may call anything else garbage; scrub and the key
index job walk the same way. One home, below the server and Spark, so both use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierlog.formats.errors import FormatError
from tierlog.formats.manifest import KIND_ROOT, decode_node
from tierlog.remote import keys
from tierlog.remote.catalog import Catalog, ManifestPointer
from tierlog.remote.committed import read_committed_root
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.manifest_walk import ManifestWalker
from tierlog.storage.errors import TransientError
from tierlog.storage.object_store import ObjectStore


@dataclass
class ManifestWalk:
    """Everything reachable from one committed root, and what was wrong on the way."""

    pointer: ManifestPointer | None
    root_key: str | None = None
    first_offset: int = 0
    next_offset: int = 0
    branch_keys: list[str] = field(default_factory=list)
    fragments: list[FragmentEntry] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when the whole tree was read without a problem."""
        return not self.problems

    def referenced(self) -> set[str]:
        out = {key for f in self.fragments for key in f.object_keys}  # segments: data + index
        out.update(self.branch_keys)
        if self.root_key:
            out.add(self.root_key)
        return out


def walk_manifest(
    store: ObjectStore, catalog: Catalog, prefix: str, incarnation: str, attempts: int = 5
) -> ManifestWalk:
    """Read the committed root of ``incarnation`` and every branch below it with the remote
    tier's tolerant walker (each node checked against the entry naming it). A root that
    vanished (superseded and deleted between reading the pointer and the root) makes it
    re-read the pointer."""
    try:
        pointer, data = read_committed_root(catalog, store, prefix, incarnation, attempts)
    except TransientError:
        walk = ManifestWalk(catalog.read_pointer(incarnation))
        walk.problems.append(_problem("missing-root", incarnation, "the committed root is missing"))
        return walk
    walk = ManifestWalk(pointer)
    if pointer is None or pointer.root_uid is None or data is None:
        return walk
    walk.root_key = keys.root_key(prefix, incarnation, bytes.fromhex(pointer.root_uid))
    try:
        root = decode_node(data)
    except FormatError as exc:
        walk.problems.append(_problem("corrupt-root", walk.root_key, str(exc)))
        return walk
    h = root.header
    if h.kind != KIND_ROOT or h.stream_dir != incarnation:
        detail = f"kind {h.kind}, stream {h.stream_dir!r}"
        walk.problems.append(_problem("bad-root", walk.root_key, detail))
        return walk
    walk.first_offset, walk.next_offset = h.first_offset, h.next_offset
    walker = ManifestWalker(
        prefix, incarnation, store.get, tolerant=True, require_sealed=pointer.sealed
    )
    walk.fragments = list(walker.walk(root.entries, h.next_offset))
    walk.branch_keys = walker.branch_keys
    walk.problems += [p.to_dict() for p in walker.problems]
    return walk


def _problem(kind: str, key: str, detail: str) -> dict[str, str]:
    return {"kind": kind, "key": key, "detail": detail}
