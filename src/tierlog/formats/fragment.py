"""The fragment object: whole consecutive Osiris chunks of one segment, as stored remotely.

Layout (all integers big-endian)::

    header   "TLFR" + u32 version                                     8 bytes
    chunks   the chunk bytes, verbatim, back to back                  data_size bytes
    index    "TLFI" + u32 version, then one 48-byte record per chunk
    trailer  96 bytes, fixed (see ``TRAILER``), ends with "TLFT"

A reader gets the trailer with one suffix-range GET of ``TRAILER_SIZE`` bytes. A reader that
already knows the data size and chunk count (from the manifest entry) fetches the index with
one ranged GET of ``index_range(data_size, chunk_count)``. The trailer CRC covers the index
header, the index records and the trailer fields before it, so trailer and index are checked
together; each chunk carries its own CRC over its entry data, repeated in its index record.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierlog.formats.chunk import HEADER_SIZE as CHUNK_HEADER_SIZE
from tierlog.formats.chunk import check_crc
from tierlog.formats.chunk import decode_header as decode_chunk_header
from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

FRAGMENT_MAGIC = b"TLFR"
INDEX_MAGIC = b"TLFI"
TRAILER_MAGIC = b"TLFT"
FRAGMENT_VERSION = 1

HEADER = struct.Struct(">4sI")
HEADER_SIZE = HEADER.size  # 8
FRAGMENT_INDEX_HEADER = struct.Struct(">4sI")
FRAGMENT_INDEX_HEADER_SIZE = FRAGMENT_INDEX_HEADER.size  # 8

# chunk id, timestamp, epoch, position in the fragment, chunk size, num records,
# chunk data CRC, num entries, chunk type, 1 reserved byte.
INDEX_RECORD = struct.Struct(">QqQQIIIHBx")
INDEX_RECORD_SIZE = INDEX_RECORD.size  # 48

# first offset, next offset, min ts, max ts, max epoch, segment first offset, position in the
# segment, index start, data size, chunk count, sequence number in the segment, reserved,
# CRC, version, magic.
TRAILER = struct.Struct(">QQqqQQQQQIII I I4s")
TRAILER_SIZE = TRAILER.size  # 96
_TRAILER_CRC_AT = TRAILER_SIZE - 12  # the CRC covers the trailer bytes before this position

INDEX_DTYPE = np.dtype(
    {
        "names": [
            "chunk_id",
            "timestamp",
            "epoch",
            "position",
            "size",
            "num_records",
            "crc",
            "num_entries",
            "chunk_type",
        ],
        "formats": [">u8", ">i8", ">u8", ">u8", ">u4", ">u4", ">u4", ">u2", "u1"],
        "offsets": [0, 8, 16, 24, 32, 36, 40, 44, 46],
        "itemsize": INDEX_RECORD_SIZE,
    }
)

MAX_U32 = 0xFFFFFFFF
MAX_U64 = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True, slots=True)
class FragmentChunkInfo:
    """What the fragment index records about one chunk (taken from its Osiris header).

    ``size`` is the whole chunk: 48-byte header + bloom filter + data + trailer.
    """

    chunk_id: int
    timestamp: int
    epoch: int
    size: int
    num_records: int
    crc: int
    chunk_type: int = 0
    num_entries: int = 1


@dataclass(frozen=True, slots=True)
class FragmentPlacement:
    """Where a fragment's chunks came from in the local log."""

    seq_no: int  # zero-based sequence number of the fragment within its segment
    segment_first_offset: int  # first offset (file name) of the segment
    segment_position: int  # byte position of the fragment's first chunk in the segment


@dataclass(frozen=True, slots=True)
class FragmentTrailer:
    """The fixed-size trailer: everything a manifest entry and a reader need to know."""

    first_offset: int
    next_offset: int
    min_timestamp: int
    max_timestamp: int
    max_epoch: int
    segment_first_offset: int
    segment_position: int
    index_start: int
    data_size: int
    chunk_count: int
    seq_no: int
    crc: int

    @property
    def total_size(self) -> int:
        """Size of the whole fragment object."""
        return (
            self.index_start
            + FRAGMENT_INDEX_HEADER_SIZE
            + self.chunk_count * INDEX_RECORD_SIZE
            + (TRAILER_SIZE)
        )


