"""The fast CRC-32 is exactly zlib's, and falls back to zlib when ISA-L is missing."""

from __future__ import annotations

import sys
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats import crc


@given(st.binary(max_size=5000), st.integers(0, 16))
def test_crc32_is_zlib_crc32(data: bytes, skip: int) -> None:
    view = memoryview(data)[skip:]
    assert crc.crc32(view) == zlib.crc32(view)
    assert crc.crc32(bytearray(view)) == zlib.crc32(view)


def test_isal_is_used_when_installed() -> None:
    # isal is a core dependency: the fast path must be the one in use.
    assert crc.crc32 is not zlib.crc32
    assert crc.crc32(b"123456789") == 0xCBF43926


def test_falls_back_to_zlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)  # import raises ImportError
    assert crc._pick() is zlib.crc32
