"""Fragment format v2: one independently decodable frame per chunk, optionally compressed
(zstd, optionally with a stream dictionary) and encrypted; an index that locates every frame
and carries every chunk's bloom filter.

Layout (all integers big-endian)::

    header   "TLFR" + u32 version 2                                   8 bytes
    frames   one frame per chunk, back to back                        data_size bytes
    index    index header (36 bytes), key block (``key_block_size`` bytes,
             the wrapped data key of an encrypted fragment, else empty), then the index body:
             one 64-byte record per chunk followed by the chunks' bloom filters back to back
             (sealed as the last frame when encrypted)
    trailer  96 bytes, the v1 trailer layout with version 2; its reserved u32 is the index
             size (index header to trailer) so the object's size follows from the trailer

``data_size`` in the trailer (and so in the manifest entry) stays the size of the chunks
themselves, as in v1: retention, lag and planning count the stream's bytes whatever the
coding. Where the frames end (``index_start``) is what the stored size says.

A frame is the chunk's original Osiris bytes, compressed as one zstd frame when the codec is
zstd, then sealed when the fragment is encrypted. A reader decodes a frame back into the
original chunk, byte for byte, and checks it against its index record: so consumers get the
chunks the local log wrote, CRCs unchanged. Every index record holds its frame's position,
stored and uncompressed size and a CRC of the stored frame; its own CRC covers the record and
the chunk's bloom bytes, so planning, seeks, prefetch and filtering work from the index alone.
The trailer CRC covers the index as stored and the trailer fields, as in v1.

Decoding frames and checking whole objects: ``formats/fragment_frames.py``. Encryption is
done by a ``FrameCipher`` the caller supplies (``formats/encryption.py``):
frame ``i`` of ``n`` chunk frames is sealed with frame number ``i``; the index body is frame
``n``, the only one flagged last, and its associated data also binds the index header, the key
block and the trailer fields, so nothing in the object can change unnoticed.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tierlog.formats.chunk import HEADER_SIZE as CHUNK_HEADER_SIZE
from tierlog.formats.chunk import decode_header as decode_chunk_header
from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.fragment import (
    FRAGMENT_MAGIC,
    HEADER,
    HEADER_SIZE,
    INDEX_MAGIC,
    MAX_U32,
    MAX_U64,
    TRAILER,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    FragmentChunkInfo,
    FragmentIndex,
    FragmentPlacement,
    FragmentTrailer,
    trailer_fields,
)
from tierlog.formats.fragment import decode_index as decode_index_v1
from tierlog.formats.fragment import decode_trailer as decode_trailer_v1

FRAGMENT_VERSION_2 = 2
_TRAILER_CRC_AT = TRAILER_SIZE - 12

CODEC_NONE = 0
CODEC_ZSTD = 1
CODECS = {"none": CODEC_NONE, "zstd": CODEC_ZSTD}
FLAG_ENCRYPTED = 1

MAX_KEY_BLOCK = 2 + 64 + 12 + 48  # the largest key block ``formats/encryption.py`` makes
DICTIONARY_ID_SIZE = 16
NO_DICTIONARY = bytes(DICTIONARY_ID_SIZE)

# magic, version, codec, flags, reserved, chunk count, dictionary id, key block size.
FRAGMENT_V2_INDEX_HEADER = struct.Struct(">4sIBBHI16sI")
FRAGMENT_V2_INDEX_HEADER_SIZE = FRAGMENT_V2_INDEX_HEADER.size  # 36

# chunk id, timestamp, epoch, frame position, chunk size, stored size, num records,
# chunk data CRC, frame CRC, num entries, chunk type, bloom size, record CRC, reserved.
INDEX_RECORD = struct.Struct(">QqQQIIIIIHBBI4x")
INDEX_RECORD_SIZE = INDEX_RECORD.size  # 64
_RECORD_CRC_AT = 56

INDEX_DTYPE = np.dtype(
    {
        "names": [
            "chunk_id",
            "timestamp",
            "epoch",
            "position",
            "size",
            "stored_size",
            "num_records",
            "crc",
            "frame_crc",
            "num_entries",
            "chunk_type",
            "bloom_size",
            "record_crc",
        ],
        "formats": [
            ">u8",
            ">i8",
            ">u8",
            ">u8",
            ">u4",
            ">u4",
            ">u4",
            ">u4",
            ">u4",
            ">u2",
            "u1",
            "u1",
            ">u4",
        ],
        "offsets": [0, 8, 16, 24, 32, 36, 40, 44, 48, 52, 54, 55, 56],
        "itemsize": INDEX_RECORD_SIZE,
    }
)


class FrameCipher(Protocol):
    """Seals and opens the frames of one object (its key and data key are bound in)."""

    @property
    def overhead(self) -> int:
        """Bytes a sealed frame has beyond its plaintext."""
        ...

    @property
    def key_block(self) -> bytes:
        """What a reader needs (besides its key-encryption keys) to open the frames."""
        ...

    def seal(self, frame_no: int, last: bool, plaintext: bytes, extra_aad: bytes = b"") -> bytes:
        """Encrypt and authenticate one frame."""
        ...

    def open(self, frame_no: int, last: bool, sealed: bytes, extra_aad: bytes = b"") -> bytes:
        """Authenticate and decrypt one frame; a FormatError when it was tampered with."""
        ...


CipherFor = Callable[[bytes], FrameCipher]
"""Make the cipher of an object from its key block (the caller binds the object key)."""


@dataclass(frozen=True, slots=True)
class FrameCoding:
    """How a fragment's frames are encoded: codec, level and dictionary, and the cipher."""

    codec: int = CODEC_ZSTD
    level: int = 3
    dictionary_id: bytes = NO_DICTIONARY
    dictionary: bytes | None = None
    cipher: FrameCipher | None = None

    def __post_init__(self) -> None:
        if self.codec not in CODECS.values():
            raise UnsupportedError(f"frame codec {self.codec} not supported")
        if len(self.dictionary_id) != DICTIONARY_ID_SIZE:
            raise InvalidSizeError(f"dictionary id must be {DICTIONARY_ID_SIZE} bytes")
        if (self.dictionary is None) != (self.dictionary_id == NO_DICTIONARY):
            raise InvalidSizeError("a dictionary needs an id and an id needs a dictionary")
        if self.dictionary is not None and self.codec != CODEC_ZSTD:
            raise UnsupportedError("dictionaries need the zstd codec")


