"""Primitive wire types of the stream protocol: a bounds-checked reader and encoders
(composed into command schemas by ``schema``).

Integers are big-endian. ``string`` is an int16 length then UTF-8 bytes, ``bytes`` an
int32 length then the bytes; a length of -1 means null. Arrays are an int32 count then
the items.
"""

import struct
from typing import Any

from tierlog.formats.protocol.constants import FRAME_SIZE_BYTES
from tierlog.formats.protocol.errors import ProtocolError, TruncatedFrameError

U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
I16 = struct.Struct(">h")
U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
FRAME_HEADER = struct.Struct(">IHH")
"""Size, key, version: the first 8 bytes of every frame on the wire."""

NULL_STRING_LENGTH = 0xFFFF
"""-1 as an int16; clients write string lengths unsigned, so 0xFFFF is the only null."""
MAX_STRING_BYTES = 0xFFFE
NULL_LENGTH = -1


class Reader:
    """Reads fields from one frame body (the bytes after the size prefix)."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview | bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, fmt: struct.Struct) -> int:
        pos = self.pos
        if pos + fmt.size > self.end:
            raise TruncatedFrameError(f"frame ends at {self.end}, field needs {fmt.size} at {pos}")
        self.pos = pos + fmt.size
        value: int = fmt.unpack_from(self.buf, pos)[0]
        return value

    def take_all(self, fmt: struct.Struct) -> tuple[Any, ...]:
        """Every field of ``fmt`` at once (several fixed-size fields in one unpack)."""
        pos = self.pos
        if pos + fmt.size > self.end:
            raise TruncatedFrameError(f"frame ends at {self.end}, fields need {fmt.size} at {pos}")
        self.pos = pos + fmt.size
        return fmt.unpack_from(self.buf, pos)

    def u8(self) -> int:
        return self.take(U8)

    def u16(self) -> int:
        return self.take(U16)

    def i16(self) -> int:
        return self.take(I16)

    def u32(self) -> int:
        return self.take(U32)

    def i32(self) -> int:
        return self.take(I32)

    def u64(self) -> int:
        return self.take(U64)

    def i64(self) -> int:
        return self.take(I64)

    def raw(self, length: int) -> memoryview:
        pos = self.pos
        if length < 0 or pos + length > self.end:
            raise TruncatedFrameError(f"frame ends at {self.end}, field needs {length} at {pos}")
        self.pos = pos + length
        view = self.buf if isinstance(self.buf, memoryview) else memoryview(self.buf)
        return view[pos : pos + length]

    def nullable_string(self) -> str | None:
        length = self.u16()
        if length == NULL_STRING_LENGTH:
            return None
        try:
            return str(self.raw(length), "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"string is not valid UTF-8: {exc}") from None

    def string(self) -> str:
        value = self.nullable_string()
        return "" if value is None else value

    def bytes(self) -> bytes:
        length = self.i32()
        if length == NULL_LENGTH:
            return b""
        if length < 0:
            raise ProtocolError(f"invalid bytes length {length}")
        return bytes(self.raw(length))

    def count(self, min_item_size: int) -> int:
        """Read an array count and check the frame can hold that many items."""
        n = self.i32()
        if n < 0:
            raise ProtocolError(f"invalid array length {n}")
        if n * min_item_size > self.remaining():
            raise TruncatedFrameError(f"array of {n} items cannot fit in {self.remaining()} bytes")
        return n

    def done(self) -> None:
        if self.pos != self.end:
            raise ProtocolError(f"{self.end - self.pos} unexpected bytes at the end of the frame")


def encode_string(value: str | None) -> bytes:
    if value is None:
        return U16.pack(NULL_STRING_LENGTH)
    data = value.encode("utf-8")
    if len(data) > MAX_STRING_BYTES:
        raise ProtocolError(f"string of {len(data)} bytes is too long for the protocol")
    return U16.pack(len(data)) + data


def encode_bytes(value: bytes | None) -> bytes:
    if value is None:
        return I32.pack(NULL_LENGTH)
    return U32.pack(len(value)) + value


def frame(key: int, version: int, *parts: bytes) -> bytes:
    """Assemble a whole frame, size prefix included."""
    body = b"".join(parts)
    return FRAME_HEADER.pack(len(body) + 4, key, version) + body


__all__ = [
    "FRAME_HEADER",
    "FRAME_SIZE_BYTES",
    "Reader",
    "encode_bytes",
    "encode_string",
    "frame",
]
