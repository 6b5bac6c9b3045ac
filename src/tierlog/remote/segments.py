"""Offloaded segments as manifest leaves: their chunk index, read from the index object.

A manifest leaf of kind "segment" names two objects (``FragmentEntry.key`` the data object,
``index_key`` the index object). Readers locate chunks from the index object alone; this
module turns it into a ``FragmentIndex`` (the chunk records readers of fragments already
search) whose positions are the chunks' payload positions in the data object, plus what
reading the block format takes: each chunk's block and the CRC-32 of its whole bytes (the
``crc`` field; fragments keep the Osiris data CRC there). Between chunks the data object has
12-byte entry headers and, at block boundaries, block headers and padding, so a reader fetches
one run of whole entries per block (``entry_runs``).

An encrypted stream's segments are in offload format version 2 (``formats.offload_sealed``):
the index object is sealed as a whole, and each chunk's entry is a frame sealed on its own,
so the same runs are read and each entry is opened (``SegmentEntries``) before the same
checks. Every reader of offloaded segments (the offloader's handles, the cross-tier reader,
Spark, scrub, start-up) decodes the index with ``decode_offload_index`` and opens entries with
``SegmentEntries``.
"""

from __future__ import annotations

import itertools

import numpy as np

from tierlog.formats.encryption import AesGcmFrameCipher
from tierlog.formats.errors import AuthenticationError, FormatError, InvalidSizeError
from tierlog.formats.fragment import INDEX_DTYPE, FragmentIndex, FragmentTrailer
from tierlog.formats.offload import (
    ENTRY_HEADER_SIZE,
    ChunkLocations,
    OffloadIndex,
    chunk_locations,
    decode_entry_header,
    decode_index,
)
from tierlog.formats.offload_sealed import (
    SealedOffloadIndex,
    check_entry,
    decode_sealed_index,
    sealed_chunk_locations,
)
from tierlog.remote.encryption import Keyring
from tierlog.remote.errors import CorruptFragmentError
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.sealing import is_sealed, open_object, open_object_cipher
from tierlog.storage.object_store import ObjectStore


def decode_offload_index(
    index_key: str,
    stored: bytes | bytearray | memoryview,
    *,
    keyring: Keyring | None = None,
    require_sealed: bool = False,
) -> OffloadIndex:
    """The index object read from ``index_key``: version 1 as stored, version 2 opened with
    the keyring (default: the process's) and decoded. ``require_sealed`` refuses a version 1
    (plaintext) index where only a sealed one may be (an encrypted stream's segment). Any
    damage, a missing key or a plaintext index put in a sealed one's place is a
    ``FormatError`` (``UnknownKeyError`` names the key)."""
    if not is_sealed(stored):
        if require_sealed:
            raise AuthenticationError(f"{index_key}: expected a sealed index, found plaintext")
        return decode_index(stored)
    return decode_sealed_index(open_object(index_key, stored, keyring=keyring))


def locate_chunks(index: OffloadIndex) -> ChunkLocations:
    """Every chunk's stored entry (version 1) or frame (version 2) in the data object."""
    if isinstance(index, SealedOffloadIndex):
        return sealed_chunk_locations(index)
    return chunk_locations(index)


class SegmentEntries:
    """Turns the stored entries of one offloaded segment back into its chunks: version 1
    entries are the entry header and the chunk as stored, version 2 entries are frames
    opened with the data object's key (each on its own). Either way the entry header is
    checked against the index; a ``FormatError`` when anything does not match."""

    __slots__ = ("_cipher", "_count", "_header", "data_key")

    def __init__(
        self, data_key: str, index: OffloadIndex, *, keyring: Keyring | None = None
    ) -> None:
        self.data_key = data_key
        self._count = index.metadata.chunk_count
        self._cipher: AesGcmFrameCipher | None = None
        self._header = b""
        if isinstance(index, SealedOffloadIndex):
            self._cipher = open_object_cipher(data_key, index.key_block, keyring=keyring)
            self._header = index.header

    @property
    def sealed(self) -> bool:
        return self._cipher is not None

    @property
    def key_block(self) -> bytes | None:
        """The data object's key block (None: version 1, not sealed)."""
        return self._cipher.key_block if self._cipher is not None else None

    def chunk(self, i: int, stored: memoryview, size: int, chunk_id: int) -> memoryview:
        """Chunk ``i`` (``size`` bytes, id ``chunk_id``) from its stored entry bytes."""
        if self._cipher is None:
            if len(stored) != ENTRY_HEADER_SIZE + size:
                raise InvalidSizeError(f"entry of chunk {chunk_id}: {len(stored)} bytes")
            length, entry_id = decode_entry_header(stored)
            if (length, entry_id) != (size, chunk_id):
                raise FormatError(
                    f"entry ({length} bytes, id {entry_id}) where the index has chunk "
                    f"{chunk_id} of {size} bytes"
                )
            return stored[ENTRY_HEADER_SIZE:]
        plain = self._cipher.open(i, i == self._count - 1, stored, self._header)
        return check_entry(plain, size, chunk_id)


