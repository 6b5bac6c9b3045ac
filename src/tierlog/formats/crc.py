"""CRC-32 with the zlib polynomial (what Osiris chunk headers carry).

ISA-L's implementation (PyPI ``isal``) is ~6x faster than zlib's with PCLMUL and gives
identical values; it is used when importable and checked against zlib's at import, so
a broken build can never produce different CRCs. Every hot CRC in tierlog goes here.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable

Crc32 = Callable[[bytes | bytearray | memoryview], int]

_CHECK = b"123456789"


def _pick() -> Crc32:
    try:
        isal_zlib = importlib.import_module("isal.isal_zlib")  # optional at run time
    except ImportError:
        return zlib.crc32
    fast: Crc32 = isal_zlib.crc32
    if fast(_CHECK) != zlib.crc32(_CHECK) or fast(b"") != 0:
        return zlib.crc32
    return fast


crc32: Crc32 = _pick()
"""CRC-32 of a whole buffer (zlib-compatible)."""
