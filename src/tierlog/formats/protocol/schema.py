"""Declared field schemas: every stream-protocol command is a dataclass whose fields carry
their wire type, and one generic encoder and decoder walk those declarations.

A command is declared once::

    @command(Command.DELETE, sent_by=CLIENT)
    @dataclass(frozen=True, slots=True)
    class DeleteRequest(Message):
        correlation_id: Annotated[int, UInt32]
        stream: Annotated[str, String]

The field order is the wire order (after ``Key:uint16 Version:uint16``); the annotation's
metadata is the wire type. ``Array``, ``Map`` and nested ``@structure`` classes compose;
``Trailing`` marks a last field that senders may leave out. Decoding is bounds-checked by
``Reader`` and rejects trailing bytes, so malformed input raises ProtocolError (or its
TruncatedFrameError); an encoder given a value its field cannot hold raises ProtocolError.

The hot paths (Publish, PublishConfirm, Deliver) are not declared here: they are
specialised by hand in ``publish`` and ``deliver`` and dispatched next to these.
"""

import copy
import dataclasses
import operator
import struct
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from tierlog.formats.protocol.constants import RESPONSE_FLAG, Command
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.formats.protocol.wire import (
    FRAME_HEADER,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Reader,
    encode_bytes,
    encode_string,
)

CLIENT = "client"
SERVER = "server"
BOTH = "both"