class SegmentChunkIndex(FragmentIndex):
    """The chunks of an offloaded segment, in the shape of a fragment's index."""

    __slots__ = ("blocks", "entries", "stored_sizes", "stored_starts")

    def __init__(
        self,
        records: np.ndarray,
        trailer: FragmentTrailer,
        locations: ChunkLocations,
        entries: SegmentEntries,
    ) -> None:
        super().__init__(records, trailer)
        self.blocks = locations.blocks
        self.stored_starts = locations.stored_starts
        self.stored_sizes = locations.stored_sizes
        self.entries = entries


def read_segment_index(
    store: ObjectStore,
    entry: FragmentEntry,
    *,
    keyring: Keyring | None = None,
    require_sealed: bool = False,
) -> SegmentChunkIndex:
    """The index object of an offloaded segment (one GET), decoded and checked against its
    manifest entry. NotFoundError when it is gone, CorruptFragmentError when it is bad (or
    sealed under a key the process does not hold: the message names it)."""
    key = entry.index_key
    raw = store.get(key)
    try:
        index = decode_offload_index(key, raw, keyring=keyring, require_sealed=require_sealed)
        locs = locate_chunks(index)
        entries = SegmentEntries(entry.key, index, keyring=keyring)
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc
    meta = index.metadata
    problems = [
        f"{name}: index {got} != manifest {want}"
        for name, got, want in (
            ("first_offset", meta.first_offset, entry.first_offset),
            ("next_offset", meta.next_offset, entry.next_offset),
            ("segment_size", meta.segment_size, entry.data_size),
            ("chunks", meta.chunk_count, entry.chunk_count),
        )
        if got != want
    ]
    if problems:
        raise CorruptFragmentError(
            f"{key}: does not match its manifest entry: {'; '.join(problems)}"
        )
    n = meta.chunk_count
    records = np.zeros(n, dtype=INDEX_DTYPE)
    records["chunk_id"] = locs.chunk_ids
    records["timestamp"] = locs.timestamps
    records["epoch"] = meta.records["epoch"]
    records["position"] = locs.data_offsets
    records["size"] = locs.sizes
    records["crc"] = locs.crcs
    records["chunk_type"] = locs.chunk_types
    records["num_entries"] = 1
    trailer = FragmentTrailer(
        first_offset=meta.first_offset,
        next_offset=meta.next_offset,
        min_timestamp=entry.min_timestamp,
        max_timestamp=entry.max_timestamp,
        max_epoch=int(meta.records["epoch"].max()) if n else 0,
        segment_first_offset=meta.first_offset,
        segment_position=0,
        index_start=index.data_object_length,
        data_size=meta.segment_size,
        chunk_count=n,
        seq_no=0,
        crc=0,
    )
    records.flags.writeable = False
    return SegmentChunkIndex(records, trailer, locs, entries)


def entry_runs(index: SegmentChunkIndex, start: int) -> list[tuple[int, int, int]]:
    """``(first chunk, end chunk, end byte)`` of each block's run of entries from chunk
    ``start`` on; a run's bytes begin at its first chunk's stored entry
    (``index.stored_starts``)."""
    blocks = index.blocks[start:]
    if not len(blocks):
        return []
    cuts = (np.flatnonzero(np.diff(blocks)) + 1 + start).tolist()
    bounds = [start, *cuts, len(index.blocks)]
    starts = index.stored_starts
    sizes = index.stored_sizes
    out = []
    for lo, hi in itertools.pairwise(bounds):
        out.append((lo, hi, int(starts[hi - 1]) + int(sizes[hi - 1])))
    return out


def run_chunks(
    index: SegmentChunkIndex, lo: int, hi: int, run: memoryview, base: int | None = None
) -> list[memoryview]:
    """Chunks ``[lo, hi)`` of a run of stored entries read from byte ``base`` of the data
    object on (default ``stored_starts[lo]``), each opened and its entry header checked
    (``FormatError`` otherwise)."""
    base = int(index.stored_starts[lo]) if base is None else base
    starts = index.stored_starts[lo:hi].tolist()
    stored = index.stored_sizes[lo:hi].tolist()
    sizes = index.records["size"][lo:hi].tolist()
    ids = index.records["chunk_id"][lo:hi].tolist()
    out = []
    for k in range(hi - lo):
        at = starts[k] - base
        if at + stored[k] > len(run):
            raise InvalidSizeError(f"run of {len(run)} bytes ends inside chunk {ids[k]}")
        out.append(index.entries.chunk(lo + k, run[at : at + stored[k]], sizes[k], ids[k]))
    return out
