"""Reading an offloaded segment back: a handle on its index, readers like local ones.

``OffloadedSegment`` holds the decoded index object (fetched once by the offloader and
cached) and every chunk's byte range in the data object, computed from the segment's Osiris
index records. Its readers attach at any offset spec exactly as a ``LogReader`` does within
that segment and hand out the same ``ChunkRead`` objects (``segment_path`` is the data
object's key, ``position`` the chunk's byte position in it). Data comes with ranged GETs of
whole chunks, at most ``read_bytes`` per request (one chunk at least) and never across a
block; each chunk's entry header, chunk header and whole-chunk CRC (from the index) are checked
before it is served. An encrypted stream's segment (offload format 2) is read the same way:
its entries are frames, each opened on its own (``remote.segments.SegmentEntries``), so a
ranged GET decrypts only the chunks it fetched.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from tierlog.formats.chunk import ChunkType, decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import CrcMismatchError, FormatError
from tierlog.formats.offload import OffloadIndex
from tierlog.log.errors import LogClosedError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import ChunkRead
from tierlog.offload.errors import OffloadedDataCorruptError, OffloadNotFoundError
from tierlog.remote.encryption import Keyring
from tierlog.remote.segments import SegmentEntries, locate_chunks
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore


class OffloadedSegment:
    """One offloaded segment (the seed's ``ReadHandle``): open readers with ``reader``."""

    def __init__(
        self,
        store: ObjectStore,
        data_key: str,
        index: OffloadIndex,
        *,
        read_bytes: int,
        keyring: Keyring | None = None,
    ) -> None:
        self.store = store
        self.data_key = data_key
        self.index = index
        self.read_bytes = read_bytes
        try:
            self.entries = SegmentEntries(data_key, index, keyring=keyring)
        except FormatError as exc:  # a key the process does not hold (named), a bad key block
            raise OffloadedDataCorruptError(f"{data_key}: {exc}") from exc
        locs = locate_chunks(index)
        self.chunk_ids: list[int] = locs.chunk_ids.tolist()
        self.timestamps: list[int] = locs.timestamps.tolist()
        self.chunk_types: list[int] = locs.chunk_types.tolist()
        self.offsets: list[int] = locs.data_offsets.tolist()
        self.sizes: list[int] = locs.sizes.tolist()
        self.blocks: list[int] = locs.blocks.tolist()
        self.crcs: list[int] = locs.crcs.tolist()
        self.stored_starts: list[int] = locs.stored_starts.tolist()
        self.stored_sizes: list[int] = locs.stored_sizes.tolist()

    @property
    def first_offset(self) -> int:
        return self.index.metadata.first_offset

    @property
    def next_offset(self) -> int:
        return self.index.metadata.next_offset

    def resolve(self, spec: OffsetSpec) -> tuple[int, int]:
        """(index of the first chunk to read, skip records below) for ``spec``, with the
        rules of ``tierlog.log.reader.resolve`` applied to this one segment."""
        n = len(self.chunk_ids)
        if spec.kind == "first":
            return 0, 0
        if spec.kind == "next":
            return n, 0
        if spec.kind == "last":
            for i in range(n - 1, -1, -1):
                if self.chunk_types[i] == ChunkType.USER:
                    return i, 0
            return n, 0
        if spec.kind == "offset":
            offset = spec.value
            if offset >= self.next_offset:
                return n, offset
            if offset <= self.first_offset:
                return 0, offset
            return bisect.bisect_right(self.chunk_ids, offset) - 1, offset
        return bisect.bisect_left(self.timestamps, spec.value), 0

    def reader(
        self,
        spec: OffsetSpec | None = None,
        *,
        verify_crc: bool = True,
        user_only: bool = True,
    ) -> OffloadedSegmentReader:
        """A reader attached at ``spec`` (default ``first``: a sealed segment has no tail)."""
        return OffloadedSegmentReader(
            self, spec or OffsetSpec.first(), verify_crc=verify_crc, user_only=user_only
        )

    def window_end(self, i: int) -> int:
        """The chunks ``[i, end)`` one request fetches: same block, whole chunks, at most
        ``read_bytes`` unless chunk ``i`` alone is larger."""
        block = self.blocks[i]
        start = self.stored_starts[i]
        end = i + 1
        n = len(self.chunk_ids)
        while (
            end < n
            and self.blocks[end] == block
            and self.stored_starts[end] + self.stored_sizes[end] - start <= self.read_bytes
        ):
            end += 1
        return end

    def fetch(self, lo: int, hi: int) -> memoryview:
        """Stored entries of chunks ``[lo, hi)`` (one ranged GET)."""
        start = self.stored_starts[lo]
        end = self.stored_starts[hi - 1] + self.stored_sizes[hi - 1]
        try:
            data = self.store.get_view(self.data_key, start, end)
        except NotFoundError:
            raise OffloadNotFoundError(f"offloaded data object {self.data_key!r} is gone") from None
        if len(data) != end - start:
            raise OffloadedDataCorruptError(
                f"{self.data_key}: {len(data)} bytes at {start}, expected {end - start}"
            )
        return data


class OffloadedSegmentReader:
    """Chunks of an offloaded segment from an offset spec: ``read_chunk``, ``chunks``,
    ``records``, ``next_offset`` as on a ``LogReader`` (everything is committed: a sealed
    segment never grows, so ``wait`` returns False at the end)."""

    def __init__(
        self,
        segment: OffloadedSegment,
        spec: OffsetSpec,
        *,
        verify_crc: bool,
        user_only: bool,
    ) -> None:
        self._segment = segment
        self._verify = verify_crc
        self._user_only = user_only
        self._i, self._skip_below = segment.resolve(spec)
        self._window: memoryview | None = None
        self._window_lo = 0
        self._window_hi = 0
        self._window_start = 0
        self._closed = False

    @property
    def next_offset(self) -> int:
        segment = self._segment
        if self._i < len(segment.chunk_ids):
            return segment.chunk_ids[self._i]
        return segment.next_offset

    @property
    def position(self) -> int:
        """Byte position in the data object of the next chunk's payload."""
        segment = self._segment
        if self._i < len(segment.offsets):
            return segment.offsets[self._i]
        return segment.index.data_object_length

    def close(self) -> None:
        self._closed = True
        self._window = None

    def __enter__(self) -> OffloadedSegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, timeout: float | None = None) -> bool:
        return self._i < len(self._segment.chunk_ids)

    def read_chunk(self, load: bool = True) -> ChunkRead | None:
        """The next chunk, or None at the end of the segment. ``load=False`` hands out the
        header only (the bytes were fetched and checked all the same)."""
        if self._closed:
            raise LogClosedError("reader is closed")
        segment = self._segment
        while self._i < len(segment.chunk_ids):
            i = self._i
            if not self._window_lo <= i < self._window_hi or self._window is None:
                hi = segment.window_end(i)
                self._window = segment.fetch(i, hi)
                self._window_lo, self._window_hi = i, hi
                self._window_start = segment.stored_starts[i]
            chunk_id = segment.chunk_ids[i]
            size = segment.sizes[i]
            at = segment.stored_starts[i] - self._window_start
            window = self._window
            try:
                stored = window[at : at + segment.stored_sizes[i]]
                raw = segment.entries.chunk(i, stored, size, chunk_id)
                header = decode_header(raw)
                if header.chunk_id != chunk_id:
                    raise FormatError(
                        f"entry holding chunk {header.chunk_id} where the index has chunk "
                        f"{chunk_id} of {size} bytes"
                    )
                if header.total_size != size:
                    raise FormatError(f"chunk {chunk_id} is {header.total_size} bytes, not {size}")
                self._i = i + 1
                if self._user_only and header.chunk_type != ChunkType.USER:
                    continue
                if self._verify and crc32(raw) != segment.crcs[i]:
                    raise CrcMismatchError(f"chunk {chunk_id}: CRC of its bytes does not match")
            except FormatError as exc:
                raise OffloadedDataCorruptError(
                    f"{segment.data_key} at {segment.offsets[i]}: {exc}"
                ) from exc
            return ChunkRead(
                header,
                segment.data_key,
                segment.offsets[i],
                raw if load else None,
                self._skip_below,
            )
        self._window = None
        return None

    def chunks(self) -> Iterator[ChunkRead]:
        while (chunk := self.read_chunk()) is not None:
            yield chunk

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, record) of every user record from the reader's position."""
        return itertools.chain.from_iterable(chunk.records() for chunk in self.chunks())