class FieldType(Protocol):
    """How one field goes to and from the wire."""

    min_size: int
    """Fewest bytes an encoded value takes (bounds array counts before allocating)."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, reader: Reader) -> Any: ...


class Fixed:
    """A fixed-size big-endian integer."""

    __slots__ = ("fmt", "min_size", "name")

    def __init__(self, name: str, fmt: struct.Struct) -> None:
        self.name = name
        self.fmt = fmt
        self.min_size = fmt.size

    def encode(self, value: Any) -> bytes:
        return self.fmt.pack(value)

    def decode(self, reader: Reader) -> Any:
        return reader.take(self.fmt)

    def __repr__(self) -> str:
        return self.name


Int16 = Fixed("Int16", I16)
Int32 = Fixed("Int32", I32)
Int64 = Fixed("Int64", I64)
UInt8 = Fixed("UInt8", U8)
UInt16 = Fixed("UInt16", U16)
UInt32 = Fixed("UInt32", U32)
UInt64 = Fixed("UInt64", U64)


class _Bool:
    """A uint8 that is 0 (false) or anything else (true); encodes as 0 or 1."""

    min_size = 1

    def encode(self, value: Any) -> bytes:
        return b"\x01" if value else b"\x00"

    def decode(self, reader: Reader) -> Any:
        return reader.u8() != 0


class _String:
    """int16 length + UTF-8; null (length -1) decodes as ""."""

    min_size = 2

    def encode(self, value: Any) -> bytes:
        return encode_string(value)

    def decode(self, reader: Reader) -> Any:
        return reader.string()


class _NullableString(_String):
    """Like String, but null stays None."""

    def decode(self, reader: Reader) -> Any:
        return reader.nullable_string()


class _Bytes:
    """int32 length + bytes; null (length -1) decodes as b""."""

    min_size = 4

    def encode(self, value: Any) -> bytes:
        return encode_bytes(bytes(value))

    def decode(self, reader: Reader) -> Any:
        return reader.bytes()


Bool = _Bool()
String = _String()
NullableString = _NullableString()
Bytes = _Bytes()


class TupleOf:
    """Several fixed-size integers as one tuple (e.g. the items of PublishError)."""

    __slots__ = ("fmt", "items", "min_size")

    def __init__(self, *items: Fixed) -> None:
        self.items = items
        self.fmt = struct.Struct(">" + "".join(k.fmt.format.lstrip("<>!=@") for k in items))
        self.min_size = self.fmt.size

    def encode(self, value: Any) -> bytes:
        return self.fmt.pack(*value)

    def decode(self, reader: Reader) -> Any:
        return reader.take_all(self.fmt)


class Array:
    """int32 count + items; decodes into ``container`` (list unless told)."""

    __slots__ = ("container", "item", "min_size")

    def __init__(self, item: "FieldType | type", container: Callable[[list[Any]], Any] = list):
        self.item = field_type_of(item)
        self.container = container
        self.min_size = 4

    def encode(self, value: Any) -> bytes:
        encode = self.item.encode
        return U32.pack(len(value)) + b"".join([encode(v) for v in value])

    def decode(self, reader: Reader) -> Any:
        decode = self.item.decode
        return self.container([decode(reader) for _ in range(reader.count(self.item.min_size))])


class Map:
    """int32 count + key/value pairs, decoded into a dict (later duplicates win)."""

    __slots__ = ("key", "min_size", "value")

    def __init__(self, key: FieldType, value: FieldType) -> None:
        self.key = key
        self.value = value
        self.min_size = 4

    def encode(self, value: Any) -> bytes:
        ek, ev = self.key.encode, self.value.encode
        items = value.items()
        return U32.pack(len(value)) + b"".join([ek(k) + ev(v) for k, v in items])

    def decode(self, reader: Reader) -> Any:
        dk, dv = self.key.decode, self.value.decode
        result: dict[Any, Any] = {}
        for _ in range(reader.count(self.key.min_size + self.value.min_size)):
            key = dk(reader)
            result[key] = dv(reader)
        return result


StringMap = Map(String, String)


class Trailing:
    """A last field that senders may leave out: decoded only when bytes remain (else
    ``default``); encoded always, or, with ``omit_default``, only when it is not the
    default (a peer that rejects the field where it expects nothing)."""

    __slots__ = ("default", "inner", "min_size", "omit_default")

    def __init__(self, inner: FieldType, default: Any, *, omit_default: bool = False) -> None:
        self.inner = inner
        self.default = default
        self.omit_default = omit_default
        self.min_size = 0

    def encode(self, value: Any) -> bytes:
        if self.omit_default and value == self.default:
            return b""
        return self.inner.encode(value)

    def decode(self, reader: Reader) -> Any:
        if not reader.remaining():
            return copy.copy(self.default)  # never hand out the shared default
        return self.inner.decode(reader)


class Schema:
    """The named, typed fields of a command or structure, in wire order.

    Runs of consecutive fixed-size integers are compiled into one ``struct.Struct`` each,
    so a run costs one pack or unpack however many fields it holds; a command made only
    of such fields is encoded with one pack call, frame header included.
    """

    __slots__ = ("_decode_steps", "_encode_steps", "_whole", "build", "fields", "min_size", "types")

    def __init__(self, fields: Sequence[tuple[str, FieldType]], build: Callable[..., Any]):
        self.fields = tuple(fields)
        self.types = tuple(kind for _, kind in fields)
        self.min_size = sum(kind.min_size for kind in self.types)
        self.build = build
        for kind in self.types[:-1]:
            if isinstance(kind, Trailing):
                raise TypeError("only the last field may be Trailing")
        # (struct of a fixed run, getter) or (None, getter, the field's encode / decode).
        encode_steps: list[
            tuple[struct.Struct | None, Callable[[Any], Any], Callable[[Any], bytes] | None]
        ] = []
        decode_steps: list[tuple[struct.Struct | None, Callable[[Reader], Any] | None]] = []
        run: list[tuple[str, Fixed]] = []

        def flush() -> None:
            if run:
                fmt = struct.Struct(">" + "".join(k.fmt.format.lstrip("<>!=@") for _, k in run))
                encode_steps.append((fmt, _tuple_getter([name for name, _ in run]), None))
                decode_steps.append((fmt, None))
                run.clear()

        for name, kind in self.fields:
            if isinstance(kind, Fixed):
                run.append((name, kind))
                continue
            flush()
            encode_steps.append((None, operator.attrgetter(name), kind.encode))
            decode_steps.append((None, kind.decode))
        flush()
        self._encode_steps = tuple(encode_steps)
        self._decode_steps = tuple(decode_steps)
        self._whole: tuple[struct.Struct, Callable[[Any], Any]] | None = None
        if not self.fields:
            self._whole = (struct.Struct(">IHH"), _tuple_getter([]))
        elif len(encode_steps) == 1:
            fmt, getter, _ = encode_steps[0]
            if fmt is not None:
                self._whole = (struct.Struct(">IHH" + fmt.format.lstrip(">")), getter)

    def encode(self, value: Any) -> bytes:
        """The fields of ``value`` in wire order (no frame header)."""
        parts: list[bytes] = []
        try:
            for fmt, getter, encode in self._encode_steps:
                if fmt is not None:
                    parts.append(fmt.pack(*getter(value)))
                else:
                    parts.append(encode(getter(value)))  # type: ignore[misc]
        except (struct.error, OverflowError, TypeError, UnicodeEncodeError) as exc:
            raise ProtocolError(f"cannot encode {type(value).__name__}: {exc}") from None
        return b"".join(parts)

    def encode_frame(self, value: Any, key: int, version: int) -> bytes:
        """The whole frame of ``value``: size, key, version, then its fields."""
        whole = self._whole
        if whole is not None:
            fmt, getter = whole
            try:
                return fmt.pack(fmt.size - 4, key, version, *getter(value))
            except (struct.error, OverflowError, TypeError) as exc:
                raise ProtocolError(f"cannot encode {type(value).__name__}: {exc}") from None
        body = self.encode(value)
        return FRAME_HEADER.pack(len(body) + 4, key, version) + body

    def decode(self, reader: Reader) -> Any:
        steps = self._decode_steps
        if len(steps) == 1 and steps[0][0] is not None:  # only fixed-size fields: one unpack
            return self.build(*reader.take_all(steps[0][0]))
        values: list[Any] = []
        for fmt, decode in steps:
            if fmt is not None:
                values += reader.take_all(fmt)
            else:
                values.append(decode(reader))  # type: ignore[misc]
        return self.build(*values)

    @property
    def has_trailing(self) -> bool:
        """Whether the last field may be left out by senders."""
        return bool(self.types) and isinstance(self.types[-1], Trailing)


def _tuple_getter(names: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A C-level getter of these attributes as a tuple (attrgetter of one name is not)."""
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda value: (one(value),)
    if not names:
        return lambda value: ()
    return operator.attrgetter(*names)