@dataclass(frozen=True, slots=True)
class FragmentTrailerV2(FragmentTrailer):
    """The v2 trailer: the v1 fields plus the index size (from index header to trailer)."""

    index_size: int

    @property
    def total_size(self) -> int:
        return self.index_start + self.index_size + TRAILER_SIZE

    @property
    def version(self) -> int:
        return FRAGMENT_VERSION_2


class FragmentIndexV2(FragmentIndex):
    """A v2 index: records (``INDEX_DTYPE``), bloom bytes and how the frames are coded.

    ``records["position"]`` is a frame's position in the object and ``records["size"]`` the
    chunk's own size; ``records["stored_size"]`` is what to read for frame ``i``.
    """

    __slots__ = ("bloom_starts", "blooms", "codec", "dictionary_id", "key_block")

    def __init__(
        self,
        records: np.ndarray,
        trailer: FragmentTrailerV2,
        *,
        codec: int,
        dictionary_id: bytes,
        key_block: bytes,
        blooms: bytes,
    ) -> None:
        super().__init__(records, trailer)
        self.codec = codec
        self.dictionary_id = dictionary_id
        self.key_block = key_block
        self.blooms = blooms
        sizes = records["bloom_size"].astype(np.int64)
        self.bloom_starts = np.concatenate(([0], np.cumsum(sizes)))

    @property
    def encrypted(self) -> bool:
        return bool(self.key_block)

    def bloom(self, i: int) -> bytes:
        """The bloom filter bytes of chunk ``i`` (empty when it has none)."""
        return self.blooms[int(self.bloom_starts[i]) : int(self.bloom_starts[i + 1])]


