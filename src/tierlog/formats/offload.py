"""Offloaded segments: the block-format data object and its index object (Pulsar's layout).

A sealed Osiris segment offloaded whole becomes two objects. All integers are big-endian.

**Data object**: a sequence of blocks, uploaded one multipart part per block. Each block is

* a 128-byte header: ``magic i32 = 0xFBDBABCB``, ``header_len i64 = 128``, ``block_len i64``
  (the whole block, header included), ``first_entry_id i64``, then zero bytes up to 128;
* entries ``len i32, entry_id i64, payload``: one entry per Osiris chunk (tracking chunks
  included), ``entry_id`` = the chunk id, ``payload`` = the chunk's bytes verbatim (header,
  bloom filter, data, trailer) as they are in the segment file;
* padding: the bytes ``FE DC DE AD`` repeated (from the first padding byte) up to ``block_len``.

Blocks hold whole entries only. Every block but the last is exactly the block size; the last
one is exactly ``128 + 12 * (entries left) + (payload bytes left)`` (Pulsar's
``calculateBlockSize``; each entry costs 4 + 8 = 12 header bytes), so it has no padding.
A block must hold at least one entry, so the block size is at least the largest chunk + 140
(128 + 12), and at least 5 MiB (S3's smallest part but the last).

**Index object**: Pulsar's ``OffloadIndexBlockImpl`` layout::

    magic i32 = 0xDE47DE47 | index_len i32 (the whole object) | data_object_len i64
    | data_header_len i64 (= 128) | block_count i32 | segment_metadata_len i32
    | segment_metadata | block_count x (first_entry_id i64, part_number i32, offset i64)

one mapping per block: its first entry id, its part number (from 1) and the byte offset of the
block in the data object (the sum of the lengths of the blocks before it).

**Segment metadata** (ours; Pulsar stores BookKeeper's ledger metadata protobuf here)::

    offset  size  field
    0       4     magic "OSSM"
    4       2     version u16 = 1
    6       2     reserved u16 = 0
    8       8     first_offset u64: the segment's first offset (its file name)
    16      8     next_offset u64: the offset after the segment's last record
    24      8     segment_size u64: bytes of the segment file (8-byte file header + chunks)
    32      4     chunk_count u32
    36      29*n  the segment's Osiris index records, as in its .index file
                  (chunk id u64, timestamp i64, epoch u64, file position u32, chunk type u8)
    36+29n  4*n   chunk_crcs u32: CRC-32 of each chunk's whole bytes (header to trailer)
    36+33n  4     mappings_crc u32: CRC-32 of the index object's mapping section
    40+33n  4     crc u32: CRC-32 of the index object from byte 0 up to this field

With the records, a reader knows every chunk's size (the next position minus its own) and so
its exact byte range in the data object: a seek by offset or timestamp costs the index object
plus one ranged GET. The chunk CRCs let a reader check every byte it serves (the Osiris CRC
covers entry data only, not the header, bloom filter or trailer; the block format itself has no
checksum). The two last CRCs cover every byte of the index object. The decoder
recomputes the block layout from the records and the block size (the distance between the
first two blocks, or the only block's length) and requires the mappings and the data object
length to match it exactly.

Divergences from Pulsar, all deliberate: the segment metadata above instead of a protobuf;
the decoder requires ``header_len = 128`` and zero header padding (Pulsar skips whatever
``header_len`` says); part numbers start at 1 with the index in a separate object, as
Pulsar's implementation ships it (not the "index in part 1" variant of its proposal).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tierlog.formats.crc import crc32
from tierlog.formats.errors import (
    BadMagicError,
    BadPaddingError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    LayoutMismatchError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.segment import FILE_HEADER_SIZE, INDEX_RECORD_DTYPE, INDEX_RECORD_SIZE

FORMAT_VERSION = 1
"""Stored in both objects' user metadata (``FORMAT_VERSION_KEY``) and in segment metadata."""
FORMAT_VERSION_KEY = "tierlog-offload-format-version"

