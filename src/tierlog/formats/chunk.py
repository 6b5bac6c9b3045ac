"""Osiris chunks: the 48-byte header, simple and sub-batch entries, record iteration.

A chunk is the unit tierlog writes, reads, replicates and tiers; its bytes are
exactly those RabbitMQ's Osiris writes, so chunks go to stream-protocol consumers
and to the remote tier without re-encoding. All integers are big-endian.

Header (48 bytes): magic 5 / version 0 (one byte, 0x50), chunk type u8, number of
entries u16, number of records u32, timestamp i64 (ms), epoch u64, chunk id (first
offset) u64, CRC-32 of the entry data u32, data length u32, trailer length u32,
bloom filter size u8, 3 reserved bytes. Then the bloom filter, the entry data and
the trailer (tracking entries for user chunks).

Entries: simple ``0:1, Len:31, Data``; sub-batch ``1:1, Compression:3, 0:4,
NumRecords:16, UncompressedLen:32, Len:32, Data`` where the uncompressed data is a
sequence of ``Len:32, Data`` records.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from tierlog.formats.compression import decompress
from tierlog.formats.crc import crc32
from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    RecordSizeError,
    TruncatedError,
    UnsupportedError,
)

MAGIC = 5
VERSION = 0
MAGIC_VERSION = (MAGIC << 4) | VERSION  # 0x50
MAX_SIMPLE_ENTRY_BYTES = (1 << 31) - 1
MAX_ENTRIES_PER_CHUNK = 0xFFFF
MAX_SUB_BATCH_RECORDS = 0xFFFF
MAX_COMPRESSION = 4
"""Highest sub-batch compression code: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
SUB_BATCH_FLAG = 0x80
"""The top bit of an entry's first byte: set for a sub-batch, clear for a simple entry."""
SUB_BATCH_BIT = SUB_BATCH_FLAG << 24
"""The same bit in an entry's first u32: a simple entry's length word is below it."""

# The one declaration of the 48-byte chunk header, as a struct (one header at a time) and as
# a numpy dtype (many headers at once, vectorised readers). Field order and offsets agree:
# checked below.
HEADER = struct.Struct(">BBHIqQQIIIB3x")
HEADER_DTYPE = np.dtype(
    {
        "names": [
            "magic",
            "chunk_type",
            "num_entries",
            "num_records",
            "timestamp",
            "epoch",
            "chunk_id",
            "crc",
            "data_length",
            "trailer_length",
            "bloom_size",
        ],
        "formats": ["u1", "u1", ">u2", ">u4", ">i8", ">u8", ">u8", ">u4", ">u4", ">u4", "u1"],
        "offsets": [0, 1, 2, 4, 8, 16, 24, 32, 36, 40, 44],
        "itemsize": 48,
    }
)
HEADER_SIZE = HEADER.size  # 48
CHUNK_TYPE_POS = 1
"""Byte position of the u8 chunk type in the header."""
DATA_LENGTH_POS = 36
"""Byte position of the u32 data length in the header."""
BLOOM_SIZE_POS = 44
"""Byte position of the u8 bloom filter size in the header."""
RESERVED_POS = 45
"""Byte position of the header's 3 reserved bytes (zero; the header ends after them)."""
SECTION_SIZES = struct.Struct(">IIB")
"""Data length, trailer length, bloom filter size: header bytes from ``DATA_LENGTH_POS``."""

# The one declaration of the 11-byte sub-batch entry header:
# type byte (1:1 Compression:3 0:4), num records u16, uncompressed length u32, length u32.
SUB_BATCH_HEADER = struct.Struct(">BHII")
SUB_BATCH_HEADER_SIZE = SUB_BATCH_HEADER.size  # 11
SIMPLE_ENTRY_HEADER_SIZE = 4

_U32 = struct.Struct(">I")
assert HEADER_DTYPE.itemsize == HEADER_SIZE
assert HEADER_DTYPE.fields is not None
assert HEADER_DTYPE.fields["chunk_type"][1] == CHUNK_TYPE_POS
assert HEADER_DTYPE.fields["data_length"][1] == DATA_LENGTH_POS
assert HEADER_DTYPE.fields["bloom_size"][1] == BLOOM_SIZE_POS == RESERVED_POS - 1