# -- dispatch over versions ---------------------------------------------------------------------
def fragment_version(data: bytes | bytearray | memoryview) -> int:
    """The version in a fragment's trailer (the last bytes of the object, at least 8)."""
    view = memoryview(data)
    if view.nbytes < 8:
        raise TruncatedError(f"fragment tail of {view.nbytes} bytes has no version")
    version, magic = struct.unpack_from(">I4s", view, view.nbytes - 8)
    if magic != TRAILER_MAGIC:
        raise BadMagicError(f"not a fragment trailer: magic {magic!r}")
    return int(version)


def decode_trailer(tail: bytes | bytearray | memoryview) -> FragmentTrailer:
    """The trailer of a v1 or v2 fragment from its last ``TRAILER_SIZE`` (or more) bytes."""
    version = fragment_version(tail)
    if version == 1:
        return decode_trailer_v1(tail)
    if version == FRAGMENT_VERSION_2:
        return _decode_trailer_v2(tail)
    raise UnsupportedError(f"fragment version {version} not supported")


def index_region(trailer: FragmentTrailer) -> tuple[int, int]:
    """Byte range ``[start, end)`` of a fragment's index (header included, trailer not)."""
    start = trailer.index_start
    if isinstance(trailer, FragmentTrailerV2):
        return start, start + trailer.index_size
    return start, trailer.total_size - TRAILER_SIZE


def decode_index(
    index_bytes: bytes | bytearray | memoryview,
    trailer: FragmentTrailer,
    cipher_for: CipherFor | None = None,
) -> FragmentIndex:
    """Decode and check a v1 or v2 index against its trailer (see ``index_region``)."""
    if isinstance(trailer, FragmentTrailerV2):
        return _decode_index_v2(index_bytes, trailer, cipher_for)
    return decode_index_v1(index_bytes, trailer)


def decode_fragment(
    data: bytes | bytearray | memoryview, cipher_for: CipherFor | None = None
) -> FragmentIndex:
    """Check a whole v1 or v2 object's header, trailer, index and CRC; return its index."""
    view = memoryview(data).cast("B")
    if view.nbytes < HEADER_SIZE + TRAILER_SIZE:
        raise TruncatedError(f"fragment of {view.nbytes} bytes is too short")
    magic, version = HEADER.unpack_from(view, 0)
    if magic != FRAGMENT_MAGIC:
        raise BadMagicError(f"not a fragment: magic {magic!r}")
    trailer = decode_trailer(view)
    if version != (trailer.version if isinstance(trailer, FragmentTrailerV2) else 1):
        raise BadMagicError(f"fragment header version {version} != trailer version")
    if trailer.total_size != view.nbytes:
        raise InvalidSizeError(
            f"fragment is {view.nbytes} bytes, trailer says {trailer.total_size}"
        )
    start, end = index_region(trailer)
    return decode_index(view[start:end], trailer, cipher_for)


def index_tail_guess(chunk_count: int) -> int:
    """Bytes of a suffix GET that hold the trailer and the whole index of any v1 fragment and
    of a v2 fragment whose chunks carry no bloom filters (else the tail says what is missing:
    ``index_region``)."""
    return (
        FRAGMENT_V2_INDEX_HEADER_SIZE
        + MAX_KEY_BLOCK
        + chunk_count * INDEX_RECORD_SIZE
        + 16
        + TRAILER_SIZE
    )


def is_v2(index: FragmentIndex) -> bool:
    return isinstance(index, FragmentIndexV2)


def stored_sizes(index: FragmentIndex) -> np.ndarray:
    """Bytes to read for each chunk's frame (v1: the chunk itself)."""
    if isinstance(index, FragmentIndexV2):
        return index.records["stored_size"]
    return index.records["size"]


