"""Offloaded segments of an encrypted stream: format version 2 of the data and index objects.

Version 1 (``formats/offload.py``, Pulsar's block layout) stores chunks verbatim; it stays the
format of streams without encryption and stays readable everywhere. Version 2 seals every
byte of the segment while keeping what makes offloaded segments cheap to read: a chunk is
located from the index alone and fetched with one ranged GET, decrypting only the frames it
needs. All integers are big-endian.

**Data object** (stored under the segment's ``.data`` key)::

    header   "TLSD" u32 2, u16 key block size, key block (the data object's own data key,
             wrapped under a key-encryption key: ``formats.encryption``)
    frames   one per Osiris chunk, in chunk order: AES-256-GCM of the chunk's 12-byte entry
             header (``len i32, entry_id i64`` as in version 1) followed by the chunk's bytes;
             ``12 + size + 16`` stored bytes each

Frame ``i`` of ``n`` is sealed with nonce ``i`` and associated data binding the object key,
``i``, the last-frame flag (``i == n - 1``) and the header bytes: a frame moved, swapped,
dropped, truncated, copied from another object, or a header edited, does not authenticate.
Each frame opens on its own, so a ranged read of any run of chunks decrypts just those.

Frames are uploaded in blocks (multipart parts): a block takes whole frames until it holds
at least ``block_size`` bytes (the header counts in the first), the last block what is left.
So every part but the last is at least the block size (S3's 5 MiB minimum included) and
no padding is needed; readers never need block boundaries, but the index records them.

**Index object** (stored under the ``.index`` key, sealed as a whole with the sealed-object
layout of ``formats.encryption`` under its own data key); its plaintext::

    0   4   magic 0xDE47DE47               (the version 1 index magic)
    4   4   index_len i32                  (the plaintext)
    8   8   data_object_len i64
    16  8   data_header_len i64            (10 + key block size)
    24  4   block_count i32
    28  4   segment_metadata_len i32
    32  ... segment metadata, version 2:
            "OSSM" u16 2 u16 0, first_offset u64, next_offset u64, segment_size u64,
            chunk_count u32 (36 bytes, as version 1), 29 x n index records, 4 x n chunk
            CRC-32s (as version 1), block_size u64, u16 key block size, the data object's
            key block
    ... block_count x (first_entry_id i64, part_number i32, offset i64)
    ... crc u32: CRC-32 of everything before it

The frame table follows from the records: frame ``i`` starts at
``data_header_len + sum(12 + size_j + 16 for j < i)``. The decoder recomputes the block
layout from the records and ``block_size`` and requires the mappings and the data object
length to match it exactly; any damage is a typed ``FormatError``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierlog.formats.crc import crc32
from tierlog.formats.encryption import TAG_SIZE, key_block_kek_id
from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    LayoutMismatchError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.offload import (
    CHUNK_CRC_SIZE,
    ENTRY_HEADER_SIZE,
    INDEX_MAGIC,
    MAPPING_SIZE,
    MAX_BLOCKS,
    MAX_ENTRY_LENGTH,
    MAX_INDEX_LENGTH,
    METADATA_HEADER_SIZE,
    METADATA_MAGIC,
    OFFLOAD_INDEX_HEADER_SIZE,
    BlockMapping,
    BlockPlan,
    ChunkLocations,
    OffloadIndex,
    SegmentMetadata,
    check_block_size,
    check_records,
    records_and_crcs,
)
from tierlog.formats.segment import INDEX_RECORD_DTYPE, INDEX_RECORD_SIZE

SEALED_FORMAT_VERSION = 2
"""The offload format version of an encrypted stream's segments (user metadata and index)."""
DATA_MAGIC = b"TLSD"
DATA_VERSION = 2
METADATA_VERSION_SEALED = 2
FRAME_OVERHEAD = ENTRY_HEADER_SIZE + TAG_SIZE  # stored bytes of a frame beyond its chunk