class ChunkType(IntEnum):
    """What a chunk's entries are: user records or tracking state."""

    USER = 0
    TRACKING_DELTA = 1
    TRACKING_SNAPSHOT = 2


_CHUNK_TYPES = frozenset(int(t) for t in ChunkType)


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The decoded 48-byte chunk header."""

    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    chunk_id: int
    data_crc: int
    data_length: int
    trailer_length: int
    bloom_size: int

    @property
    def total_size(self) -> int:
        """Size of the whole chunk in bytes: header, bloom filter, data and trailer."""
        return HEADER_SIZE + self.bloom_size + self.data_length + self.trailer_length

    @property
    def next_offset(self) -> int:
        """The offset right after this chunk's last record (tracking chunks take offsets too)."""
        return self.chunk_id + self.num_records

    @property
    def data_start(self) -> int:
        """Where the entry data starts, relative to the start of the chunk."""
        return HEADER_SIZE + self.bloom_size

    def encode(self) -> bytes:
        """The header's 48 bytes."""
        return HEADER.pack(
            MAGIC_VERSION,
            self.chunk_type,
            self.num_entries,
            self.num_records,
            self.timestamp,
            self.epoch,
            self.chunk_id,
            self.data_crc,
            self.data_length,
            self.trailer_length,
            self.bloom_size,
        )


@dataclass(frozen=True, slots=True)
class SubBatch:
    """A pre-encoded sub-batch entry, passed through verbatim (as clients send it)."""

    compression: int
    num_records: int
    uncompressed_length: int
    data: bytes

    def __post_init__(self) -> None:
        if not 0 <= self.compression <= 7:
            raise InvalidSizeError(f"sub-batch compression code {self.compression} not in 0..7")
        if not 0 <= self.num_records <= MAX_SUB_BATCH_RECORDS:
            raise InvalidSizeError(f"sub-batch record count {self.num_records} not in 0..65535")
        if not 0 <= self.uncompressed_length <= 0xFFFFFFFF:
            raise InvalidSizeError(f"sub-batch uncompressed length {self.uncompressed_length}")
        if len(self.data) > 0xFFFFFFFF:
            raise InvalidSizeError("sub-batch data longer than 2^32-1 bytes")


Entry = bytes | SubBatch
"""One entry of an append: plain record bytes or a pre-encoded sub-batch."""


def decode_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> ChunkHeader:
    """Decode the chunk header at ``offset``; reject truncation, bad magic and bad types."""
    if len(buf) - offset < HEADER_SIZE:
        raise TruncatedError(f"chunk header needs {HEADER_SIZE} bytes, got {len(buf) - offset}")
    (
        magic,
        chunk_type,
        num_entries,
        num_records,
        timestamp,
        epoch,
        chunk_id,
        crc,
        data_length,
        trailer_length,
        bloom_size,
    ) = HEADER.unpack_from(buf, offset)
    if magic != MAGIC_VERSION:
        raise BadMagicError(f"chunk magic/version byte is {magic:#04x}, expected 0x50")
    if chunk_type not in _CHUNK_TYPES:
        raise FormatError(f"unknown chunk type {chunk_type}")
    if num_entries == 0 and data_length != 0:
        raise InvalidSizeError("chunk has data but no entries")
    if data_length < num_entries * SIMPLE_ENTRY_HEADER_SIZE:
        raise InvalidSizeError(f"{num_entries} entries cannot fit in {data_length} data bytes")
    return ChunkHeader(
        chunk_type,
        num_entries,
        num_records,
        timestamp,
        epoch,
        chunk_id,
        crc,
        data_length,
        trailer_length,
        bloom_size,
    )


