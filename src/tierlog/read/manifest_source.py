"""Where a reader gets the committed manifest, branch nodes and fragment indexes.

The committed manifest comes from a ``remote.committed.CommittedManifest``: the live
tierer of the stream in this process, or the catalog pointer for a stream this process
does not write. The source keeps the bytes of branch nodes (immutable: their keys carry a
uid) and decoded fragment indexes in small LRUs shared by every reader of the stream, so a
seek from the cached root costs the branch GETs not yet cached, one ranged GET for the
index (index + trailer, CRC-checked) and the data.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from tierlog.formats.fragment import FragmentIndex
from tierlog.formats.fragment_frames import FrameDecoder
from tierlog.formats.fragment_v2 import FragmentIndexV2
from tierlog.read.errors import FragmentExpiredError, RemoteDataCorruptError
from tierlog.remote.committed import CommittedManifest
from tierlog.remote.dictionaries import DictionaryCache, frame_decoder
from tierlog.remote.errors import CorruptFragmentError
from tierlog.remote.fragments import read_known_fragment
from tierlog.remote.manifest_tree import FragmentLocation, ManifestTree
from tierlog.remote.segments import read_segment_index
from tierlog.storage.errors import NotFoundError

DEFAULT_INDEX_CACHE = 64


def is_encrypted_index(index: FragmentIndex) -> bool:
    """Whether a fragment's index says its frames are sealed (v2, encrypted)."""
    return isinstance(index, FragmentIndexV2) and index.encrypted


DEFAULT_BRANCH_CACHE = 256


class ManifestSource:
    """The committed manifest of one stream plus cached branch and index reads."""

    def __init__(
        self,
        committed: CommittedManifest,
        *,
        index_cache: int = DEFAULT_INDEX_CACHE,
        branch_cache: int = DEFAULT_BRANCH_CACHE,
    ) -> None:
        self.committed = committed
        self.store = committed.object_store
        self._lock = threading.RLock()  # the tree's own branch LRU is not thread-safe
        self._branches: OrderedDict[str, bytes] = OrderedDict()
        self._branch_cap = branch_cache
        self._indexes: OrderedDict[str, FragmentIndex] = OrderedDict()
        self._index_cap = index_cache
        self._decoders: OrderedDict[str, FrameDecoder] = OrderedDict()
        self.dictionaries = DictionaryCache(self.store)

    def tree(self) -> ManifestTree:
        """The committed tree as this source last saw it (no I/O for a live tierer)."""
        return self.committed.committed_tree()

    def refresh(self) -> ManifestTree:
        """Look for a newer committed tree (growth, retention) and return it."""
        return self.committed.refresh_committed()

    def first_offset(self) -> int | None:
        """The first offset the remote tier holds, or None when nothing was ever tiered."""
        tree = self.tree()
        if tree.is_empty and tree.next_offset == 0:
            return None
        return tree.first_offset

    # -- lookups ----------------------------------------------------------------------------
    def locate_offset(self, tree: ManifestTree, offset: int) -> FragmentLocation:
        """The fragment of ``tree`` holding ``offset`` (OffsetOvertakenError below the first)."""
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
        """The fragment's index: one ranged GET of index + trailer (CRC-checked), cached.
        For an offloaded segment: its index object (one GET), as a ``SegmentChunkIndex``."""
        key = loc.key
        with self._lock:
            cached = self._indexes.get(key)
            if cached is not None:
                self._indexes.move_to_end(key)
                return cached
        index: FragmentIndex
        sealed = self.tree().sealed  # a sealed manifest names sealed fragments and segments
        try:
            if loc.entry.is_segment:
                index = read_segment_index(self.store, loc.entry, require_sealed=sealed)
            else:
                index = read_known_fragment(self.store, loc.entry).index
                if sealed and not is_encrypted_index(index):
                    raise RemoteDataCorruptError(
                        f"{key}: a plaintext fragment where the stream's manifest names "
                        "encrypted ones only"
                    )
        except NotFoundError:
            raise FragmentExpiredError(key) from None
        except CorruptFragmentError as exc:
            raise RemoteDataCorruptError(str(exc)) from exc
        with self._lock:
            if self._index_cap > 0:
                self._indexes[key] = index
                while len(self._indexes) > self._index_cap:
                    self._indexes.popitem(last=False)
        return index

    def frame_decoder(self, loc: FragmentLocation, index: FragmentIndex) -> FrameDecoder | None:
        """The decoder of a v2 fragment's frames (dictionary loaded, key unwrapped), cached
        beside its index; None for a v1 fragment."""
        key = loc.key
        with self._lock:
            cached = self._decoders.get(key)
            if cached is not None and cached.index is index:
                self._decoders.move_to_end(key)
                return cached
        try:
            decoder = frame_decoder(key, index, self.dictionaries)
        except CorruptFragmentError as exc:
            raise RemoteDataCorruptError(str(exc)) from exc
        if decoder is not None:
            with self._lock:
                self._decoders[key] = decoder
                while len(self._decoders) > max(self._index_cap, 1):
                    self._decoders.popitem(last=False)
        return decoder

    def forget(self, key: str) -> None:
        """Drop a cached index (its fragment expired)."""
        with self._lock:
            self._indexes.pop(key, None)
            self._decoders.pop(key, None)
