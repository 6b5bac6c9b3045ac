"""Decompression bombs: every codec stops at the sub-batch's declared length."""

from __future__ import annotations

import lz4.frame
import pytest
import snappy

from tierlog.formats.compression import Compression, compress, decompress
from tierlog.formats.errors import InvalidSizeError

BOMB = b"\0" * (64 * 1024 * 1024)


@pytest.mark.parametrize(
    "code,blob",
    [
        (Compression.GZIP, compress(Compression.GZIP, BOMB)),
        (Compression.ZSTD, compress(Compression.ZSTD, BOMB)),
        (Compression.LZ4, lz4.frame.compress(BOMB)),
        (Compression.SNAPPY, compress(Compression.SNAPPY, BOMB)),  # framed stream
        (Compression.SNAPPY, snappy.compress(BOMB)),  # raw block
    ],
)
def test_a_bomb_is_refused_without_expanding(code: int, blob: bytes) -> None:
    with pytest.raises(InvalidSizeError) as info:
        decompress(code, blob, 4096)
    # stopped at the cap (one byte past it) or before decoding at all, never at 64 MiB
    message = str(info.value)
    assert "67108864" not in message.split("header says")[0] or "declares" in message


@pytest.mark.parametrize("code", [Compression.LZ4, Compression.SNAPPY])
def test_honest_sub_batches_still_decode(code: int) -> None:
    data = b"".join(b"record %d " % i for i in range(10_000))
    assert bytes(decompress(code, compress(code, data), len(data))) == data
    assert bytes(decompress(Compression.SNAPPY, snappy.compress(data), len(data))) == data
