"""Sub-batch compression codecs of the RabbitMQ stream protocol.

Codes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (5..7 reserved). Clients compress
the sub-batch body (a sequence of ``Len:32, Data`` records) as one gzip member, a
snappy framed stream, an LZ4 frame or a zstd frame. Decoding checks the declared
uncompressed length; codes tierlog cannot decode raise UnsupportedError.
"""

from __future__ import annotations

import zlib
from enum import IntEnum

from tierlog.formats.errors import FormatError, InvalidSizeError, UnsupportedError


class Compression(IntEnum):
    """Sub-batch compression codes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def codec_name(code: int) -> str:
    """A readable name for a compression code (``code-N`` when unknown)."""
    try:
        return Compression(code).name.lower()
    except ValueError:
        return f"code-{code}"


def decompress(code: int, data: bytes | memoryview, uncompressed_length: int) -> bytes | memoryview:
    """Decompress a sub-batch body and check its length against the declared one."""
    if code == Compression.NONE:
        out: bytes | memoryview = data
    elif code == Compression.GZIP:
        out = _gunzip(data, uncompressed_length)
    elif code == Compression.SNAPPY:
        out = _unsnappy(data, uncompressed_length)
    elif code == Compression.LZ4:
        out = _unlz4(data, uncompressed_length)
    elif code == Compression.ZSTD:
        out = _unzstd(data, uncompressed_length)
    else:
        raise UnsupportedError(f"sub-batch compression {codec_name(code)} is not supported")
    if len(out) != uncompressed_length:
        raise InvalidSizeError(
            f"{codec_name(code)} sub-batch decompressed to {len(out)} bytes, "
            f"header says {uncompressed_length}"
        )
    return out


def compress(code: int, data: bytes) -> bytes:
    """Compress a sub-batch body the way stream clients do (for tests and tools)."""
    if code == Compression.NONE:
        return data
    if code == Compression.GZIP:
        import gzip

        return gzip.compress(data)
    if code == Compression.SNAPPY:
        import snappy

        return bytes(snappy.StreamCompressor().add_chunk(data))
    if code == Compression.LZ4:
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    if code == Compression.ZSTD:
        import zstandard

        return bytes(zstandard.ZstdCompressor().compress(data))
    raise UnsupportedError(f"sub-batch compression {codec_name(code)} is not supported")


def _gunzip(data: bytes | memoryview, limit: int) -> bytes:
    try:
        d = zlib.decompressobj(wbits=47)  # gzip or zlib header, auto-detected
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise FormatError(f"gzip sub-batch is corrupt: {exc}") from exc
    return out


def _snappy_declared_length(raw: bytes) -> int:
    """Uncompressed size a snappy block (varint prefix) or framed stream declares.

    Read before decompressing, so a small input cannot expand past the sub-batch's
    declared length (a decompression bomb); malformed input is left to the decoder.
    """
    if raw[:1] != b"\xff":
        return _varint(raw, 0)
    total, pos = 0, 0
    while pos + 4 <= len(raw):
        kind = raw[pos]
        length = int.from_bytes(raw[pos + 1 : pos + 4], "little")
        if kind == 0x00:  # compressed chunk: CRC, then a snappy block
            total += _varint(raw, pos + 8)
        elif kind == 0x01:  # uncompressed chunk: CRC, then the data
            total += max(length - 4, 0)
        pos += 4 + length
    return total


def _varint(raw: bytes, pos: int) -> int:
    value, shift = 0, 0
    while pos < len(raw) and shift < 35:
        byte = raw[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        pos, shift = pos + 1, shift + 7
    return 0


def _unsnappy(data: bytes | memoryview, limit: int) -> bytes:
    try:
        import snappy
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise UnsupportedError("snappy sub-batches need python-snappy") from exc
    raw = bytes(data)
    if not raw:
        return b""
    declared = _snappy_declared_length(raw)
    if declared > limit:
        raise InvalidSizeError(f"snappy sub-batch declares {declared} bytes, header says {limit}")
    try:
        if raw[:1] == b"\xff":  # framing format stream identifier chunk
            return bytes(snappy.StreamDecompressor().decompress(raw))
        return bytes(snappy.uncompress(raw))
    except Exception as exc:
        raise FormatError(f"snappy sub-batch is corrupt: {exc}") from exc


def _unlz4(data: bytes | memoryview, limit: int) -> bytes:
    try:
        import lz4.frame
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise UnsupportedError("lz4 sub-batches need the lz4 package") from exc
    try:
        # at most one byte past the declared length: the caller reports the mismatch
        return bytes(lz4.frame.LZ4FrameDecompressor().decompress(bytes(data), limit + 1))
    except Exception as exc:
        raise FormatError(f"lz4 sub-batch is corrupt: {exc}") from exc


def _unzstd(data: bytes | memoryview, limit: int) -> bytes:
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise UnsupportedError("zstd sub-batches need the zstandard package") from exc
    raw = bytes(data)
    try:
        # max_output_size only applies when the frame does not declare its size
        declared = zstandard.frame_content_size(raw)
    except zstandard.ZstdError as exc:
        raise FormatError(f"zstd sub-batch is corrupt: {exc}") from exc
    if declared > limit:
        raise InvalidSizeError(f"zstd sub-batch declares {declared} bytes, header says {limit}")
    try:
        return bytes(zstandard.ZstdDecompressor().decompress(raw, max_output_size=limit))
    except zstandard.ZstdError as exc:
        raise FormatError(f"zstd sub-batch is corrupt: {exc}") from exc