_DATA_HEADER = struct.Struct(">4sIH")  # magic, version, key block size
_INDEX_HEADER = struct.Struct(">Iiqqii")
_METADATA_HEADER = struct.Struct(">4sHHQQQI")
_MAPPING = struct.Struct(">qiq")
_TAIL = struct.Struct(">QH")  # block size, key block size
_U32 = struct.Struct(">I")
_ENTRY_HEADER = struct.Struct(">iq")


# -- data object ------------------------------------------------------------------------------


def data_header(key_block: bytes) -> bytes:
    """The data object's header: also the associated data of every frame."""
    key_block_kek_id(key_block)  # a malformed key block is refused before anything is sealed
    return _DATA_HEADER.pack(DATA_MAGIC, DATA_VERSION, len(key_block)) + key_block


def decode_data_header(buf: bytes | bytearray | memoryview) -> bytes:
    """The key block of a data object's header (``buf`` starts at byte 0)."""
    view = memoryview(buf).cast("B")
    if view.nbytes < _DATA_HEADER.size:
        raise TruncatedError("sealed data object shorter than its header")
    magic, version, size = _DATA_HEADER.unpack_from(view, 0)
    if magic != DATA_MAGIC:
        raise BadMagicError(f"sealed data object magic {magic!r}, expected {DATA_MAGIC!r}")
    if version != DATA_VERSION:
        raise UnsupportedError(f"sealed data object version {version}")
    if view.nbytes < _DATA_HEADER.size + size:
        raise TruncatedError("sealed data object ends inside its key block")
    key_block = bytes(view[_DATA_HEADER.size : _DATA_HEADER.size + size])
    key_block_kek_id(key_block)
    return key_block


def entry_header(size: int, chunk_id: int) -> bytes:
    return _ENTRY_HEADER.pack(size, chunk_id)


def plan_frame_blocks(
    entry_ids: Sequence[int] | np.ndarray,
    chunk_sizes: Sequence[int] | np.ndarray,
    block_size: int,
    header_length: int,
) -> list[BlockPlan]:
    """Cut the frames into blocks: each takes whole frames until it holds at least
    ``block_size`` bytes (the data header counts in the first); the last takes the rest."""
    ids = np.asarray(entry_ids, dtype=np.int64)
    stored = np.asarray(chunk_sizes, dtype=np.int64) + FRAME_OVERHEAD
    n = len(stored)
    if n == 0:
        raise InvalidSizeError("a data object needs at least one frame")
    if len(ids) != n:
        raise InvalidSizeError(f"{len(ids)} entry ids for {n} chunk sizes")
    if stored.min() < FRAME_OVERHEAD or stored.max() - FRAME_OVERHEAD > MAX_ENTRY_LENGTH:
        raise InvalidSizeError(f"chunk sizes must be in [0, {MAX_ENTRY_LENGTH}]")
    ends = header_length + np.cumsum(stored)  # end of frame i in the data object
    plans: list[BlockPlan] = []
    first = 0
    offset = 0
    while first < n:
        stop = int(np.searchsorted(ends, offset + block_size, side="left")) + 1
        stop = min(max(stop, first + 1), n)
        end = int(ends[stop - 1])
        plans.append(
            BlockPlan(len(plans) + 1, offset, end - offset, first, stop - first, int(ids[first]))
        )
        offset = end
        first = stop
    if len(plans) > MAX_BLOCKS:
        raise InvalidSizeError(
            f"{len(plans)} blocks of {block_size} bytes: more than {MAX_BLOCKS} parts"
        )
    return plans


def frame_starts(chunk_sizes: np.ndarray, header_length: int) -> np.ndarray:
    """Where each frame starts in the data object (int64)."""
    stored = np.asarray(chunk_sizes, dtype=np.int64) + FRAME_OVERHEAD
    return header_length + np.concatenate(([0], np.cumsum(stored)[:-1])).astype(np.int64)


# -- index object -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SealedOffloadIndex(OffloadIndex):
    """The decoded index of a version 2 (sealed) offload: the data object's key block and
    the block size the frames were cut with."""

    key_block: bytes = b""
    frame_block_size: int = 0

    @property
    def block_size(self) -> int:
        return self.frame_block_size

    @property
    def header(self) -> bytes:
        """The data object's header bytes (the frames' associated data)."""
        return data_header(self.key_block)