def index_range(data_size: int, chunk_count: int) -> tuple[int, int]:
    """Byte range ``[start, end)`` of index header + records, from manifest facts alone."""
    start = HEADER_SIZE + data_size
    return start, start + FRAGMENT_INDEX_HEADER_SIZE + chunk_count * INDEX_RECORD_SIZE


def fragment_size(data_size: int, chunk_count: int) -> int:
    """Total object size of a fragment holding ``data_size`` chunk bytes in ``chunk_count``."""
    return index_range(data_size, chunk_count)[1] + TRAILER_SIZE


def encode_fragment(
    placement: FragmentPlacement,
    chunks: Sequence[bytes | bytearray | memoryview],
    infos: Sequence[FragmentChunkInfo],
) -> tuple[list[bytes | bytearray | memoryview], FragmentTrailer]:
    """Build a fragment as a list of buffers to write in order (chunk buffers are not copied).

    Returns the parts and the trailer (whose fields become the manifest entry).
    Raises ``InvalidSizeError`` when chunks and infos disagree or ids are not contiguous.
    """
    if not chunks or len(chunks) != len(infos):
        raise InvalidSizeError(f"need one info per chunk: {len(chunks)} chunks, {len(infos)} infos")
    position = HEADER_SIZE
    records = bytearray(FRAGMENT_INDEX_HEADER.pack(INDEX_MAGIC, FRAGMENT_VERSION))
    expected_id = infos[0].chunk_id
    for buf, info in zip(chunks, infos, strict=True):
        size = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
        if size != info.size or not CHUNK_HEADER_SIZE <= size <= MAX_U32:
            raise InvalidSizeError(f"chunk {info.chunk_id}: {size} bytes, info says {info.size}")
        if info.chunk_id != expected_id:
            raise InvalidSizeError(f"chunk {info.chunk_id} does not follow offset {expected_id}")
        if info.num_records < 1:
            raise InvalidSizeError(f"chunk {info.chunk_id} holds no records")
        records += INDEX_RECORD.pack(
            info.chunk_id,
            info.timestamp,
            info.epoch,
            position,
            size,
            info.num_records,
            info.crc,
            info.num_entries,
            info.chunk_type,
        )
        position += size
        expected_id = info.chunk_id + info.num_records
    if expected_id > MAX_U64:
        raise InvalidSizeError(f"next offset {expected_id} does not fit 64 bits")
    data_size = position - HEADER_SIZE
    fields = trailer_fields(infos, expected_id, placement, position, data_size)
    crc = _metadata_crc(records, fields)
    trailer_bytes = TRAILER.pack(*fields, 0, crc, FRAGMENT_VERSION, TRAILER_MAGIC)
    parts: list[bytes | bytearray | memoryview] = [HEADER.pack(FRAGMENT_MAGIC, FRAGMENT_VERSION)]
    parts.extend(chunks)
    parts.append(bytes(records))
    parts.append(trailer_bytes)
    return parts, FragmentTrailer(*fields, crc=crc)


TrailerFields = tuple[int, int, int, int, int, int, int, int, int, int, int]


def trailer_fields(
    infos: Sequence[FragmentChunkInfo],
    next_offset: int,
    placement: FragmentPlacement,
    index_start: int,
    data_size: int,
) -> TrailerFields:
    """The trailer's metadata fields, in trailer order (every fragment version has them):
    first / next offset, min / max timestamp, max epoch, where the fragment sits in its
    segment, where its index starts, data size, chunk count, sequence number."""
    timestamps = [i.timestamp for i in infos]
    return (
        infos[0].chunk_id,
        next_offset,
        min(timestamps),
        max(timestamps),
        max(i.epoch for i in infos),
        placement.segment_first_offset,
        placement.segment_position,
        index_start,
        data_size,
        len(infos),
        placement.seq_no,
    )


def _metadata_crc(index: bytes | bytearray | memoryview, fields: tuple[int, ...]) -> int:
    """The trailer CRC: over the index (header and records) and the trailer fields
    before the CRC (``fields`` are the first eleven, in trailer order)."""
    body = TRAILER.pack(*fields, 0, 0, FRAGMENT_VERSION, TRAILER_MAGIC)[:_TRAILER_CRC_AT]
    return zlib.crc32(body, zlib.crc32(index))