BLOCK_MAGIC = 0xFBDBABCB
BLOCK_HEADER_SIZE = 128
ENTRY_HEADER_SIZE = 12  # len i32 + entry id i64
MIN_BLOCK_OVERHEAD = BLOCK_HEADER_SIZE + ENTRY_HEADER_SIZE  # 140: a block holds >= 1 entry
PADDING = b"\xfe\xdc\xde\xad"
MIN_BLOCK_SIZE = 5 * 1024 * 1024
MAX_BLOCK_SIZE = 5 * 1024 * 1024 * 1024  # S3's largest part
DEFAULT_BLOCK_SIZE = 64 * 1024 * 1024
MAX_BLOCKS = 10_000  # S3's largest part number
MAX_ENTRY_LENGTH = (1 << 31) - 1
MAX_ENTRY_ID = (1 << 63) - 1

INDEX_MAGIC = 0xDE47DE47
OFFLOAD_INDEX_HEADER_SIZE = 32
MAPPING_SIZE = 20
METADATA_MAGIC = b"OSSM"
METADATA_VERSION = 1
METADATA_HEADER_SIZE = 36
METADATA_TRAILER_SIZE = 8
CHUNK_CRC_SIZE = 4
MAX_INDEX_LENGTH = (1 << 31) - 1

_BLOCK_HEADER = struct.Struct(">Iqqq")  # magic, header len, block len, first entry id
_ENTRY_HEADER = struct.Struct(">iq")
_OFFLOAD_INDEX_HEADER = struct.Struct(">Iiqqii")
_MAPPING = struct.Struct(">qiq")
_METADATA_HEADER = struct.Struct(">4sHHQQQI")
_U32 = struct.Struct(">I")
_BLOCK_HEADER_PAD = bytes(BLOCK_HEADER_SIZE - _BLOCK_HEADER.size)
assert _ENTRY_HEADER.size == ENTRY_HEADER_SIZE
assert _OFFLOAD_INDEX_HEADER.size == OFFLOAD_INDEX_HEADER_SIZE
assert _MAPPING.size == MAPPING_SIZE
assert _METADATA_HEADER.size == METADATA_HEADER_SIZE


# -- block layout ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """One block of a data object: which entries it holds and where it goes."""

    part_number: int  # from 1
    offset: int  # byte offset of the block in the data object
    length: int  # the whole block, header and padding included
    first_entry: int  # index of its first entry in the segment's entry list
    entry_count: int
    first_entry_id: int


