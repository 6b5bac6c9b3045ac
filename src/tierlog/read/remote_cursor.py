"""Reading a run of chunks out of the remote tier, fragment after fragment.

A ``RemoteCursor`` walks the fragments of one committed-manifest snapshot from a chunk id
up to a bound: the fragment index with one ranged GET, then the chunk bytes through one
adaptive ``RangeStream`` whose spans are cut at chunk boundaries, so every chunk is a
slice of one buffer. Each chunk is checked against its index entry (and its CRC) before
it is served, since the remote tier is the copy nobody else verifies.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

import numpy as np

from tierlog.errors import TierlogError
from tierlog.formats.bloom import ChunkFilter
from tierlog.formats.chunk import ChunkHeader, ChunkType, decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import CrcMismatchError, FormatError
from tierlog.formats.fragment import HEADER_SIZE as FRAGMENT_HEADER_SIZE
from tierlog.formats.fragment import FragmentIndex
from tierlog.formats.fragment_v2 import FragmentIndexV2, stored_sizes
from tierlog.read.errors import RemoteDataCorruptError
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import PrefetchConfig, Prefetcher, RangeStream, Span
from tierlog.remote.manifest_tree import FragmentLocation, ManifestTree
from tierlog.remote.segments import SegmentChunkIndex, entry_runs


def check_remote_crc(header: ChunkHeader, data: bytes | memoryview) -> None:
    """Raise CrcMismatchError when a remote chunk's data does not match its header's CRC."""
    actual = crc32(data)
    if actual != header.data_crc:
        raise CrcMismatchError(
            f"chunk {header.chunk_id}: data CRC {actual:#010x} != header {header.data_crc:#010x}"
        )


_default_prefetcher: Prefetcher | None = None
_default_lock = threading.Lock()


def default_prefetcher() -> Prefetcher:
    """The process-wide prefetcher (default settings), made on first use."""
    global _default_prefetcher
    with _default_lock:
        if _default_prefetcher is None:
            defaults = PrefetchConfig()
            # a catch-up reader starts with as many GETs in flight as the pool runs
            initial = defaults.threads * defaults.request_bytes
            _default_prefetcher = Prefetcher(PrefetchConfig(initial_window_bytes=initial))
        return _default_prefetcher


def aligned_spans(key: str, positions: list[int], end: int, step: int) -> Iterator[Span]:
    """``[positions[0], end)`` of ``key`` cut at chunk starts into spans of at most ``step``
    bytes (a chunk larger than ``step`` is a span of its own)."""
    if not positions:
        if end > FRAGMENT_HEADER_SIZE:
            yield key, FRAGMENT_HEADER_SIZE, end
        return
    start = prev = positions[0]
    for at in positions[1:]:
        if at - start > step and prev > start:
            yield key, start, prev
            start = prev
        prev = at
    if end - start > step and prev > start:
        yield key, start, prev
        start = prev
    yield key, start, end


def wanted_chunks(index: FragmentIndex, chunk_filter: ChunkFilter | None) -> list[bool] | None:
    """Which chunks of a fragment a filtering reader reads (None: all of them): from a v2
    index's blooms (its record CRCs, checked when it loaded, cover them), the user chunks
    whose bloom may match; tracking chunks are never handed to such a reader. v1 fragments
    and offloaded segments carry no blooms in their index: every chunk is read."""
    if chunk_filter is None or not isinstance(index, FragmentIndexV2):
        return None
    types = index.records["chunk_type"].tolist()
    may_match = chunk_filter.may_match
    return [t == ChunkType.USER and may_match(index.bloom(i)) for i, t in enumerate(types)]


def _index_spans(
    key: str, index: FragmentIndex, i: int, step: int, wanted: list[bool] | None = None
) -> Iterator[Span]:
    """The spans reading chunks ``i`` on of one fragment or offloaded segment: a fragment's
    stored frames (v1: the chunks) end where its index starts; a segment's chunks come in
    runs of entries, one run per block. With ``wanted``, only runs of wanted chunks."""
    if not isinstance(index, SegmentChunkIndex):
        positions: list[int] = index.records["position"][i:].astype(np.int64).tolist()
        end = index.trailer.index_start
        if wanted is None:
            yield from aligned_spans(key, positions, end, step)
            return
        n = len(positions)
        lo = 0
        while lo < n:
            if not wanted[i + lo]:
                lo += 1
                continue
            hi = lo
            while hi < n and wanted[i + hi]:
                hi += 1
            yield from aligned_spans(key, positions[lo:hi], positions[hi] if hi < n else end, step)
            lo = hi
        return
    # one run of whole stored entries (entry header + chunk, or the sealed frame of both)
    # per block; no block header or padding
    stored_starts: list[int] = index.stored_starts.tolist()
    for lo, hi, end in entry_runs(index, i):
        yield from aligned_spans(key, stored_starts[lo:hi], end, step)


class RemoteCursor:
    """Chunks of consecutive fragments of one manifest snapshot, from ``chunk_id`` up to
    (not including) ``until``."""

    def __init__(
        self,
        manifest: ManifestSource,
        prefetcher: Prefetcher,
        tree: ManifestTree,
        chunk_id: int,
        until: int,
        verify_crc: bool,
        chunk_filter: ChunkFilter | None = None,
    ) -> None:
        self._manifest = manifest
        self._tree = tree
        self._until = until
        self._verify = verify_crc
        self._filter = chunk_filter
        self.skipped_to = chunk_id
        """The offset after the last chunk the filter skipped (a reader resumes there)."""
        self.skipped_chunks = 0
        self._enter(manifest.locate_offset(tree, chunk_id))
        i = bisect.bisect_right(self._ids, chunk_id) - 1
        if i < 0 or self._ids[i] != chunk_id:
            raise RemoteDataCorruptError(f"{self.key}: no chunk starts at {chunk_id}")
        self._i = i
        self._request_bytes = prefetcher.config.request_bytes
        self._prefetcher = prefetcher
        self._spans_stopped_at: int | None = None  # read-ahead stopped before this fragment
        self._stream: RangeStream = prefetcher.open(manifest.store, self._spans(self._loc, i))

    def _enter(self, loc: FragmentLocation) -> None:
        index: FragmentIndex = self._manifest.fragment_index(loc)
        records = index.records
        self._loc = loc
        self.key = loc.key
        self._decoder = self._manifest.frame_decoder(loc, index)  # None: frames are chunks
        self._ids: list[int] = records["chunk_id"].astype(np.int64).tolist()
        self._sizes: list[int] = records["size"].astype(np.int64).tolist()
        self._stored: list[int] = stored_sizes(index).astype(np.int64).tolist()
        self._positions: list[int] = records["position"].astype(np.int64).tolist()
        self._types: list[int] = records["chunk_type"].tolist()
        self._records = records["num_records"]
        # an offloaded segment: each chunk is stored as an entry (a 12-byte entry header and
        # the chunk, sealed as one frame in an encrypted stream), and chunks are checked
        # against the CRC-32 of their whole bytes from its index
        self._entries = index.entries if isinstance(index, SegmentChunkIndex) else None
        self._segment = self._entries is not None
        self._crcs: list[int] = records["crc"].tolist() if self._segment else []
        if isinstance(index, SegmentChunkIndex):
            self._stored = index.stored_sizes.tolist()
        self._wanted = wanted_chunks(index, self._filter)
        self._i = 0

    def _spans(self, first: FragmentLocation, i: int) -> Iterator[Span]:
        """The data regions of the fragments from chunk ``i`` of ``first`` on, cut at chunk
        boundaries into spans of at most one request (so no chunk straddles two requests and
        every chunk is served as a slice of one buffer, without a copy)."""
        step = self._request_bytes
        first_index = self._manifest.fragment_index(first)
        yield from _index_spans(
            first.key, first_index, i, step, wanted_chunks(first_index, self._filter)
        )
        loc = first
        while loc.next_offset < self._until:
            loc = self._manifest.locate_offset(self._tree, loc.next_offset)
            try:
                index = self._manifest.fragment_index(loc)  # cached: ``_enter`` reuses it
            except TierlogError:
                # Where its frames (or a segment's entries) end is unknown: stop reading
                # ahead here. The reader loads the index again when it gets there (the error
                # surfaces then, or it was transient) and opens a new stream from there.
                self._spans_stopped_at = loc.entry.first_offset
                return
            yield from _index_spans(loc.key, index, 0, step, wanted_chunks(index, self._filter))

    @property
    def stream(self) -> RangeStream:
        return self._stream

    def next_chunk(self) -> tuple[ChunkHeader, memoryview, str, int] | None:
        """The next chunk, or None at ``until`` / the end of the snapshot (chunks the filter
        rules out are passed over unread: ``skipped_to`` says how far)."""
        while True:
            if self._i >= len(self._ids):
                nxt = self._loc.next_offset
                if nxt >= self._until or nxt >= self._tree.next_offset:
                    return None
                self._enter(self._manifest.locate_offset(self._tree, nxt))
                if self._spans_stopped_at == self._loc.entry.first_offset:
                    self._stream.close()
                    self._spans_stopped_at = None
                    self._stream = self._prefetcher.open(
                        self._manifest.store, self._spans(self._loc, 0)
                    )
            i = self._i
            chunk_id = self._ids[i]
            if chunk_id >= self._until:
                return None
            if self._wanted is None or self._wanted[i]:
                break
            self._i = i + 1
            self.skipped_chunks += 1
            self.skipped_to = chunk_id + int(self._records[i])
        size = self._sizes[i]
        raw = self._stream.read(self._stored[i])
        try:
            if self._entries is not None:
                raw = self._entries.chunk(i, raw, size, chunk_id)
            elif self._decoder is not None:
                raw = memoryview(self._decoder.decode(i, raw))
            header = decode_header(raw)
            if header.chunk_id != chunk_id or header.total_size != size:
                raise RemoteDataCorruptError(
                    f"{self.key}: chunk at {self._positions[i]} is {header.chunk_id} "
                    f"({header.total_size} bytes), the index says {chunk_id} ({size} bytes)"
                )
            if header.chunk_type != self._types[i]:
                # the type byte is outside the data CRC: a user chunk must never pass as
                # a tracking chunk (readers skip those) or the other way round
                raise RemoteDataCorruptError(
                    f"{self.key}: chunk {chunk_id} at {self._positions[i]} has type "
                    f"{header.chunk_type}, the index says {self._types[i]}"
                )
            if self._verify and self._segment:
                if crc32(raw) != self._crcs[i]:
                    raise CrcMismatchError(f"chunk {chunk_id}: CRC of its bytes does not match")
            elif self._verify:
                start = header.data_start
                check_remote_crc(header, raw[start : start + header.data_length])
        except FormatError as exc:
            raise RemoteDataCorruptError(f"{self.key}: chunk {chunk_id}: {exc}") from exc
        self._i = i + 1
        return header, raw, self.key, self._positions[i]

    def close(self) -> None:
        self._stream.close()