# -- encoding -----------------------------------------------------------------------------------
def encode_fragment_v2(
    placement: FragmentPlacement,
    chunks: Sequence[bytes | bytearray | memoryview],
    infos: Sequence[FragmentChunkInfo],
    coding: FrameCoding,
) -> tuple[list[bytes], FragmentTrailerV2]:
    """Build a v2 fragment as a list of buffers to write in order; return them and the
    trailer (its ``data_size`` is the stored size of the frames, what the manifest records).

    Raises ``InvalidSizeError`` when chunks and infos disagree or ids are not contiguous.
    """
    if not chunks or len(chunks) != len(infos):
        raise InvalidSizeError(f"need one info per chunk: {len(chunks)} chunks, {len(infos)} infos")
    compress = _compressor(coding)
    cipher = coding.cipher
    frames: list[bytes] = []
    records = bytearray()
    blooms = bytearray()
    position = HEADER_SIZE
    expected_id = infos[0].chunk_id
    for frame_no, (buf, info) in enumerate(zip(chunks, infos, strict=True)):
        view = memoryview(buf).cast("B")
        size = view.nbytes
        if size != info.size or not CHUNK_HEADER_SIZE <= size <= MAX_U32:
            raise InvalidSizeError(f"chunk {info.chunk_id}: {size} bytes, info says {info.size}")
        if info.chunk_id != expected_id:
            raise InvalidSizeError(f"chunk {info.chunk_id} does not follow offset {expected_id}")
        if info.num_records < 1:
            raise InvalidSizeError(f"chunk {info.chunk_id} holds no records")
        header = decode_chunk_header(view)
        bloom = bytes(view[CHUNK_HEADER_SIZE : CHUNK_HEADER_SIZE + header.bloom_size])
        frame = compress(view)
        if cipher is not None:
            frame = cipher.seal(frame_no, False, frame)
        record = _pack_record(
            info, position, len(frame), zlib.crc32(frame), header.bloom_size, bloom
        )
        records += record
        blooms += bloom
        frames.append(frame)
        position += len(frame)
        expected_id = info.chunk_id + info.num_records
    if expected_id > MAX_U64:
        raise InvalidSizeError(f"next offset {expected_id} does not fit 64 bits")
    key_block = cipher.key_block if cipher is not None else b""
    index_header = FRAGMENT_V2_INDEX_HEADER.pack(
        INDEX_MAGIC,
        FRAGMENT_VERSION_2,
        coding.codec,
        FLAG_ENCRYPTED if cipher is not None else 0,
        0,
        len(infos),
        coding.dictionary_id,
        len(key_block),
    )
    body = bytes(records + blooms)
    overhead = cipher.overhead if cipher is not None else 0
    index_size = FRAGMENT_V2_INDEX_HEADER_SIZE + len(key_block) + len(body) + overhead
    if index_size > MAX_U32:
        raise InvalidSizeError(f"fragment index of {index_size} bytes does not fit 32 bits")
    fields = (
        *trailer_fields(infos, expected_id, placement, position, sum(i.size for i in infos)),
        index_size,
    )
    if cipher is not None:
        aad = index_header + key_block + _trailer_prefix(fields)
        body = cipher.seal(len(infos), True, body, aad)
    index = index_header + key_block + body
    crc = _metadata_crc(index, fields)
    trailer_bytes = TRAILER.pack(*fields, crc, FRAGMENT_VERSION_2, TRAILER_MAGIC)
    parts = [HEADER.pack(FRAGMENT_MAGIC, FRAGMENT_VERSION_2), *frames, index, trailer_bytes]
    f = fields
    trailer = FragmentTrailerV2(*f[:11], crc=crc, index_size=index_size)
    return parts, trailer


