"""Reading the committed manifest: the pointer, then the root object it names.

A root named by the pointer may have been superseded and deleted (after the grace
period) between the two reads; the pointer has then moved on, so it is read again.
Every reader of the committed manifest (writer resolution, cross-tier reader, Spark
planning and jobs) goes through here.

``CommittedManifest`` is what a reader of one stream needs: the committed tree as last
seen, a way to look for a newer one, and the object store holding it. The live tierer
provides it (its cached root is always the committed one); ``CatalogCommittedManifest``
provides it for a process that reads a stream it does not write.
"""

from __future__ import annotations

import threading
from typing import Protocol

from tierlog.remote.catalog import Catalog, ManifestPointer
from tierlog.remote.errors import StreamDeletedError
from tierlog.remote.keys import root_key
from tierlog.remote.manifest_tree import DEFAULT_M, ManifestTree
from tierlog.remote.sealing import open_object
from tierlog.storage.errors import NotFoundError, TransientError
from tierlog.storage.object_store import ObjectStore

ROOT_READ_ATTEMPTS = 10


def read_committed_root(
    catalog: Catalog,
    store: ObjectStore,
    prefix: str,
    incarnation: str,
    attempts: int = ROOT_READ_ATTEMPTS,
) -> tuple[ManifestPointer | None, bytes | None]:
    """``(pointer, root bytes)``; ``(None, None)`` when the incarnation was deleted and
    ``(pointer, None)`` before its first commit. TransientError when the root keeps
    disappearing; ``AuthenticationError`` when the pointer says the manifest is sealed and
    the root object is not (a plaintext root put in the place of a sealed one)."""
    for _ in range(attempts):
        pointer = catalog.read_pointer(incarnation)
        if pointer is None or pointer.root_uid is None:
            return pointer, None
        try:
            key = root_key(prefix, incarnation, bytes.fromhex(pointer.root_uid))
            stored = store.get(key)
            return pointer, bytes(open_object(key, stored, require_sealed=pointer.sealed))
        except NotFoundError:
            continue  # superseded and deleted under us: the pointer moved on
    raise TransientError(f"manifest root of {incarnation} keeps disappearing")


def load_committed_tree(
    catalog: Catalog, store: ObjectStore, prefix: str, incarnation: str, m: int
) -> tuple[ManifestPointer, ManifestTree]:
    """The committed pointer and the manifest tree it names (an empty tree before the first
    commit); StreamDeletedError once the incarnation is gone. Every cached reader of the
    committed manifest reloads through this one function."""
    pointer, data = read_committed_root(catalog, store, prefix, incarnation)
    if pointer is None:
        raise StreamDeletedError(f"stream {incarnation} was deleted")
    if data is None:
        return pointer, ManifestTree(prefix, incarnation, m=m)
    return pointer, ManifestTree.from_root(data, prefix, m=m, sealed=pointer.sealed)


class CommittedManifest(Protocol):
    """The committed manifest of one stream, as a reader sees it."""

    @property
    def object_store(self) -> ObjectStore:
        """Where the stream's fragments and manifest nodes live."""
        ...

    def committed_tree(self) -> ManifestTree:
        """The committed tree as last seen (no I/O once one was seen)."""
        ...

    def refresh_committed(self) -> ManifestTree:
        """Look for a newer committed tree (growth, retention) and return it."""
        ...


class CatalogCommittedManifest:
    """The manifest named by the catalog pointer, read from the object store.

    The root is loaded lazily (a reader served by the local tier never needs it) and
    reloaded by ``refresh_committed`` when the pointer moved; a stream whose pointer is gone
    raises StreamDeletedError.
    """

    def __init__(
        self,
        catalog: Catalog,
        store: ObjectStore,
        prefix: str,
        stream_dir: str,
        *,
        m: int = DEFAULT_M,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.prefix = prefix
        self.stream_dir = stream_dir
        self.m = m
        self.pointer: ManifestPointer | None = None
        self._tree: ManifestTree | None = None
        self._lock = threading.Lock()

    @property
    def object_store(self) -> ObjectStore:
        return self.store

    def committed_tree(self) -> ManifestTree:
        tree = self._tree
        return self.refresh_committed() if tree is None else tree

    def refresh_committed(self) -> ManifestTree:
        with self._lock:
            known = self.pointer
            if self._tree is not None and known is not None:
                pointer = self.catalog.read_pointer(self.stream_dir)
                if pointer is not None and pointer.root_uid == known.root_uid:
                    return self._tree  # unchanged: keep the cached root
            pointer, tree = load_committed_tree(
                self.catalog, self.store, self.prefix, self.stream_dir, self.m
            )
            self.pointer, self._tree = pointer, tree
            return tree