def make_header(
    chunk_type: int,
    chunk_id: int,
    epoch: int,
    timestamp: int,
    data: bytes | memoryview,
    num_entries: int,
    num_records: int,
    trailer_length: int = 0,
    bloom_size: int = 0,
    data_crc: int | None = None,
) -> ChunkHeader:
    """Build the header for ``data`` (the CRC is computed here, over the entry data only,
    unless the caller computed it already: ``data_crc``)."""
    if not 0 <= num_entries <= MAX_ENTRIES_PER_CHUNK:
        raise InvalidSizeError(f"{num_entries} entries do not fit in one chunk")
    if len(data) > 0xFFFFFFFF or trailer_length > 0xFFFFFFFF or not 0 <= bloom_size <= 255:
        raise InvalidSizeError("chunk section too large")
    return ChunkHeader(
        int(chunk_type),
        num_entries,
        num_records,
        timestamp,
        epoch,
        chunk_id,
        crc32(data) if data_crc is None else data_crc,
        len(data),
        trailer_length,
        bloom_size,
    )


def encode_chunk(
    chunk_type: int,
    chunk_id: int,
    epoch: int,
    timestamp: int,
    entries: Sequence[Entry],
    trailer: bytes = b"",
    bloom: bytes = b"",
) -> bytes:
    """Encode a whole chunk from its entries (convenient; the writer uses the parts)."""
    data, num_entries, num_records = encode_entries(entries)
    header = make_header(
        chunk_type,
        chunk_id,
        epoch,
        timestamp,
        data,
        num_entries,
        num_records,
        len(trailer),
        len(bloom),
    )
    return b"".join((header.encode(), bloom, data, trailer))


def encode_records(records: Sequence[bytes]) -> bytes:
    """Encode plain records as simple entries, in one C-level pass (the append hot path)."""
    lengths = list(map(len, records))
    if lengths and min(lengths) == max(lengths):
        return encode_uniform_records(records, lengths[0])
    prefixes = map(_U32.pack, lengths)
    return b"".join(itertools.chain.from_iterable(zip(prefixes, records, strict=True)))


def encode_uniform_records(records: Sequence[bytes], size: int) -> bytes:
    """Encode records that are all ``size`` bytes long: one ``join`` with the shared prefix."""
    return _U32.pack(size).join([b"", *records])


def encode_entries(entries: Sequence[Entry]) -> tuple[bytes, int, int]:
    """Encode entries; return (entry data, number of entries, number of records)."""
    if not any(isinstance(e, SubBatch) for e in entries):
        if entries and max(map(len, entries)) > MAX_SIMPLE_ENTRY_BYTES:  # type: ignore[arg-type]
            raise InvalidSizeError("simple entry longer than 2^31-1 bytes")
        return encode_records(entries), len(entries), len(entries)  # type: ignore[arg-type]
    parts: list[bytes] = []
    num_records = 0
    for entry in entries:
        if isinstance(entry, SubBatch):
            parts.append(encode_sub_batch_header(entry))
            parts.append(entry.data)
            num_records += entry.num_records
        else:
            if len(entry) > MAX_SIMPLE_ENTRY_BYTES:
                raise InvalidSizeError("simple entry longer than 2^31-1 bytes")
            parts.append(_U32.pack(len(entry)))
            parts.append(entry)
            num_records += 1
    return b"".join(parts), len(entries), num_records


def encode_sub_batch_header(entry: SubBatch) -> bytes:
    """The 11-byte header of a sub-batch entry."""
    return SUB_BATCH_HEADER.pack(
        SUB_BATCH_FLAG | (entry.compression << 4),
        entry.num_records,
        entry.uncompressed_length,
        len(entry.data),
    )


def sub_batch_entry(
    payload: bytes, num_records: int, uncompressed_length: int, compression: int = 0
) -> bytes:
    """A whole sub-batch entry: the header, then ``payload`` (the records, as
    ``encode_records`` lays them out, compressed with ``compression``)."""
    if not 0 <= compression <= MAX_COMPRESSION:
        raise UnsupportedError(f"unknown sub-batch compression {compression}")
    batch = SubBatch(compression, num_records, uncompressed_length, payload)
    return encode_sub_batch_header(batch) + payload