def _pack_record(
    info: FragmentChunkInfo,
    position: int,
    stored: int,
    frame_crc: int,
    bloom_size: int,
    bloom: bytes,
) -> bytes:
    fields = (
        info.chunk_id,
        info.timestamp,
        info.epoch,
        position,
        info.size,
        stored,
        info.num_records,
        info.crc,
        frame_crc,
        info.num_entries,
        info.chunk_type,
        bloom_size,
    )
    head = INDEX_RECORD.pack(*fields, 0)[:_RECORD_CRC_AT]
    return INDEX_RECORD.pack(*fields, zlib.crc32(bloom, zlib.crc32(head)))


def _compressor(coding: FrameCoding) -> Callable[[memoryview], bytes]:
    if coding.codec == CODEC_NONE:
        return bytes
    import zstandard

    if coding.dictionary is not None:
        zdict = zstandard.ZstdCompressionDict(coding.dictionary)
        zdict.precompute_compress(level=coding.level)  # digested once, not per frame
        compressor = zstandard.ZstdCompressor(
            level=coding.level, dict_data=zdict, write_content_size=True
        )
    else:
        compressor = zstandard.ZstdCompressor(level=coding.level, write_content_size=True)
    return compressor.compress


def _trailer_prefix(fields: tuple[int, ...]) -> bytes:
    """The trailer bytes the CRC and the index frame's associated data cover."""
    return TRAILER.pack(*fields, 0, FRAGMENT_VERSION_2, TRAILER_MAGIC)[:_TRAILER_CRC_AT]


def _metadata_crc(index: bytes | bytearray | memoryview, fields: tuple[int, ...]) -> int:
    return zlib.crc32(_trailer_prefix(fields), zlib.crc32(index))


# -- decoding -----------------------------------------------------------------------------------
def _decode_trailer_v2(tail: bytes | bytearray | memoryview) -> FragmentTrailerV2:
    view = memoryview(tail)
    if view.nbytes < TRAILER_SIZE:
        raise TruncatedError(f"fragment trailer needs {TRAILER_SIZE} bytes, got {view.nbytes}")
    fields = TRAILER.unpack_from(view, view.nbytes - TRAILER_SIZE)
    first, next_offset, min_ts, max_ts, _epoch, _sf, _sp, index_start, data_size, count = fields[
        :10
    ]
    index_size, crc = fields[11], fields[12]
    if (
        count < 1
        or index_start < HEADER_SIZE + count
        or data_size < count * CHUNK_HEADER_SIZE
        or index_size < FRAGMENT_V2_INDEX_HEADER_SIZE + count * INDEX_RECORD_SIZE
    ):
        raise InvalidSizeError(
            f"fragment trailer sizes impossible: {count} chunks, {data_size} bytes, "
            f"index at {index_start} of {index_size} bytes"
        )
    if next_offset - first < count or min_ts > max_ts:
        raise InvalidSizeError(f"fragment trailer range impossible: [{first}, {next_offset})")
    return FragmentTrailerV2(
        first,
        next_offset,
        min_ts,
        max_ts,
        fields[4],
        fields[5],
        fields[6],
        index_start,
        data_size,
        count,
        fields[10],
        crc=crc,
        index_size=index_size,
    )


def _trailer_fields(t: FragmentTrailerV2) -> tuple[int, ...]:
    return (
        t.first_offset,
        t.next_offset,
        t.min_timestamp,
        t.max_timestamp,
        t.max_epoch,
        t.segment_first_offset,
        t.segment_position,
        t.index_start,
        t.data_size,
        t.chunk_count,
        t.seq_no,
        t.index_size,
    )


