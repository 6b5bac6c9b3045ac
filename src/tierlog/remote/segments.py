"""Offloaded segments as manifest leaves: their chunk index, read from the index object.

A manifest leaf of kind "segment" names two objects (``FragmentEntry.key`` the data object,
``index_key`` the index object). Readers locate chunks from the index object alone; this
module turns it into a ``FragmentIndex`` (the chunk records readers of fragments already
search) whose positions are the chunks' payload positions in the data object, plus what
reading the block format takes: each chunk's block and the CRC-32 of its whole bytes (the
``crc`` field; fragments keep the Osiris data CRC there). Between chunks the data object has
12-byte entry headers and, at block boundaries, block headers and padding, so a reader fetches
one run of whole entries per block (``entry_runs``).
"""

from __future__ import annotations

import itertools

import numpy as np

from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import INDEX_DTYPE, FragmentIndex, FragmentTrailer
from tierlog.formats.offload import ENTRY_HEADER_SIZE, chunk_locations, decode_index
from tierlog.remote.errors import CorruptFragmentError
from tierlog.remote.fragments import FragmentEntry
from tierlog.storage.object_store import ObjectStore


class SegmentChunkIndex(FragmentIndex):
    """The chunks of an offloaded segment, in the shape of a fragment's index."""

    __slots__ = ("blocks",)

    entry_header_size = ENTRY_HEADER_SIZE

    def __init__(self, records: np.ndarray, trailer: FragmentTrailer, blocks: np.ndarray) -> None:
        super().__init__(records, trailer)
        self.blocks = blocks


def read_segment_index(store: ObjectStore, entry: FragmentEntry) -> SegmentChunkIndex:
    """The index object of an offloaded segment (one GET), decoded and checked against its
    manifest entry. NotFoundError when it is gone, CorruptFragmentError when it is bad."""
    key = entry.index_key
    raw = store.get(key)
    try:
        index = decode_index(raw)
        locs = chunk_locations(index)
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
    return SegmentChunkIndex(records, trailer, locs.blocks)


def entry_runs(index: SegmentChunkIndex, start: int) -> list[tuple[int, int, int]]:
    """``(first chunk, end chunk, end byte)`` of each block's run of entries from chunk
    ``start`` on; a run's bytes begin at its first chunk's entry header."""
    blocks = index.blocks[start:]
    if not len(blocks):
        return []
    cuts = (np.flatnonzero(np.diff(blocks)) + 1 + start).tolist()
    bounds = [start, *cuts, len(index.blocks)]
    positions = index.records["position"]
    sizes = index.records["size"]
    out = []
    for lo, hi in itertools.pairwise(bounds):
        out.append((lo, hi, int(positions[hi - 1]) + int(sizes[hi - 1])))
    return out