class StructType:
    """A nested ``@structure`` used as a field type (e.g. the items of an Array)."""

    __slots__ = ("min_size", "schema")

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.min_size = schema.min_size

    def encode(self, value: Any) -> bytes:
        return self.schema.encode(value)

    def decode(self, reader: Reader) -> Any:
        return self.schema.decode(reader)


def field_type_of(kind: "FieldType | type") -> FieldType:
    """A field type, or the field type of a ``@structure`` class."""
    if isinstance(kind, type):
        schema = getattr(kind, "SCHEMA", None)
        if not isinstance(schema, Schema):
            raise TypeError(f"{kind.__name__} is not a @structure")
        return StructType(schema)
    return kind


def _schema_of(cls: type) -> Schema:
    """Read the wire types from the dataclass fields' ``Annotated`` metadata."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass (apply @dataclass first)")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: list[tuple[str, FieldType]] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        meta: tuple[Any, ...] = getattr(hint, "__metadata__", ())
        if len(meta) != 1:
            raise TypeError(f"{cls.__name__}.{f.name}: annotate as Annotated[type, WireType]")
        fields.append((f.name, field_type_of(meta[0])))
    return Schema(fields, cls)


T = TypeVar("T", bound=type)


def structure(cls: T) -> T:
    """Declare a nested structure (no key of its own) from its annotated fields."""
    cls.SCHEMA = _schema_of(cls)  # type: ignore[attr-defined]
    return cls


class Message:
    """Base of every schema-declared command: ``encode`` gives the whole frame."""

    __slots__ = ()
    command: ClassVar[Command]
    """The command this frame belongs to (a request and its response share it)."""
    KEY: ClassVar[int]
    """The key on the wire, response flag included."""
    VERSION: ClassVar[int] = 1
    SCHEMA: ClassVar[Schema]

    def encode(self) -> bytes:
        """The whole frame, size prefix included."""
        return self.SCHEMA.encode_frame(self, self.KEY, self.VERSION)


M = TypeVar("M", bound=type[Message])

CLIENT_COMMANDS: dict[int, type[Message]] = {}
"""Key → command class, for frames a client sends (what the server decodes)."""
SERVER_COMMANDS: dict[int, type[Message]] = {}
"""Key → command class, for frames a server sends (what a client decodes)."""


def command(key: Command, *, response: bool = False, sent_by: str) -> Callable[[M], M]:
    """Declare a command from its annotated dataclass fields and register its decoder.

    ``response`` sets the response bit of the key; ``sent_by`` (CLIENT, SERVER or BOTH)
    says which side's decoder knows it.
    """
    if sent_by not in (CLIENT, SERVER, BOTH):
        raise ValueError(f"sent_by must be CLIENT, SERVER or BOTH, not {sent_by!r}")

    def declare(cls: M) -> M:
        cls.command = key
        cls.KEY = key | RESPONSE_FLAG if response else int(key)
        cls.SCHEMA = _schema_of(cls)
        registries = {CLIENT: (CLIENT_COMMANDS,), SERVER: (SERVER_COMMANDS,)}.get(
            sent_by, (CLIENT_COMMANDS, SERVER_COMMANDS)
        )
        for registry in registries:
            if cls.KEY in registry:
                raise TypeError(f"key {cls.KEY:#06x} declared twice: {registry[cls.KEY]}")
            registry[cls.KEY] = cls
        return cls

    return declare


__all__ = [
    "BOTH",
    "CLIENT",
    "CLIENT_COMMANDS",
    "SERVER",
    "SERVER_COMMANDS",
    "Array",
    "Bool",
    "Bytes",
    "FieldType",
    "Fixed",
    "Int16",
    "Int32",
    "Int64",
    "Map",
    "Message",
    "NullableString",
    "Schema",
    "String",
    "StringMap",
    "Trailing",
    "TupleOf",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "command",
    "structure",
]