def padding(length: int) -> bytes:
    """``length`` bytes of the FE DC DE AD pattern, starting with FE."""
    return (PADDING * (length // 4 + 1))[:length]


def required_block_size(largest_entry: int) -> int:
    """The smallest block size that can hold an entry of ``largest_entry`` payload bytes."""
    return max(MIN_BLOCK_SIZE, largest_entry + MIN_BLOCK_OVERHEAD)


def check_block_size(block_size: int) -> int:
    """Raise ``InvalidSizeError`` unless ``block_size`` is a valid configured block size."""
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise InvalidSizeError(f"block size must be an int, not {type(block_size).__name__}")
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidSizeError(
            f"block size {block_size} outside [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}] bytes"
        )
    return block_size


def plan_blocks(
    entry_ids: Sequence[int] | np.ndarray, entry_sizes: Sequence[int] | np.ndarray, block_size: int
) -> list[BlockPlan]:
    """Cut entries into blocks greedily, as Pulsar does: each block holds as many whole
    entries as fit; every block but the last is ``block_size`` bytes, the last one exactly
    what it holds. Raise ``InvalidSizeError`` if an entry cannot fit a block."""
    ids = np.asarray(entry_ids, dtype=np.int64)
    sizes = np.asarray(entry_sizes, dtype=np.int64)
    n = len(sizes)
    if n == 0:
        raise InvalidSizeError("a data object needs at least one entry")
    if len(ids) != n:
        raise InvalidSizeError(f"{len(ids)} entry ids for {n} entry sizes")
    if sizes.min() < 0 or sizes.max() > MAX_ENTRY_LENGTH:
        raise InvalidSizeError(f"entry sizes must be in [0, {MAX_ENTRY_LENGTH}]")
    if ids.min() < 0:
        raise InvalidSizeError("entry ids must be >= 0")
    if block_size < BLOCK_HEADER_SIZE + ENTRY_HEADER_SIZE + int(sizes.max()):
        big = int(np.argmax(sizes))
        raise InvalidSizeError(
            f"entry {int(ids[big])} of {int(sizes[big])} bytes does not fit a block of "
            f"{block_size} bytes (needs at least {int(sizes[big]) + MIN_BLOCK_OVERHEAD})"
        )
    # end[i]: payload-area bytes of entries 0..i (12-byte entry headers included)
    end = np.cumsum(sizes + ENTRY_HEADER_SIZE)
    room = block_size - BLOCK_HEADER_SIZE
    plans: list[BlockPlan] = []
    first = 0
    offset = 0
    while first < n:
        base = int(end[first - 1]) if first else 0
        stop = int(np.searchsorted(end, base + room, side="right"))  # entries [first, stop) fit
        count = stop - first
        length = block_size if stop < n else BLOCK_HEADER_SIZE + int(end[-1]) - base
        plans.append(BlockPlan(len(plans) + 1, offset, length, first, count, int(ids[first])))
        offset += length
        first = stop
    if len(plans) > MAX_BLOCKS:
        raise InvalidSizeError(
            f"{len(plans)} blocks of {block_size} bytes: more than {MAX_BLOCKS} parts"
        )
    return plans


def data_object_length(plans: Sequence[BlockPlan]) -> int:
    return plans[-1].offset + plans[-1].length if plans else 0


# -- blocks ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockHeader:
    header_length: int
    block_length: int
    first_entry_id: int


def encode_block_header(block_length: int, first_entry_id: int) -> bytes:
    """The 128 bytes of a block header."""
    if not BLOCK_HEADER_SIZE <= block_length <= MAX_BLOCK_SIZE:
        raise InvalidSizeError(f"block length {block_length} out of range")
    if not 0 <= first_entry_id <= MAX_ENTRY_ID:
        raise InvalidSizeError(f"entry id {first_entry_id} out of range")
    head = _BLOCK_HEADER.pack(BLOCK_MAGIC, BLOCK_HEADER_SIZE, block_length, first_entry_id)
    return head + _BLOCK_HEADER_PAD


def decode_block_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> BlockHeader:
    """Decode and check a block header (magic, 128-byte length, zero padding)."""
    if len(buf) - offset < BLOCK_HEADER_SIZE:
        raise TruncatedError(f"block header needs {BLOCK_HEADER_SIZE} bytes")
    magic, header_len, block_len, first_id = _BLOCK_HEADER.unpack_from(buf, offset)
    if magic != BLOCK_MAGIC:
        raise BadMagicError(f"block magic {magic:#010x}, expected {BLOCK_MAGIC:#010x}")
    if header_len != BLOCK_HEADER_SIZE:
        raise UnsupportedError(f"block header length {header_len}, only 128 is written")
    if not BLOCK_HEADER_SIZE + ENTRY_HEADER_SIZE <= block_len <= MAX_BLOCK_SIZE:
        raise InvalidSizeError(f"block length {block_len} out of range")
    if first_id < 0:
        raise InvalidSizeError(f"negative first entry id {first_id}")
    pad = bytes(buf[offset + _BLOCK_HEADER.size : offset + BLOCK_HEADER_SIZE])
    if pad != _BLOCK_HEADER_PAD:
        raise BadPaddingError("block header padding is not zero")
    return BlockHeader(header_len, block_len, first_id)


def encode_entry_header(length: int, entry_id: int) -> bytes:
    if not 0 <= length <= MAX_ENTRY_LENGTH:
        raise InvalidSizeError(f"entry length {length} out of range")
    if not 0 <= entry_id <= MAX_ENTRY_ID:
        raise InvalidSizeError(f"entry id {entry_id} out of range")
    return _ENTRY_HEADER.pack(length, entry_id)


def decode_entry_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int]:
    """(payload length, entry id) of the entry header at ``offset``."""
    if len(buf) - offset < ENTRY_HEADER_SIZE:
        raise TruncatedError("entry header needs 12 bytes")
    length, entry_id = _ENTRY_HEADER.unpack_from(buf, offset)
    if length < 0:
        raise InvalidSizeError(f"negative entry length {length}")
    if entry_id < 0:
        raise InvalidSizeError(f"negative entry id {entry_id}")
    return length, entry_id


def frame_block(
    buf: bytearray | memoryview,
    plan: BlockPlan,
    entry_ids: Sequence[int] | np.ndarray,
    entry_sizes: Sequence[int] | np.ndarray,
) -> list[tuple[int, int]]:
    """Write a block's header, entry headers and padding into ``buf`` (``plan.length``
    bytes) and return the ``[start, end)`` slots where the entry payloads go, so a caller can
    read the chunks straight into place (one ``preadv`` for the whole block)."""
    view = memoryview(buf).cast("B")
    if len(view) != plan.length:
        raise InvalidSizeError(f"block buffer of {len(view)} bytes for a {plan.length}-byte block")
    view[:BLOCK_HEADER_SIZE] = encode_block_header(plan.length, plan.first_entry_id)
    pos = BLOCK_HEADER_SIZE
    slots: list[tuple[int, int]] = []
    pack = _ENTRY_HEADER.pack_into
    for i in range(plan.first_entry, plan.first_entry + plan.entry_count):
        size = int(entry_sizes[i])
        pack(view, pos, size, int(entry_ids[i]))
        pos += ENTRY_HEADER_SIZE
        slots.append((pos, pos + size))
        pos += size
    if pos > plan.length:
        raise InvalidSizeError(f"entries need {pos} bytes, block holds {plan.length}")
    view[pos:] = padding(plan.length - pos)
    return slots


def encode_block(
    plan: BlockPlan, entry_ids: Sequence[int], payloads: Sequence[bytes | memoryview]
) -> bytes:
    """A whole block from in-memory payloads (all entries of the segment, indexed as in the
    plan)."""
    sizes = [len(p) for p in payloads]
    buf = bytearray(plan.length)
    slots = frame_block(buf, plan, entry_ids, sizes)
    for (start, end), i in zip(
        slots, range(plan.first_entry, plan.first_entry + plan.entry_count), strict=True
    ):
        buf[start:end] = payloads[i]
    return bytes(buf)


@dataclass(frozen=True, slots=True)
class BlockEntry:
    entry_id: int
    position: int  # of the payload within the block
    length: int


def iter_block_entries(buf: bytes | bytearray | memoryview) -> Iterator[BlockEntry]:
    """Check a whole block and yield its entries; raise a ``FormatError`` on anything wrong:
    header, lengths, entry ids not increasing from the header's, a block without entries, or
    padding that is not the pattern."""
    view = memoryview(buf).cast("B")
    header = decode_block_header(view)
    if header.block_length != len(view):
        raise InvalidSizeError(f"block says {header.block_length} bytes, got {len(view)}")
    pos = BLOCK_HEADER_SIZE
    end = len(view)
    expected = header.first_entry_id
    previous = -1
    count = 0
    while end - pos >= ENTRY_HEADER_SIZE:
        (length,) = struct.unpack_from(">i", view, pos)
        if length < 0:
            break  # the padding pattern reads as a negative length: padding starts here
        _, entry_id = decode_entry_header(view, pos)
        if count == 0 and entry_id != expected:
            raise FormatError(f"first entry id {entry_id}, block header says {expected}")
        if entry_id <= previous:
            raise FormatError(f"entry id {entry_id} after {previous}: not increasing")
        if pos + ENTRY_HEADER_SIZE + length > end:
            raise TruncatedError(f"entry {entry_id} of {length} bytes runs past the block")
        yield BlockEntry(entry_id, pos + ENTRY_HEADER_SIZE, length)
        previous = entry_id
        count += 1
        pos += ENTRY_HEADER_SIZE + length
    if count == 0:
        raise InvalidSizeError("block holds no entry")
    if bytes(view[pos:]) != padding(end - pos):
        raise BadPaddingError(f"block padding at {pos} is not the FEDCDEAD pattern")


# -- segment metadata and index object -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockMapping:
    first_entry_id: int
    part_number: int
    offset: int


@dataclass(frozen=True)
class SegmentMetadata:
    """What the index object says about the segment: its range and its index records."""

    first_offset: int
    next_offset: int
    segment_size: int
    records: np.ndarray  # INDEX_RECORD_DTYPE, one per chunk
    chunk_crcs: np.ndarray | None = None  # uint32, one per chunk; needed to encode

    @property
    def chunk_count(self) -> int:
        return len(self.records)

    def chunk_sizes(self) -> np.ndarray:
        """Each chunk's size in bytes (int64), from consecutive file positions."""
        positions = self.records["position"].astype(np.int64)
        return np.diff(positions, append=np.int64(self.segment_size))


def check_records(
    records: np.ndarray, first_offset: int, next_offset: int, segment_size: int
) -> None:
    """Raise ``FormatError`` unless the records describe a whole segment: at least one chunk,
    the first at the segment's first offset and file position 8, chunk ids and positions
    strictly increasing, all below ``next_offset`` / ``segment_size``, epochs not decreasing."""
    if len(records) == 0:
        raise InvalidSizeError("segment metadata holds no index record")
    ids = records["chunk_id"]
    positions = records["position"].astype(np.int64)
    if int(ids[0]) != first_offset:
        raise FormatError(f"first chunk id {int(ids[0])} != segment first offset {first_offset}")
    if int(positions[0]) != FILE_HEADER_SIZE:
        raise FormatError(f"first chunk at position {int(positions[0])}, expected 8")
    if len(records) > 1:
        if not bool(np.all(ids[1:] > ids[:-1])):
            raise FormatError("index records: chunk ids not strictly increasing")
        if not bool(np.all(positions[1:] > positions[:-1])):
            raise FormatError("index records: positions not strictly increasing")
        epochs = records["epoch"]
        if not bool(np.all(epochs[1:] >= epochs[:-1])):
            raise FormatError("index records: epochs decreasing")
    if int(ids[-1]) > MAX_ENTRY_ID:
        raise InvalidSizeError(f"chunk id {int(ids[-1])} above {MAX_ENTRY_ID}")
    if next_offset <= int(ids[-1]):
        raise FormatError(f"next offset {next_offset} not after last chunk {int(ids[-1])}")
    if segment_size <= int(positions[-1]):
        raise FormatError(f"segment size {segment_size} not past the last chunk")
    if not bool(np.all(records["chunk_type"] <= 2)):
        raise FormatError("index records: unknown chunk type")


@dataclass(frozen=True)
class OffloadIndex:
    """The decoded index object."""

    data_object_length: int
    data_header_length: int
    blocks: tuple[BlockMapping, ...]
    metadata: SegmentMetadata

    @property
    def block_size(self) -> int:
        """Length of every block but the last (the last one's length if there is one)."""
        if len(self.blocks) > 1:
            return self.blocks[1].offset - self.blocks[0].offset
        return self.data_object_length


def records_from_index_file_bytes(buf: bytes | memoryview) -> np.ndarray:
    """Records (a read-only structured array) from raw 29-byte records without a file header."""
    if len(buf) % INDEX_RECORD_SIZE:
        raise TruncatedError(f"{len(buf)} bytes is not a whole number of index records")
    return np.frombuffer(buf, dtype=INDEX_RECORD_DTYPE)


def build_index(metadata: SegmentMetadata, block_size: int) -> tuple[OffloadIndex, list[BlockPlan]]:
    """The index object for a segment cut into blocks of ``block_size``, and the plans."""
    check_records(
        metadata.records, metadata.first_offset, metadata.next_offset, metadata.segment_size
    )
    plans = plan_blocks(metadata.records["chunk_id"], metadata.chunk_sizes(), block_size)
    blocks = tuple(BlockMapping(p.first_entry_id, p.part_number, p.offset) for p in plans)
    index = OffloadIndex(data_object_length(plans), BLOCK_HEADER_SIZE, blocks, metadata)
    return index, plans


def records_and_crcs(meta: SegmentMetadata) -> bytes:
    """The index records then the chunk CRCs of an index object's metadata, as stored
    (both offload formats)."""
    n = meta.chunk_count
    if meta.chunk_crcs is None or len(meta.chunk_crcs) != n:
        raise InvalidSizeError(f"{n} chunks need {n} chunk CRCs")
    records = np.ascontiguousarray(meta.records, dtype=INDEX_RECORD_DTYPE).tobytes()
    return records + np.ascontiguousarray(meta.chunk_crcs, dtype=">u4").tobytes()


def encode_index(index: OffloadIndex) -> bytes:
    """The index object's bytes."""
    meta = index.metadata
    records = records_and_crcs(meta)
    metadata_len = METADATA_HEADER_SIZE + len(records) + METADATA_TRAILER_SIZE
    total = OFFLOAD_INDEX_HEADER_SIZE + metadata_len + MAPPING_SIZE * len(index.blocks)
    if total > MAX_INDEX_LENGTH:
        raise InvalidSizeError(f"index object of {total} bytes is too large")
    mappings = b"".join(
        _MAPPING.pack(b.first_entry_id, b.part_number, b.offset) for b in index.blocks
    )
    head = _OFFLOAD_INDEX_HEADER.pack(
        INDEX_MAGIC,
        total,
        index.data_object_length,
        index.data_header_length,
        len(index.blocks),
        metadata_len,
    ) + _METADATA_HEADER.pack(
        METADATA_MAGIC,
        METADATA_VERSION,
        0,
        meta.first_offset,
        meta.next_offset,
        meta.segment_size,
        meta.chunk_count,
    )
    covered = head + records + _U32.pack(crc32(mappings))
    return covered + _U32.pack(crc32(covered)) + mappings


def decode_index(buf: bytes | bytearray | memoryview) -> OffloadIndex:
    """Decode and fully check an index object; raise a ``FormatError`` subclass on any
    corruption (bad magic or version, lengths, CRCs, records, or a block layout that does not
    follow from the records)."""
    view = memoryview(buf).cast("B")
    if len(view) < OFFLOAD_INDEX_HEADER_SIZE:
        raise TruncatedError(f"index object needs {OFFLOAD_INDEX_HEADER_SIZE} header bytes")
    magic, index_len, data_len, header_len, block_count, metadata_len = (
        _OFFLOAD_INDEX_HEADER.unpack_from(view)
    )
    if magic != INDEX_MAGIC:
        raise BadMagicError(f"index magic {magic:#010x}, expected {INDEX_MAGIC:#010x}")
    if index_len != len(view):
        kind = TruncatedError if index_len > len(view) else InvalidSizeError
        raise kind(f"index object says {index_len} bytes, got {len(view)}")
    if header_len != BLOCK_HEADER_SIZE:
        raise UnsupportedError(f"data header length {header_len}, only 128 is written")
    if block_count < 1 or block_count > MAX_BLOCKS:
        raise InvalidSizeError(f"block count {block_count} out of range")
    if metadata_len < METADATA_HEADER_SIZE + METADATA_TRAILER_SIZE:
        raise InvalidSizeError(f"segment metadata length {metadata_len} too small")
    if OFFLOAD_INDEX_HEADER_SIZE + metadata_len + MAPPING_SIZE * block_count != index_len:
        raise InvalidSizeError("index length does not match metadata length and block count")
    meta_end = OFFLOAD_INDEX_HEADER_SIZE + metadata_len
    crc_at = meta_end - 4
    (stored_crc,) = _U32.unpack_from(view, crc_at)
    actual = crc32(view[:crc_at])
    if actual != stored_crc:
        raise CrcMismatchError(f"index CRC {actual:#010x} != stored {stored_crc:#010x}")
    (mappings_crc,) = _U32.unpack_from(view, crc_at - 4)
    mapping_bytes = view[meta_end:]
    if crc32(mapping_bytes) != mappings_crc:
        raise CrcMismatchError("index mappings CRC mismatch")
    m_magic, version, reserved, first, next_offset, seg_size, count = _METADATA_HEADER.unpack_from(
        view, OFFLOAD_INDEX_HEADER_SIZE
    )
    if m_magic != METADATA_MAGIC:
        raise BadMagicError(f"segment metadata magic {m_magic!r}, expected {METADATA_MAGIC!r}")
    if version != METADATA_VERSION or reserved != 0:
        raise UnsupportedError(f"segment metadata version {version} (flags {reserved})")
    records_at = OFFLOAD_INDEX_HEADER_SIZE + METADATA_HEADER_SIZE
    crcs_at = records_at + count * INDEX_RECORD_SIZE
    if crcs_at + count * CHUNK_CRC_SIZE + METADATA_TRAILER_SIZE != meta_end:
        raise InvalidSizeError(f"{count} index records do not fill the segment metadata")
    records = np.frombuffer(bytes(view[records_at:crcs_at]), dtype=INDEX_RECORD_DTYPE)
    crcs = np.frombuffer(bytes(view[crcs_at : crcs_at + count * CHUNK_CRC_SIZE]), dtype=">u4")
    check_records(records, first, next_offset, seg_size)
    metadata = SegmentMetadata(first, next_offset, seg_size, records, crcs)
    blocks = tuple(
        BlockMapping(*_MAPPING.unpack_from(mapping_bytes, i * MAPPING_SIZE))
        for i in range(block_count)
    )
    index = OffloadIndex(data_len, header_len, blocks, metadata)
    try:
        expected, _ = build_index(metadata, index.block_size)
    except InvalidSizeError as exc:
        raise LayoutMismatchError(f"block layout impossible: {exc}") from exc
    if expected.blocks != blocks or expected.data_object_length != data_len:
        raise LayoutMismatchError(
            "block mappings or data object length do not follow from the records "
            f"and a block size of {index.block_size}"
        )
    return index


# -- locating chunks -------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkLocations:
    """Where every chunk's payload is in the data object (arrays in record order)."""

    chunk_ids: np.ndarray  # uint64
    timestamps: np.ndarray  # int64
    chunk_types: np.ndarray  # uint8
    data_offsets: np.ndarray  # int64: payload start in the data object
    sizes: np.ndarray  # int64: payload (chunk) length
    crcs: np.ndarray  # uint32: CRC-32 of the whole chunk
    blocks: np.ndarray  # int64: the block (part number - 1) holding the chunk
    stored_starts: np.ndarray  # int64: where the chunk's stored entry (or frame) starts
    stored_sizes: np.ndarray  # int64: bytes of the stored entry (or frame)


def chunk_locations(index: OffloadIndex) -> ChunkLocations:
    """Every chunk's byte range in the data object, from the index alone."""
    meta = index.metadata
    if meta.chunk_crcs is None:
        raise InvalidSizeError("chunk locations need the chunk CRCs")
    sizes = meta.chunk_sizes()
    plans = plan_blocks(meta.records["chunk_id"], sizes, index.block_size)
    offsets = np.empty(len(sizes), dtype=np.int64)
    blocks = np.empty(len(sizes), dtype=np.int64)
    for plan in plans:
        lo, hi = plan.first_entry, plan.first_entry + plan.entry_count
        blocks[lo:hi] = plan.part_number - 1
        steps = sizes[lo:hi] + ENTRY_HEADER_SIZE
        starts = np.concatenate(([0], np.cumsum(steps)[:-1]))
        offsets[lo:hi] = plan.offset + BLOCK_HEADER_SIZE + ENTRY_HEADER_SIZE + starts
    return ChunkLocations(
        meta.records["chunk_id"].astype(np.uint64),
        meta.records["timestamp"].astype(np.int64),
        meta.records["chunk_type"].astype(np.uint8),
        offsets,
        sizes,
        np.asarray(meta.chunk_crcs, dtype=np.uint32),
        blocks,
        offsets - ENTRY_HEADER_SIZE,
        sizes + ENTRY_HEADER_SIZE,
    )
