"""A stream's zstd compression dictionary as an immutable object, and its training.

Layout (big-endian)::

    "TLDC" + u32 version 1 + 16-byte dictionary id + u32 size + dictionary bytes + u32 CRC-32

The id is a random uid chosen when the dictionary is trained; fragments compressed with it
name it in their index header, and the object key carries it, so a dictionary is written once
and never changes. The CRC covers everything before it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

DICTIONARY_MAGIC = b"TLDC"
DICTIONARY_VERSION = 1
HEADER = struct.Struct(">4sI16sI")
HEADER_SIZE = HEADER.size  # 28
MAX_DICTIONARY_BYTES = 4 << 20
MIN_TRAINING_SAMPLES = 8


def encode_dictionary(dictionary_id: bytes, dictionary: bytes) -> bytes:
    """The dictionary object's bytes."""
    if len(dictionary_id) != 16 or dictionary_id == bytes(16):
        raise InvalidSizeError("a dictionary id is 16 bytes, not all zero")
    if not 0 < len(dictionary) <= MAX_DICTIONARY_BYTES:
        raise InvalidSizeError(f"dictionary of {len(dictionary)} bytes")
    body = HEADER.pack(DICTIONARY_MAGIC, DICTIONARY_VERSION, dictionary_id, len(dictionary))
    body += dictionary
    return body + struct.pack(">I", zlib.crc32(body))


def decode_dictionary(data: bytes | bytearray | memoryview) -> tuple[bytes, bytes]:
    """``(dictionary id, dictionary bytes)`` of a dictionary object; typed errors when bad."""
    view = memoryview(data).cast("B")
    if view.nbytes < HEADER_SIZE + 4:
        raise TruncatedError(f"dictionary object of {view.nbytes} bytes is too short")
    magic, version, dictionary_id, size = HEADER.unpack_from(view, 0)
    if magic != DICTIONARY_MAGIC:
        raise BadMagicError(f"not a dictionary object: magic {magic!r}")
    if version != DICTIONARY_VERSION:
        raise UnsupportedError(f"dictionary object version {version} not supported")
    if HEADER_SIZE + size + 4 != view.nbytes:
        raise InvalidSizeError(f"dictionary object is {view.nbytes} bytes, header says {size}")
    (crc,) = struct.unpack_from(">I", view, view.nbytes - 4)
    actual = zlib.crc32(view[: view.nbytes - 4])
    if actual != crc:
        raise CrcMismatchError(f"dictionary object CRC {actual:#010x} != stored {crc:#010x}")
    return bytes(dictionary_id), bytes(view[HEADER_SIZE : HEADER_SIZE + size])


def train_dictionary(samples: Sequence[bytes], size: int = 64 << 10, level: int = 3) -> bytes:
    """A zstd dictionary of at most ``size`` bytes trained on sample bodies (zstd's COVER
    trainer); FormatError when the samples are too few or too small to train on."""
    import zstandard

    if len(samples) < MIN_TRAINING_SAMPLES:
        raise FormatError(f"{len(samples)} samples: need at least {MIN_TRAINING_SAMPLES}")
    try:
        trained = zstandard.train_dictionary(size, list(samples), level=level)
    except zstandard.ZstdError as exc:
        raise FormatError(f"cannot train a dictionary: {exc}") from exc
    return trained.as_bytes()