def decode_sub_batch_entry(entry: bytes | memoryview) -> SubBatch:
    """A whole sub-batch entry (header + data, e.g. as a client published it) as a SubBatch
    whose data is a copy, to be appended verbatim."""
    if len(entry) < SUB_BATCH_HEADER_SIZE:
        raise TruncatedError("sub-batch entry shorter than its header")
    type_byte, num_records, uncompressed, length = SUB_BATCH_HEADER.unpack_from(entry, 0)
    if not type_byte & SUB_BATCH_FLAG:
        raise FormatError("not a sub-batch entry")
    if SUB_BATCH_HEADER_SIZE + length != len(entry):
        raise InvalidSizeError(f"sub-batch entry of {len(entry)} bytes says {length} data bytes")
    data = bytes(entry[SUB_BATCH_HEADER_SIZE:])
    return SubBatch((type_byte >> 4) & 0x07, num_records, uncompressed, data)


@dataclass(frozen=True, slots=True)
class DecodedChunk:
    """A validated chunk: header plus views of its sections (no copies)."""

    header: ChunkHeader
    bloom: memoryview
    data: memoryview
    trailer: memoryview


def decode_chunk(
    buf: bytes | bytearray | memoryview, offset: int = 0, verify_crc: bool = True
) -> DecodedChunk:
    """Decode and validate the chunk at ``offset`` (sizes and, by default, the data CRC)."""
    header = decode_header(buf, offset)
    end = offset + header.total_size
    if len(buf) < end:
        raise TruncatedError(f"chunk {header.chunk_id} needs {header.total_size} bytes")
    view = memoryview(buf)
    start = offset + header.data_start
    data = view[start : start + header.data_length]
    if verify_crc:
        check_crc(header, data)
    return DecodedChunk(
        header,
        view[offset + HEADER_SIZE : start],
        data,
        view[start + header.data_length : end],
    )


def check_crc(header: ChunkHeader, data: bytes | memoryview) -> None:
    """Raise CrcMismatchError when ``data`` does not match the header's CRC."""
    crc = crc32(data)
    if crc != header.data_crc:
        raise CrcMismatchError(
            f"chunk {header.chunk_id}: data CRC {crc:#010x} != header {header.data_crc:#010x}"
        )


@dataclass(frozen=True, slots=True)
class SubBatchView:
    """A sub-batch entry as found in a chunk (its data is a view into the chunk)."""

    compression: int
    num_records: int
    uncompressed_length: int
    data: memoryview


def iter_entries(data: bytes | memoryview, num_entries: int) -> Iterator[memoryview | SubBatchView]:
    """Yield each entry: a memoryview for simple entries, a SubBatchView for sub-batches."""
    view = memoryview(data)
    end = len(view)
    pos = 0
    for _ in range(num_entries):
        if pos + SIMPLE_ENTRY_HEADER_SIZE > end:
            raise TruncatedError("entry header runs past the chunk data")
        first = view[pos]
        if first & SUB_BATCH_FLAG:
            if pos + SUB_BATCH_HEADER_SIZE > end:
                raise TruncatedError("sub-batch header runs past the chunk data")
            kind, count, uncompressed, length = SUB_BATCH_HEADER.unpack_from(view, pos)
            pos += SUB_BATCH_HEADER_SIZE
            if pos + length > end:
                raise TruncatedError("sub-batch body runs past the chunk data")
            yield SubBatchView((kind >> 4) & 0x7, count, uncompressed, view[pos : pos + length])
        else:
            (length,) = _U32.unpack_from(view, pos)
            pos += SIMPLE_ENTRY_HEADER_SIZE
            if pos + length > end:
                raise TruncatedError("entry body runs past the chunk data")
            yield view[pos : pos + length]
        pos += length
    if pos != end:
        raise InvalidSizeError(f"chunk data has {end - pos} bytes after its last entry")