def build_sealed_index(
    metadata: SegmentMetadata, block_size: int, key_block: bytes
) -> tuple[SealedOffloadIndex, list[BlockPlan]]:
    """The index of a segment sealed in frames, cut into blocks of ``block_size``."""
    check_block_size(block_size)
    check_records(
        metadata.records, metadata.first_offset, metadata.next_offset, metadata.segment_size
    )
    header_length = len(data_header(key_block))
    plans = plan_frame_blocks(
        metadata.records["chunk_id"], metadata.chunk_sizes(), block_size, header_length
    )
    blocks = tuple(BlockMapping(p.first_entry_id, p.part_number, p.offset) for p in plans)
    length = plans[-1].offset + plans[-1].length
    index = SealedOffloadIndex(length, header_length, blocks, metadata, key_block, block_size)
    return index, plans


def encode_sealed_index(index: SealedOffloadIndex) -> bytes:
    """The index object's plaintext (the caller seals it)."""
    meta = index.metadata
    body = records_and_crcs(meta)
    body += _TAIL.pack(index.frame_block_size, len(index.key_block)) + index.key_block
    metadata_len = METADATA_HEADER_SIZE + len(body)
    total = OFFLOAD_INDEX_HEADER_SIZE + metadata_len + MAPPING_SIZE * len(index.blocks) + 4
    if total > MAX_INDEX_LENGTH:
        raise InvalidSizeError(f"index object of {total} bytes is too large")
    out = bytearray(
        _INDEX_HEADER.pack(
            INDEX_MAGIC,
            total,
            index.data_object_length,
            index.data_header_length,
            len(index.blocks),
            metadata_len,
        )
    )
    out += _METADATA_HEADER.pack(
        METADATA_MAGIC,
        METADATA_VERSION_SEALED,
        0,
        meta.first_offset,
        meta.next_offset,
        meta.segment_size,
        meta.chunk_count,
    )
    out += body
    for b in index.blocks:
        out += _MAPPING.pack(b.first_entry_id, b.part_number, b.offset)
    out += _U32.pack(crc32(out))
    return bytes(out)