def decode_trailer(tail: bytes | bytearray | memoryview) -> FragmentTrailer:
    """Decode the trailer from the last bytes of a fragment (at least ``TRAILER_SIZE``).

    Checks magic, version and that the sizes are consistent; the CRC needs the index too
    and is checked by ``decode_index``.
    """
    view = memoryview(tail)
    if view.nbytes < TRAILER_SIZE:
        raise TruncatedError(f"fragment trailer needs {TRAILER_SIZE} bytes, got {view.nbytes}")
    fields = TRAILER.unpack_from(view, view.nbytes - TRAILER_SIZE)
    (
        first,
        next_offset,
        min_ts,
        max_ts,
        max_epoch,
        seg_first,
        seg_pos,
        index_start,
        data_size,
        count,
        seq_no,
        reserved,
        crc,
        version,
        magic,
    ) = fields
    if magic != TRAILER_MAGIC:
        raise BadMagicError(f"not a fragment trailer: magic {magic!r}")
    if version != FRAGMENT_VERSION:
        raise UnsupportedError(f"fragment version {version} not supported")
    if reserved != 0:
        raise UnsupportedError(f"fragment trailer reserved field is {reserved:#x}, not 0")
    if count < 1 or data_size < count * CHUNK_HEADER_SIZE or index_start != HEADER_SIZE + data_size:
        raise InvalidSizeError(
            f"fragment trailer sizes impossible: {count} chunks, {data_size} bytes, "
            f"index at {index_start}"
        )
    if next_offset - first < count or min_ts > max_ts:
        raise InvalidSizeError(f"fragment trailer range impossible: [{first}, {next_offset})")
    return FragmentTrailer(
        first,
        next_offset,
        min_ts,
        max_ts,
        max_epoch,
        seg_first,
        seg_pos,
        index_start,
        data_size,
        count,
        seq_no,
        crc,
    )


class FragmentIndex:
    """The decoded index records of one fragment, as a read-only numpy structured array."""

    __slots__ = ("records", "trailer")

    def __init__(self, records: np.ndarray, trailer: FragmentTrailer) -> None:
        self.records = records
        self.trailer = trailer

    def __len__(self) -> int:
        return len(self.records)

    def chunk(self, i: int) -> tuple[FragmentChunkInfo, int]:
        """The chunk at index ``i`` and its byte position in the fragment."""
        r = self.records[i]
        info = FragmentChunkInfo(
            chunk_id=int(r["chunk_id"]),
            timestamp=int(r["timestamp"]),
            epoch=int(r["epoch"]),
            size=int(r["size"]),
            num_records=int(r["num_records"]),
            crc=int(r["crc"]),
            chunk_type=int(r["chunk_type"]),
            num_entries=int(r["num_entries"]),
        )
        return info, int(r["position"])

    def find_offset(self, offset: int) -> int | None:
        """Index of the chunk holding ``offset``, or None when outside the fragment."""
        t = self.trailer
        if not t.first_offset <= offset < t.next_offset:
            return None
        ids = self.records["chunk_id"]
        return int(np.searchsorted(ids, np.uint64(offset), side="right")) - 1

    def find_timestamp(self, timestamp: int) -> int | None:
        """Index of the first chunk with timestamp >= ``timestamp`` (None: all are older).

        Timestamps never decrease within a stream, so the array is sorted.
        """
        i = int(np.searchsorted(self.records["timestamp"], np.int64(timestamp), side="left"))
        return i if i < len(self.records) else None


def decode_index(
    index_bytes: bytes | bytearray | memoryview, trailer: FragmentTrailer
) -> FragmentIndex:
    """Decode and check the index (the bytes of ``index_range``, or more) against its trailer.

    The CRC covers index and trailer, so this also authenticates the trailer.
    """
    view = memoryview(index_bytes)
    length = FRAGMENT_INDEX_HEADER_SIZE + trailer.chunk_count * INDEX_RECORD_SIZE
    if view.nbytes < length:
        raise TruncatedError(f"fragment index needs {length} bytes, got {view.nbytes}")
    magic, version = FRAGMENT_INDEX_HEADER.unpack_from(view, 0)
    if magic != INDEX_MAGIC:
        raise BadMagicError(f"not a fragment index: magic {magic!r}")
    if version != FRAGMENT_VERSION:
        raise UnsupportedError(f"fragment index version {version} not supported")
    region = view[:length]
    fields = (
        trailer.first_offset,
        trailer.next_offset,
        trailer.min_timestamp,
        trailer.max_timestamp,
        trailer.max_epoch,
        trailer.segment_first_offset,
        trailer.segment_position,
        trailer.index_start,
        trailer.data_size,
        trailer.chunk_count,
        trailer.seq_no,
    )
    crc = _metadata_crc(region, fields)
    if crc != trailer.crc:
        raise CrcMismatchError(f"fragment metadata CRC {crc:#010x} != stored {trailer.crc:#010x}")
    records = np.frombuffer(region, dtype=INDEX_DTYPE, count=trailer.chunk_count, offset=8)
    _check_index(records, trailer)
    return FragmentIndex(records, trailer)


