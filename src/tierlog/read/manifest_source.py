"""Where a reader gets the committed manifest, branch nodes and fragment indexes.

Two sources: ``TiererManifest`` follows a live ``StreamTierer`` in this process (its cached
root is always the committed one); ``CatalogManifest`` reads the catalog pointer and the
root it names (re-reading the pointer when the root 404s, as DESIGN.md says) and refreshes
to follow growth, for nodes that read a stream they do not own. Both keep the bytes of
branch nodes (immutable: their keys carry a uid) and decoded fragment indexes in small LRUs
shared by every reader of the stream, so a seek from the cached root costs the branch GETs
not yet cached, one ranged GET for the index (index + trailer, CRC-checked) and the data.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import TYPE_CHECKING

from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import (
    TRAILER_SIZE,
    FragmentIndex,
    decode_index,
    decode_trailer,
    index_range,
)
from tierlog.read.errors import FragmentExpiredError, RemoteDataCorruptError
from tierlog.remote.catalog import Catalog, ManifestPointer
from tierlog.remote.committed import read_committed_root
from tierlog.remote.errors import StreamDeletedError
from tierlog.remote.manifest_tree import DEFAULT_M, FragmentLocation, ManifestTree
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore

if TYPE_CHECKING:
    from tierlog.tiering.tierer import StreamTierer

DEFAULT_INDEX_CACHE = 64
DEFAULT_BRANCH_CACHE = 256


class ManifestSource(ABC):
    """The committed manifest of one stream plus cached branch and index reads."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        index_cache: int = DEFAULT_INDEX_CACHE,
        branch_cache: int = DEFAULT_BRANCH_CACHE,
    ) -> None:
        self.store = store
        self._lock = threading.RLock()  # the tree's own branch LRU is not thread-safe
        self._branches: OrderedDict[str, bytes] = OrderedDict()
        self._branch_cap = branch_cache
        self._indexes: OrderedDict[str, FragmentIndex] = OrderedDict()
        self._index_cap = index_cache

    @abstractmethod
    def tree(self) -> ManifestTree:
        """The committed tree as this source last saw it (no I/O for a live tierer)."""

    @abstractmethod
    def refresh(self) -> ManifestTree:
        """Look for a newer committed tree (growth, retention) and return it."""

    def first_offset(self) -> int | None:
        """The first offset the remote tier holds, or None when nothing was ever tiered."""
        tree = self.tree()
        if tree.is_empty and tree.next_offset == 0:
            return None
        return tree.first_offset

    # -- lookups ----------------------------------------------------------------------------
    def locate_offset(self, tree: ManifestTree, offset: int) -> FragmentLocation:
        """The fragment of ``tree`` holding ``offset`` (OffsetTrimmedError below the first)."""
        with self._lock:
            return tree.locate_offset(offset, self._load_branch)

    def locate_timestamp(self, tree: ManifestTree, timestamp: int) -> FragmentLocation | None:
        with self._lock:
            return tree.locate_timestamp(timestamp, self._load_branch)

    def _load_branch(self, key: str) -> bytes:
        data = self._branches.get(key)
        if data is not None:
            self._branches.move_to_end(key)
            return data
        try:
            data = self.store.get(key)
        except NotFoundError:
            raise FragmentExpiredError(key) from None
        if self._branch_cap > 0:
            self._branches[key] = data
            while len(self._branches) > self._branch_cap:
                self._branches.popitem(last=False)
        return data

    def fragment_index(self, loc: FragmentLocation) -> FragmentIndex:
        """The fragment's index: one ranged GET of index + trailer (CRC-checked), cached."""
        key = loc.key
        with self._lock:
            cached = self._indexes.get(key)
            if cached is not None:
                self._indexes.move_to_end(key)
                return cached
        entry = loc.entry
        start, end = index_range(entry.data_size, entry.chunk_count)
        try:
            buf = self.store.get_view(key, start, end + TRAILER_SIZE)
        except NotFoundError:
            raise FragmentExpiredError(key) from None
        if len(buf) != end + TRAILER_SIZE - start:
            raise RemoteDataCorruptError(
                f"{key}: index read gave {len(buf)} bytes, the manifest implies "
                f"{end + TRAILER_SIZE - start}"
            )
        try:
            trailer = decode_trailer(buf[end - start :])
            index = decode_index(buf[: end - start], trailer)
        except FormatError as exc:
            raise RemoteDataCorruptError(f"{key}: {exc}") from exc
        if (
            trailer.first_offset,
            trailer.next_offset,
            trailer.data_size,
            trailer.chunk_count,
        ) != (entry.first_offset, loc.next_offset, entry.data_size, entry.chunk_count):
            raise RemoteDataCorruptError(f"{key}: trailer does not match its manifest entry")
        with self._lock:
            if self._index_cap > 0:
                self._indexes[key] = index
                while len(self._indexes) > self._index_cap:
                    self._indexes.popitem(last=False)
        return index

    def forget(self, key: str) -> None:
        """Drop a cached index (its fragment expired)."""
        with self._lock:
            self._indexes.pop(key, None)


class TiererManifest(ManifestSource):
    """The manifest committed by a live ``StreamTierer`` in this process."""

    def __init__(self, tierer: StreamTierer, **caches: int) -> None:
        super().__init__(tierer.remote.store, **caches)
        self.tierer = tierer

    def tree(self) -> ManifestTree:
        return self.tierer.committer.tree

    def refresh(self) -> ManifestTree:
        return self.tierer.committer.tree


class CatalogManifest(ManifestSource):
    """The manifest named by the catalog pointer, read from the object store.

    The root is loaded lazily (a reader served by the local tier never needs it) and
    reloaded by ``refresh`` when the pointer moved; a 404 on a root means it was superseded
    and deleted after the grace period, so the pointer is read again.
    """

    def __init__(
        self,
        catalog: Catalog,
        store: ObjectStore,
        prefix: str,
        stream_dir: str,
        *,
        m: int = DEFAULT_M,
        **caches: int,
    ) -> None:
        super().__init__(store, **caches)
        self.catalog = catalog
        self.prefix = prefix
        self.stream_dir = stream_dir
        self.m = m
        self.pointer: ManifestPointer | None = None
        self._tree: ManifestTree | None = None

    def tree(self) -> ManifestTree:
        if self._tree is None:
            return self.refresh()
        return self._tree

    def refresh(self) -> ManifestTree:
        with self._lock:
            known = self.pointer
            if self._tree is not None and known is not None:
                pointer = self.catalog.read_pointer(self.stream_dir)
                if pointer is not None and pointer.root_uid == known.root_uid:
                    return self._tree  # unchanged: keep the cached root
            pointer, data = read_committed_root(
                self.catalog, self.store, self.prefix, self.stream_dir
            )
            if pointer is None:
                raise StreamDeletedError(f"stream {self.stream_dir} was deleted")
            if data is None:
                tree = ManifestTree(self.prefix, self.stream_dir, m=self.m)
            else:
                tree = ManifestTree.from_root(data, self.prefix, m=self.m)
            self.pointer, self._tree = pointer, tree
            return tree