def decode_sealed_index(buf: bytes | bytearray | memoryview) -> SealedOffloadIndex:
    """Decode and fully check an opened version 2 index; a ``FormatError`` on any damage."""
    view = memoryview(buf).cast("B")
    if view.nbytes < OFFLOAD_INDEX_HEADER_SIZE + METADATA_HEADER_SIZE + 4:
        raise TruncatedError(f"sealed offload index of {view.nbytes} bytes is too short")
    magic, index_len, data_len, header_len, block_count, metadata_len = _INDEX_HEADER.unpack_from(
        view
    )
    if magic != INDEX_MAGIC:
        raise BadMagicError(f"index magic {magic:#010x}, expected {INDEX_MAGIC:#010x}")
    if index_len != view.nbytes:
        kind = TruncatedError if index_len > view.nbytes else InvalidSizeError
        raise kind(f"index says {index_len} bytes, got {view.nbytes}")
    (stored_crc,) = _U32.unpack_from(view, view.nbytes - 4)
    if crc32(view[:-4]) != stored_crc:
        raise CrcMismatchError("sealed offload index CRC mismatch")
    if not 1 <= block_count <= MAX_BLOCKS:
        raise InvalidSizeError(f"block count {block_count} out of range")
    if OFFLOAD_INDEX_HEADER_SIZE + metadata_len + MAPPING_SIZE * block_count + 4 != index_len:
        raise InvalidSizeError("index length does not match metadata length and block count")
    m_magic, version, reserved, first, next_offset, seg_size, count = _METADATA_HEADER.unpack_from(
        view, OFFLOAD_INDEX_HEADER_SIZE
    )
    if m_magic != METADATA_MAGIC:
        raise BadMagicError(f"segment metadata magic {m_magic!r}, expected {METADATA_MAGIC!r}")
    if version != METADATA_VERSION_SEALED or reserved != 0:
        raise UnsupportedError(f"sealed segment metadata version {version} (flags {reserved})")
    records_at = OFFLOAD_INDEX_HEADER_SIZE + METADATA_HEADER_SIZE
    crcs_at = records_at + count * INDEX_RECORD_SIZE
    tail_at = crcs_at + count * CHUNK_CRC_SIZE
    meta_end = OFFLOAD_INDEX_HEADER_SIZE + metadata_len
    if tail_at + _TAIL.size > meta_end:
        raise InvalidSizeError(f"{count} index records overrun the segment metadata")
    block_size, key_size = _TAIL.unpack_from(view, tail_at)
    if tail_at + _TAIL.size + key_size != meta_end:
        raise InvalidSizeError("the key block does not end the segment metadata")
    key_block = bytes(view[tail_at + _TAIL.size : meta_end])
    key_block_kek_id(key_block)
    if header_len != _DATA_HEADER.size + key_size:
        raise InvalidSizeError(f"data header length {header_len} with a {key_size}-byte key")
    try:
        check_block_size(block_size)
    except InvalidSizeError as exc:
        raise LayoutMismatchError(str(exc)) from exc
    records = np.frombuffer(bytes(view[records_at:crcs_at]), dtype=INDEX_RECORD_DTYPE)
    crcs = np.frombuffer(bytes(view[crcs_at:tail_at]), dtype=">u4")
    check_records(records, first, next_offset, seg_size)
    metadata = SegmentMetadata(first, next_offset, seg_size, records, crcs)
    blocks = tuple(
        BlockMapping(*_MAPPING.unpack_from(view, meta_end + i * MAPPING_SIZE))
        for i in range(block_count)
    )
    expected, _ = build_sealed_index(metadata, block_size, key_block)
    if expected.blocks != blocks or expected.data_object_length != data_len:
        raise LayoutMismatchError(
            "block mappings or data object length do not follow from the records "
            f"and a block size of {block_size}"
        )
    return expected


def sealed_chunk_locations(index: SealedOffloadIndex) -> ChunkLocations:
    """Every chunk's frame in the data object, from the index alone (``data_offsets`` and
    ``stored_starts`` are the frame starts, ``stored_sizes`` the frames' sizes)."""
    meta = index.metadata
    if meta.chunk_crcs is None:
        raise InvalidSizeError("chunk locations need the chunk CRCs")
    sizes = meta.chunk_sizes()
    starts = frame_starts(sizes, index.data_header_length)
    plans = plan_frame_blocks(
        meta.records["chunk_id"], sizes, index.block_size, index.data_header_length
    )
    blocks = np.empty(len(sizes), dtype=np.int64)
    for plan in plans:
        blocks[plan.first_entry : plan.first_entry + plan.entry_count] = plan.part_number - 1
    return ChunkLocations(
        meta.records["chunk_id"].astype(np.uint64),
        meta.records["timestamp"].astype(np.int64),
        meta.records["chunk_type"].astype(np.uint8),
        starts,
        sizes,
        np.asarray(meta.chunk_crcs, dtype=np.uint32),
        blocks,
        starts,
        sizes + FRAME_OVERHEAD,
    )


def check_entry(entry: bytes | memoryview, size: int, chunk_id: int) -> memoryview:
    """The chunk of an opened frame, after checking its entry header against the index."""
    view = memoryview(entry).cast("B")
    if view.nbytes != ENTRY_HEADER_SIZE + size:
        raise InvalidSizeError(f"frame of chunk {chunk_id} opened to {view.nbytes} bytes")
    length, entry_id = _ENTRY_HEADER.unpack_from(view, 0)
    if (length, entry_id) != (size, chunk_id):
        raise FormatError(
            f"entry ({length} bytes, id {entry_id}) where the index has chunk {chunk_id} "
            f"of {size} bytes"
        )
    return view[ENTRY_HEADER_SIZE:]
