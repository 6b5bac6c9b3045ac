"""Decoding the frames of a v2 fragment back into the original Osiris chunks, and checking
whole fragment objects of either version (the layout is in ``formats/fragment_v2.py``)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from tierlog.formats.chunk import HEADER_SIZE as CHUNK_HEADER_SIZE
from tierlog.formats.chunk import check_crc
from tierlog.formats.chunk import decode_header as decode_chunk_header
from tierlog.formats.errors import (
    CrcMismatchError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)
from tierlog.formats.fragment import FragmentIndex
from tierlog.formats.fragment import validate_fragment as validate_fragment_v1
from tierlog.formats.fragment_v2 import (
    CODEC_ZSTD,
    NO_DICTIONARY,
    CipherFor,
    FragmentIndexV2,
    FrameCipher,
    decode_fragment,
    fragment_version,
    stored_sizes,
)


class FrameDecoder:
    """Turns the stored frames of one v2 fragment back into its original chunks.

    Made once per fragment (it holds the decompressor with the dictionary and the cipher);
    ``decode`` checks the stored frame's CRC, opens, decompresses and checks the chunk
    against its index record (header fields, size, bloom and data CRC).
    """

    __slots__ = ("_cipher", "_decompressor", "index")

    def __init__(
        self,
        index: FragmentIndexV2,
        *,
        dictionary: bytes | None = None,
        cipher_for: CipherFor | None = None,
    ) -> None:
        self.index = index
        if index.dictionary_id != NO_DICTIONARY and dictionary is None:
            raise UnsupportedError("fragment needs its compression dictionary")
        self._decompressor = None
        if index.codec == CODEC_ZSTD:
            import zstandard

            zdict = zstandard.ZstdCompressionDict(dictionary) if dictionary is not None else None
            self._decompressor = zstandard.ZstdDecompressor(dict_data=zdict)
        self._cipher: FrameCipher | None = None
        if index.encrypted:
            if cipher_for is None:
                raise UnsupportedError("fragment is encrypted and no key is configured")
            self._cipher = cipher_for(index.key_block)

    def decode(self, i: int, stored: bytes | bytearray | memoryview) -> bytes:
        """The original chunk ``i`` from its stored frame; a FormatError when it is damaged."""
        r = self.index.records[i]
        size = int(r["size"])
        if len(stored) != int(r["stored_size"]):
            raise TruncatedError(f"frame {i}: {len(stored)} bytes, index says {r['stored_size']}")
        if zlib.crc32(stored) != int(r["frame_crc"]):
            raise CrcMismatchError(f"frame {i} of chunk {int(r['chunk_id'])}: CRC mismatch")
        frame: bytes | bytearray | memoryview = stored
        if self._cipher is not None:
            frame = self._cipher.open(i, False, bytes(stored))
        if self._decompressor is not None:
            import zstandard

            try:
                chunk = self._decompressor.decompress(frame, max_output_size=size)
            except zstandard.ZstdError as exc:
                raise FormatError(f"frame {i}: zstd: {exc}") from exc
        else:
            chunk = bytes(frame)
        self._check(i, chunk)
        return chunk

    def _check(self, i: int, chunk: bytes) -> None:
        info, _ = self.index.chunk(i)
        if len(chunk) != info.size:
            raise InvalidSizeError(f"frame {i} decoded to {len(chunk)} bytes, not {info.size}")
        header = decode_chunk_header(chunk)
        got = (header.chunk_id, header.timestamp, header.epoch, header.num_records)
        want = (info.chunk_id, info.timestamp, info.epoch, info.num_records)
        if (
            got != want
            or header.data_crc != info.crc
            or header.chunk_type != info.chunk_type
            or header.num_entries != info.num_entries
            or header.total_size != info.size
        ):
            raise InvalidSizeError(f"frame {i}: chunk header {got} != index {want}")
        bloom_end = CHUNK_HEADER_SIZE + header.bloom_size
        if chunk[CHUNK_HEADER_SIZE:bloom_end] != self.index.bloom(i):
            raise InvalidSizeError(f"frame {i}: bloom filter differs from the index")
        start = header.data_start
        check_crc(header, memoryview(chunk)[start : start + header.data_length])


def validate_fragment(
    data: bytes | bytearray | memoryview,
    *,
    check_chunks: bool = True,
    dictionary_for: Callable[[bytes], bytes] | None = None,
    cipher_for: CipherFor | None = None,
) -> FragmentIndex:
    """Validate a whole v1 or v2 fragment object; return its index.

    With ``check_chunks`` every chunk is checked too (v2: every frame decoded, which needs
    ``dictionary_for`` for a fragment compressed with a dictionary and ``cipher_for`` for an
    encrypted one).
    """
    view = memoryview(data).cast("B")
    if fragment_version(view) == 1:
        return validate_fragment_v1(view, check_chunks=check_chunks)
    index = decode_fragment(view, cipher_for)
    assert isinstance(index, FragmentIndexV2)
    if check_chunks:
        for _i, _chunk in iter_chunks(view, index, dictionary_for, cipher_for):
            pass
    return index


def iter_chunks(
    data: bytes | bytearray | memoryview,
    index: FragmentIndex,
    dictionary_for: Callable[[bytes], bytes] | None = None,
    cipher_for: CipherFor | None = None,
) -> Sequence[tuple[int, bytes | memoryview]]:
    """Every chunk of a whole fragment (v1: views into ``data``; v2: decoded frames)."""
    view = memoryview(data).cast("B")
    out: list[tuple[int, bytes | memoryview]] = []
    positions = index.records["position"].astype(np.int64).tolist()
    sizes = stored_sizes(index).astype(np.int64).tolist()
    if not isinstance(index, FragmentIndexV2):
        for i, (p, s) in enumerate(zip(positions, sizes, strict=True)):
            out.append((i, view[p : p + s]))
        return out
    dictionary = None
    if index.dictionary_id != NO_DICTIONARY:
        if dictionary_for is None:
            raise UnsupportedError("fragment needs its compression dictionary")
        dictionary = dictionary_for(index.dictionary_id)
    decoder = FrameDecoder(index, dictionary=dictionary, cipher_for=cipher_for)
    for i, (p, s) in enumerate(zip(positions, sizes, strict=True)):
        out.append((i, decoder.decode(i, view[p : p + s])))
    return out