def _check_index(records: np.ndarray, t: FragmentTrailer) -> None:
    """Reject an index (with a valid CRC) whose records contradict each other or the trailer."""
    ids = records["chunk_id"].astype(np.uint64)
    nums = records["num_records"].astype(np.uint64)
    sizes = records["size"].astype(np.uint64)
    pos = records["position"].astype(np.uint64)
    ends = pos + sizes
    ok = (
        int(ids[0]) == t.first_offset
        and int(ids[-1]) + int(nums[-1]) == t.next_offset
        and bool(np.all(nums >= 1))
        and bool(np.all(sizes >= CHUNK_HEADER_SIZE))
        and bool(np.all(ids[1:] == ids[:-1] + nums[:-1]))
        and int(pos[0]) == HEADER_SIZE
        and bool(np.all(pos[1:] == ends[:-1]))
        and int(ends[-1]) == t.index_start
    )
    if not ok:
        raise InvalidSizeError(
            f"fragment index of [{t.first_offset}, {t.next_offset}) inconsistent"
        )


def decode_fragment(data: bytes | bytearray | memoryview) -> FragmentIndex:
    """Check a whole fragment object's header, trailer, index and metadata CRC; return
    its index (chunks are located by it; their own bytes are not checked here)."""
    view = memoryview(data).cast("B")
    if view.nbytes < HEADER_SIZE + TRAILER_SIZE:
        raise TruncatedError(f"fragment of {view.nbytes} bytes is too short")
    magic, version = HEADER.unpack_from(view, 0)
    if magic != FRAGMENT_MAGIC:
        raise BadMagicError(f"not a fragment: magic {magic!r}")
    if version != FRAGMENT_VERSION:
        raise UnsupportedError(f"fragment version {version} not supported")
    trailer = decode_trailer(view)
    if trailer.total_size != view.nbytes:
        raise InvalidSizeError(
            f"fragment is {view.nbytes} bytes, trailer says {trailer.total_size}"
        )
    return decode_index(view[trailer.index_start :], trailer)


def validate_fragment(
    data: bytes | bytearray | memoryview, *, check_chunks: bool = True
) -> FragmentIndex:
    """Validate a whole fragment object; return its index.

    Checks header, trailer, index and metadata CRC; with ``check_chunks`` also each chunk's
    Osiris header against its index record and the CRC of its entry data.
    """
    view = memoryview(data).cast("B")
    index = decode_fragment(view)
    if check_chunks:
        for i in range(len(index)):
            info, position = index.chunk(i)
            _check_chunk(view[position : position + info.size], info)
    return index


def _check_chunk(chunk: memoryview, info: FragmentChunkInfo) -> None:
    """Check one chunk's Osiris header against its index record, and its data CRC."""
    header = decode_chunk_header(chunk)
    fields = (
        header.chunk_id,
        header.timestamp,
        header.epoch,
        header.num_records,
        header.data_crc,
        header.chunk_type,
        header.num_entries,
    )
    indexed = (
        info.chunk_id,
        info.timestamp,
        info.epoch,
        info.num_records,
        info.crc,
        info.chunk_type,
        info.num_entries,
    )
    if fields != indexed:
        raise InvalidSizeError(f"chunk {info.chunk_id}: header {fields} != index {indexed}")
    if header.total_size != info.size:
        raise InvalidSizeError(f"chunk {info.chunk_id}: sizes do not add up to {info.size}")
    start = header.data_start
    check_crc(header, chunk[start : start + header.data_length])