def iter_records(
    chunk_id: int,
    data: bytes | memoryview,
    num_entries: int,
    start: int = 0,
    end: int | None = None,
    on_error: Callable[[FormatError], Exception] | None = None,
) -> Iterator[tuple[int, memoryview]]:
    """Yield (offset, record bytes) for every record of the ``num_entries`` entries in
    ``data[start:end]`` (a whole chunk and its data bounds, or just its entry data),
    oldest first; the first record's offset is ``chunk_id``.

    The one walk over a chunk's entries that readers use, so it is the hot path: one
    ``unpack_from`` and one slice of the caller's buffer per simple entry (no copy);
    sub-batches are decompressed (when the codec is available) and their records get
    consecutive offsets. Damage raises a ``FormatError``, or ``on_error(exc)`` when the
    caller wants its own type (without a wrapping generator per record).
    """
    view = memoryview(data)
    unpack = _U32.unpack_from
    sub_batch_bit = SUB_BATCH_BIT
    end = len(view) if end is None else end
    pos = start
    offset = chunk_id
    merged = 0  # records beyond the first of each sub-batch: entries = records - merged
    try:
        while pos < end:
            # a length word read past ``end`` only makes the body check below fail
            (word,) = unpack(view, pos)
            if word < sub_batch_bit:
                pos += SIMPLE_ENTRY_HEADER_SIZE
                nxt = pos + word
                if nxt > end:
                    raise TruncatedError("entry body runs past the chunk data")
                yield offset, view[pos:nxt]
                offset += 1
                pos = nxt
                continue
            if pos + SUB_BATCH_HEADER_SIZE > end:
                raise TruncatedError("sub-batch header runs past the chunk data")
            kind, count, uncompressed, length = SUB_BATCH_HEADER.unpack_from(view, pos)
            pos += SUB_BATCH_HEADER_SIZE
            if pos + length > end:
                raise TruncatedError("sub-batch body runs past the chunk data")
            body = decompress((kind >> 4) & 0x7, view[pos : pos + length], uncompressed)
            yield from iter_sub_batch_records(offset, body, count)
            offset += count
            merged += count - 1
            pos += length
        entries = offset - chunk_id - merged
        if entries != num_entries:
            raise InvalidSizeError(f"chunk data holds {entries} entries, expected {num_entries}")
    except struct.error as exc:  # a length word past the end of the buffer
        error: FormatError = TruncatedError(f"entry header runs past the chunk data: {exc}")
        if on_error is None:
            raise error from exc
        raise on_error(error) from exc
    except FormatError as exc:
        if on_error is None:
            raise
        raise on_error(exc) from exc


def count_entries(data: bytes | memoryview, start: int, end: int) -> int:
    """How many whole entries ``data[start:end]`` holds (entry headers only, no bodies)."""
    count = 0
    pos = start
    while pos < end:
        (word,) = _U32.unpack_from(data, pos)
        if word & SUB_BATCH_BIT:
            pos += SUB_BATCH_HEADER_SIZE + SUB_BATCH_HEADER.unpack_from(data, pos)[3]
        else:
            pos += SIMPLE_ENTRY_HEADER_SIZE + word
        count += 1
    return count


def iter_sub_batch_records(
    first_offset: int, body: bytes | memoryview, num_records: int
) -> Iterator[tuple[int, memoryview]]:
    """Yield (offset, record) for the ``Len:32, Data`` records of a decompressed sub-batch."""
    view = memoryview(body)
    unpack = _U32.unpack_from
    end = len(view)
    pos = 0
    for offset in range(first_offset, first_offset + num_records):
        if pos + 4 > end:
            raise TruncatedError("sub-batch record header runs past its body")
        (length,) = unpack(view, pos)
        pos += 4
        nxt = pos + length
        if nxt > end:
            raise TruncatedError("sub-batch record runs past its body")
        yield offset, view[pos:nxt]
        pos = nxt
    if pos != end:
        raise InvalidSizeError(f"sub-batch has {end - pos} bytes after its last record")


def check_entries(data: bytes | memoryview, num_entries: int, num_records: int) -> None:
    """Check that ``num_entries`` entries exactly fill ``data`` and hold ``num_records``."""
    records = count_entry_data(data, num_entries, MAX_SIMPLE_ENTRY_BYTES, 0xFFFFFFFF)
    if records != num_records:
        raise InvalidSizeError(f"entries hold {records} records, header says {num_records}")


