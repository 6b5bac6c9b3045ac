"""Osiris segment and index files: 8-byte file headers and 29-byte index records.

A segment file is ``OSIL`` + u32 version 1 followed by chunks; its index file is
``OSII`` + u32 version 1 followed by one record per chunk: chunk id u64, timestamp
i64, epoch u64, file position u32 (of the chunk in the segment), chunk type u8.
Files are named after their first offset, ``<offset:020d>.segment|index``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from tierlog.formats.errors import BadMagicError, TruncatedError

SEGMENT_HEADER = b"OSIL\x00\x00\x00\x01"
INDEX_FILE_HEADER = b"OSII\x00\x00\x00\x01"
FILE_HEADER_SIZE = 8
INDEX_RECORD_SIZE = 29
MAX_FILE_POSITION = 0xFFFFFFFF

_INDEX_RECORD = struct.Struct(">QqQIB")
assert _INDEX_RECORD.size == INDEX_RECORD_SIZE
_ZERO_RECORD = bytes(INDEX_RECORD_SIZE)


class IndexRecord(NamedTuple):
    """One index record: where a chunk is and what it is."""

    chunk_id: int
    timestamp: int
    epoch: int
    position: int
    chunk_type: int

    def encode(self) -> bytes:
        """The record's 29 bytes."""
        return _INDEX_RECORD.pack(*self)


INDEX_RECORD_DTYPE = np.dtype(
    {
        "names": list(IndexRecord._fields),
        "formats": [">u8", ">i8", ">u8", ">u4", "u1"],
        "offsets": [0, 8, 16, 24, 28],
        "itemsize": INDEX_RECORD_SIZE,
    }
)
"""The index record as a numpy dtype, for decoding many records at once."""
assert INDEX_RECORD_DTYPE.itemsize == INDEX_RECORD_SIZE
_PROBE = IndexRecord(0x0102030405060708, -2, 3, 0xA0B0C0D0, 2)
assert np.frombuffer(_PROBE.encode(), INDEX_RECORD_DTYPE)[0].tolist() == tuple(_PROBE)


def encode_index_record(
    chunk_id: int, timestamp: int, epoch: int, position: int, chunk_type: int
) -> bytes:
    """The 29 bytes of one index record."""
    return _INDEX_RECORD.pack(chunk_id, timestamp, epoch, position, chunk_type)


def check_segment_header(buf: bytes | memoryview) -> None:
    """Raise unless ``buf`` starts with the segment file header."""
    _check_header(buf, SEGMENT_HEADER, "segment")


def check_index_header(buf: bytes | memoryview) -> None:
    """Raise unless ``buf`` starts with the index file header."""
    _check_header(buf, INDEX_FILE_HEADER, "index")


def _check_header(buf: bytes | memoryview, expected: bytes, what: str) -> None:
    if len(buf) < FILE_HEADER_SIZE:
        raise TruncatedError(f"{what} file header needs 8 bytes, got {len(buf)}")
    if bytes(buf[:FILE_HEADER_SIZE]) != expected:
        raise BadMagicError(f"not an Osiris {what} file header: {bytes(buf[:8])!r}")


def decode_index_record(buf: bytes | memoryview, offset: int = 0) -> IndexRecord:
    """Decode the index record at ``offset``."""
    if len(buf) - offset < INDEX_RECORD_SIZE:
        raise TruncatedError("index record needs 29 bytes")
    return IndexRecord._make(_INDEX_RECORD.unpack_from(buf, offset))


def iter_index_records(buf: bytes | memoryview) -> Iterator[IndexRecord]:
    """Yield the records of a whole index file (header checked).

    A trailing partial record and all-zero records (never written by Osiris, left by
    preallocation or a torn write) end the iteration: callers validate the tail.
    """
    check_index_header(buf)
    view = memoryview(buf)
    end = FILE_HEADER_SIZE + (len(view) - FILE_HEADER_SIZE) // INDEX_RECORD_SIZE * INDEX_RECORD_SIZE
    for pos in range(FILE_HEADER_SIZE, end, INDEX_RECORD_SIZE):
        if view[pos : pos + INDEX_RECORD_SIZE] == _ZERO_RECORD:
            return
        yield IndexRecord._make(_INDEX_RECORD.unpack_from(view, pos))


def index_record_count(file_size: int) -> int:
    """How many whole index records an index file of ``file_size`` bytes holds."""
    return max(0, (file_size - FILE_HEADER_SIZE) // INDEX_RECORD_SIZE)


def index_record_position(n: int) -> int:
    """File position of the ``n``-th index record."""
    return FILE_HEADER_SIZE + n * INDEX_RECORD_SIZE


def unpack_index_field(buf: bytes | memoryview, n: int) -> IndexRecord:
    """The ``n``-th record of an index file's bytes (for binary searches)."""
    return IndexRecord._make(_INDEX_RECORD.unpack_from(buf, index_record_position(n)))


def segment_file_name(first_offset: int) -> str:
    """``<offset:020d>.segment``"""
    return f"{first_offset:020d}.segment"


def index_file_name(first_offset: int) -> str:
    """``<offset:020d>.index``"""
    return f"{first_offset:020d}.index"