def _decode_index_v2(
    index_bytes: bytes | bytearray | memoryview,
    trailer: FragmentTrailerV2,
    cipher_for: CipherFor | None,
) -> FragmentIndexV2:
    view = memoryview(index_bytes).cast("B")
    if view.nbytes < trailer.index_size:
        raise TruncatedError(f"fragment index needs {trailer.index_size} bytes, got {view.nbytes}")
    region = view[: trailer.index_size]
    fields = _trailer_fields(trailer)
    crc = _metadata_crc(region, fields)
    if crc != trailer.crc:
        raise CrcMismatchError(f"fragment metadata CRC {crc:#010x} != stored {trailer.crc:#010x}")
    magic, version, codec, flags, reserved, count, dictionary_id, key_block_size = (
        FRAGMENT_V2_INDEX_HEADER.unpack_from(region, 0)
    )
    if magic != INDEX_MAGIC:
        raise BadMagicError(f"not a fragment index: magic {magic!r}")
    if version != FRAGMENT_VERSION_2:
        raise UnsupportedError(f"fragment index version {version} != trailer version 2")
    if codec not in CODECS.values() or reserved or flags & ~FLAG_ENCRYPTED:
        raise UnsupportedError(f"fragment index codec {codec} / flags {flags:#x} not supported")
    if count != trailer.chunk_count:
        raise InvalidSizeError(f"index holds {count} chunks, trailer says {trailer.chunk_count}")
    if bool(flags & FLAG_ENCRYPTED) != bool(key_block_size):
        raise InvalidSizeError("encrypted flag and key block disagree")
    body_at = FRAGMENT_V2_INDEX_HEADER_SIZE + key_block_size
    if body_at > region.nbytes:
        raise InvalidSizeError(f"key block of {key_block_size} bytes overruns the index")
    key_block = bytes(region[FRAGMENT_V2_INDEX_HEADER_SIZE:body_at])
    body: bytes | memoryview = region[body_at:]
    if key_block:
        if cipher_for is None:
            raise UnsupportedError("fragment is encrypted and no key-encryption key is configured")
        aad = bytes(region[:body_at]) + _trailer_prefix(fields)
        body = cipher_for(key_block).open(count, True, bytes(body), aad)
    records_size = count * INDEX_RECORD_SIZE
    if len(body) < records_size:
        raise InvalidSizeError(f"index body of {len(body)} bytes holds no {count} records")
    records = np.frombuffer(body, dtype=INDEX_DTYPE, count=count)
    blooms = bytes(body[records_size:])
    index = FragmentIndexV2(
        records,
        trailer,
        codec=codec,
        dictionary_id=bytes(dictionary_id),
        key_block=key_block,
        blooms=blooms,
    )
    _check_index_v2(index, memoryview(body))
    return index


def _check_index_v2(index: FragmentIndexV2, body: memoryview) -> None:
    """Reject records (under a valid trailer CRC) that contradict each other or the trailer."""
    records, t = index.records, index.trailer
    if int(index.bloom_starts[-1]) != len(index.blooms):
        raise InvalidSizeError(
            f"bloom section is {len(index.blooms)} bytes, records say {int(index.bloom_starts[-1])}"
        )
    for i in range(len(records)):
        at = i * INDEX_RECORD_SIZE
        crc = zlib.crc32(index.bloom(i), zlib.crc32(body[at : at + _RECORD_CRC_AT]))
        if crc != int(records["record_crc"][i]):
            raise CrcMismatchError(f"fragment index record {i}: CRC mismatch")
    ids = records["chunk_id"].astype(np.uint64)
    nums = records["num_records"].astype(np.uint64)
    pos = records["position"].astype(np.uint64)
    ends = pos + records["stored_size"].astype(np.uint64)
    ok = (
        int(ids[0]) == t.first_offset
        and int(ids[-1]) + int(nums[-1]) == t.next_offset
        and bool(np.all(nums >= 1))
        and bool(np.all(records["size"] >= CHUNK_HEADER_SIZE))
        and bool(np.all(records["stored_size"] >= 1))
        and bool(np.all(ids[1:] == ids[:-1] + nums[:-1]))
        and int(pos[0]) == HEADER_SIZE
        and bool(np.all(pos[1:] == ends[:-1]))
        and int(ends[-1]) == t.index_start
        and int(records["size"].astype(np.uint64).sum()) == t.data_size
    )
    if not ok:
        raise InvalidSizeError(
            f"fragment index of [{t.first_offset}, {t.next_offset}) inconsistent"
        )