def uniform_record_size(data: bytes | memoryview, num_entries: int) -> int | None:
    """The common record length when ``data`` is exactly ``num_entries`` simple entries of
    one length (what batching producers write); None otherwise. C-level checks only."""
    end = len(data)
    if num_entries <= 0 or end < SIMPLE_ENTRY_HEADER_SIZE:
        return None
    (size,) = _U32.unpack_from(data, 0)
    stride = SIMPLE_ENTRY_HEADER_SIZE + size
    if size & SUB_BATCH_BIT or stride * num_entries != end:
        return None
    if num_entries > 1:
        prefix = _U32.pack(size)
        for k in range(SIMPLE_ENTRY_HEADER_SIZE):
            if bytes(data[k::stride]) != prefix[k : k + 1] * num_entries:
                return None
    return size


def iter_uniform_records(
    view: memoryview, start: int, size: int, count: int, first_offset: int
) -> Iterator[tuple[int, memoryview]]:
    """(offset, record) for ``count`` simple entries of ``size`` bytes from byte ``start``
    of ``view``: built from C iterators only (no Python frame per record)."""
    stride = SIMPLE_ENTRY_HEADER_SIZE + size
    first = start + SIMPLE_ENTRY_HEADER_SIZE
    stop = first + stride * count
    slices = map(slice, range(first, stop, stride), range(first + size, stop + size, stride))
    return zip(itertools.count(first_offset), map(view.__getitem__, slices))


def count_entry_data(
    data: bytes | memoryview,
    num_entries: int,
    max_record_bytes: int,
    max_sub_batch_bytes: int,
) -> int:
    """Check that ``num_entries`` entries exactly fill ``data`` and respect the size limits
    (simple entries up to ``max_record_bytes``, sub-batch bodies up to
    ``max_sub_batch_bytes``); return the number of records they hold.

    Raises InvalidSizeError (structure) or RecordSizeError (a limit). Uniform entries
    are checked with a few C-level slices; anything else with one walk over the entries.
    """
    size = uniform_record_size(data, num_entries)
    if size is not None:
        if size > max_record_bytes:
            raise RecordSizeError(f"record of {size} bytes exceeds {max_record_bytes}")
        return num_entries
    view = memoryview(data)
    unpack = _U32.unpack_from
    end = len(view)
    pos = 0
    records = 0
    for _ in range(num_entries):
        if pos + 4 > end:
            raise TruncatedError("entry header runs past the chunk data")
        (word,) = unpack(view, pos)
        if word < SUB_BATCH_BIT:
            if word > max_record_bytes:
                raise RecordSizeError(f"record of {word} bytes exceeds {max_record_bytes}")
            pos += 4 + word
            records += 1
        else:
            if pos + SUB_BATCH_HEADER_SIZE > end:
                raise TruncatedError("sub-batch header runs past the chunk data")
            _, count, _, length = SUB_BATCH_HEADER.unpack_from(view, pos)
            if length > max_sub_batch_bytes:
                raise RecordSizeError(f"sub-batch of {length} bytes exceeds {max_sub_batch_bytes}")
            pos += SUB_BATCH_HEADER_SIZE + length
            records += count
        if pos > end:
            raise TruncatedError("entry body runs past the chunk data")
    if pos != end:
        raise InvalidSizeError(f"chunk data has {end - pos} bytes after its last entry")
    return records


def simple_entry(data: bytes) -> bytes:
    """One simple entry (length prefix + data), as used by tracking chunks."""
    if len(data) > MAX_SIMPLE_ENTRY_BYTES:
        raise InvalidSizeError("simple entry longer than 2^31-1 bytes")
    return _U32.pack(len(data)) + data


def single_entry_body(data: bytes | memoryview, num_entries: int) -> memoryview:
    """The body of a chunk whose data is exactly one simple entry (tracking chunks)."""
    view = memoryview(data)
    if num_entries != 1:
        raise InvalidSizeError(f"tracking chunk has {num_entries} entries, expected 1")
    if len(view) < 4:
        raise TruncatedError("tracking entry header truncated")
    (length,) = _U32.unpack_from(view, 0)
    if length & SUB_BATCH_BIT:
        raise FormatError("tracking chunk entry is a sub-batch")
    if 4 + length != len(view):
        raise InvalidSizeError("tracking entry length does not match the chunk data length")
    return view[4:]
