"""A decoder of Erlang's external term format (what ``term_to_binary`` writes), enough for
the terms RabbitMQ's message store writes to disk: integers, floats, atoms, tuples, lists,
strings, binaries, maps, pids, ports and references.

Atoms decode to :class:`Atom` (a ``str`` subclass, so ``Atom("ok") == "ok"``), tuples to
``tuple``, proper lists to ``list`` (``[]`` for NIL), an improper list to
:class:`ImproperList`, binaries to ``bytes``, pids / ports / references to :class:`Opaque`
(their raw encoding: they mean nothing outside the node that made them). Compressed terms
(tag 80) are inflated. Anything else is a typed :class:`ErlangTermError`.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

from tierlog.formats.errors import (
    ErlangTermError,
    TruncatedTermError,
    UnsupportedTermError,
)

VERSION_MAGIC = 131


class Atom(str):
    """An Erlang atom."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Atom({str(self)!r})"


class Opaque(NamedTuple):
    """A pid, port or reference: its tag and raw encoded bytes."""

    tag: int
    raw: bytes


class ImproperList(NamedTuple):
    """A list whose tail is not ``[]``."""

    items: list[Any]
    tail: Any


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_F64 = struct.Struct(">d")


def decode(data: bytes | memoryview) -> Any:
    """Decode one whole ``term_to_binary`` output (starting with the version byte 131)."""
    term, end = decode_prefix(data, 0)
    if end != len(data):
        raise ErlangTermError(f"{len(data) - end} bytes after the term")
    return term


def decode_prefix(data: bytes | memoryview, position: int) -> tuple[Any, int]:
    """Decode the term starting at ``position`` (version byte included): (term, end)."""
    view = memoryview(data)
    _need(view, position, 1)
    if view[position] != VERSION_MAGIC:
        raise ErlangTermError(f"term starts with {view[position]}, expected {VERSION_MAGIC}")
    position += 1
    _need(view, position, 1)
    if view[position] == 80:  # COMPRESSED: uncompressed size u32, then zlib data
        _need(view, position, 5)
        (size,) = _U32.unpack_from(view, position + 1)
        try:
            inflater = zlib.decompressobj()
            raw = inflater.decompress(view[position + 5 :], size)
        except zlib.error as exc:
            raise ErlangTermError(f"compressed term does not inflate: {exc}") from exc
        if len(raw) != size:
            raise TruncatedTermError(f"compressed term inflates to {len(raw)} of {size} bytes")
        term, end = _Decoder(memoryview(raw)).term(0)
        if end != size:
            raise ErlangTermError("bytes after the compressed term")
        return term, len(view) - len(inflater.unused_data)
    return _Decoder(view).term(position)


def _need(view: memoryview, position: int, count: int) -> None:
    if position + count > len(view):
        raise TruncatedTermError(f"term needs {count} bytes at {position}, buffer has {len(view)}")


class _Decoder:
    def __init__(self, view: memoryview) -> None:
        self.view = view

    def u8(self, position: int) -> int:
        _need(self.view, position, 1)
        return int(self.view[position])

    def u16(self, position: int) -> int:
        _need(self.view, position, 2)
        return int(_U16.unpack_from(self.view, position)[0])

    def u32(self, position: int) -> int:
        _need(self.view, position, 4)
        return int(_U32.unpack_from(self.view, position)[0])

    def raw(self, position: int, count: int) -> bytes:
        _need(self.view, position, count)
        return bytes(self.view[position : position + count])

    def term(self, position: int) -> tuple[Any, int]:
        tag = self.u8(position)
        p = position + 1
        if tag == 97:  # SMALL_INTEGER_EXT
            return self.u8(p), p + 1
        if tag == 98:  # INTEGER_EXT
            _need(self.view, p, 4)
            return int(_I32.unpack_from(self.view, p)[0]), p + 4
        if tag in (110, 111):  # SMALL_BIG_EXT, LARGE_BIG_EXT
            if tag == 110:
                n, p = self.u8(p), p + 1
            else:
                n, p = self.u32(p), p + 4
            sign = self.u8(p)
            value = int.from_bytes(self.raw(p + 1, n), "little")
            return (-value if sign else value), p + 1 + n
        if tag == 70:  # NEW_FLOAT_EXT
            _need(self.view, p, 8)
            return float(_F64.unpack_from(self.view, p)[0]), p + 8
        if tag == 99:  # FLOAT_EXT: 31 bytes of printf text
            return float(self.raw(p, 31).rstrip(b"\0").decode()), p + 31
        if tag in (100, 118):  # ATOM_EXT (latin-1), ATOM_UTF8_EXT
            n = self.u16(p)
            text = self.raw(p + 2, n).decode("latin-1" if tag == 100 else "utf-8")
            return Atom(text), p + 2 + n
        if tag in (115, 119):  # SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT
            n = self.u8(p)
            text = self.raw(p + 1, n).decode("latin-1" if tag == 115 else "utf-8")
            return Atom(text), p + 1 + n
        if tag in (104, 105):  # SMALL_TUPLE_EXT, LARGE_TUPLE_EXT
            if tag == 104:
                n, p = self.u8(p), p + 1
            else:
                n, p = self.u32(p), p + 4
            items = []
            for _ in range(n):
                item, p = self.term(p)
                items.append(item)
            return tuple(items), p
        if tag == 106:  # NIL_EXT
            return [], p
        if tag == 107:  # STRING_EXT: list of bytes
            n = self.u16(p)
            return list(self.raw(p + 2, n)), p + 2 + n
        if tag == 108:  # LIST_EXT
            n, p = self.u32(p), p + 4
            items = []
            for _ in range(n):
                item, p = self.term(p)
                items.append(item)
            tail, p = self.term(p)
            if tail == []:
                return items, p
            return ImproperList(items, tail), p
        if tag == 109:  # BINARY_EXT
            n = self.u32(p)
            return self.raw(p + 4, n), p + 4 + n
        if tag == 77:  # BIT_BINARY_EXT: whole bytes only matter here
            n = self.u32(p)
            return self.raw(p + 5, n), p + 5 + n
        if tag == 116:  # MAP_EXT
            n, p = self.u32(p), p + 4
            result: dict[Any, Any] = {}
            for _ in range(n):
                key, p = self.term(p)
                value, p = self.term(p)
                result[_hashable(key)] = value
            return result, p
        if tag in (88, 103):  # NEW_PID_EXT, PID_EXT: node atom, id, serial, creation
            end = self._skip_node(p) + (12 if tag == 88 else 9)
            return Opaque(tag, self.raw(position, end - position)), end
        if tag in (89, 102, 120):  # NEW_PORT_EXT, PORT_EXT, V4_PORT_EXT
            end = self._skip_node(p) + {89: 8, 102: 5, 120: 12}[tag]
            return Opaque(tag, self.raw(position, end - position)), end
        if tag in (90, 114):  # NEWER_REFERENCE_EXT, NEW_REFERENCE_EXT
            n = self.u16(p)
            end = self._skip_node(p + 2) + (4 if tag == 90 else 1) + 4 * n
            return Opaque(tag, self.raw(position, end - position)), end
        raise UnsupportedTermError(f"term tag {tag} at position {position} is not supported")

    def _skip_node(self, position: int) -> int:
        _node, end = self.term(position)
        if not isinstance(_node, Atom):
            raise ErlangTermError(f"node name at {position} is not an atom")
        return end


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), v) for k, v in value.items()))
    return value
