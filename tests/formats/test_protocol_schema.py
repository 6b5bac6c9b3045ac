"""Schema-declared stream-protocol commands: every declared command round-trips, rejects
truncation and trailing bytes with typed errors, and refuses to encode values its fields
cannot hold. Strategies are derived from the declarations themselves, so a command added
to a schema module is covered without touching this file."""

from __future__ import annotations

import dataclasses
import struct
from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import FormatError
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import RESPONSE_FLAG, Command, OffsetType
from tierlog.formats.protocol.consumers import OffsetSpecType, WireOffsetSpec
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.schema import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Array,
    Bool,
    Bytes,
    FieldType,
    Fixed,
    Map,
    Message,
    NullableString,
    Schema,
    String,
    StructType,
    Trailing,
    TupleOf,
    UInt8,
    UInt32,
    command,
)

_RANGES = {
    "B": (0, 2**8 - 1),
    "H": (0, 2**16 - 1),
    "I": (0, 2**32 - 1),
    "Q": (0, 2**64 - 1),
    "h": (-(2**15), 2**15 - 1),
    "i": (-(2**31), 2**31 - 1),
    "q": (-(2**63), 2**63 - 1),
}


def fixed_range(kind: Fixed) -> tuple[int, int]:
    return _RANGES[kind.fmt.format[-1]]


def strategy_for(kind: FieldType) -> st.SearchStrategy[Any]:
    """Values of a field type, exactly as its decoder returns them."""
    if isinstance(kind, Fixed):
        return st.integers(*fixed_range(kind))
    if kind is Bool:
        return st.booleans()
    if kind is NullableString:
        return st.none() | st.text(max_size=12)
    if kind is String:
        return st.text(max_size=12)
    if kind is Bytes:
        return st.binary(max_size=20)
    if isinstance(kind, Array):
        return st.lists(strategy_for(kind.item), max_size=4).map(kind.container)
    if isinstance(kind, Map):
        return st.dictionaries(strategy_for(kind.key), strategy_for(kind.value), max_size=4)
    if isinstance(kind, Trailing):
        return strategy_for(kind.inner)
    if isinstance(kind, TupleOf):
        return st.tuples(*[strategy_for(item) for item in kind.items])
    if isinstance(kind, StructType):
        return schema_strategy(kind.schema)
    if isinstance(kind, OffsetSpecType):
        simple = [OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT]
        if kind.allow_none:
            simple.append(OffsetType.NONE)
        return st.one_of(
            st.sampled_from(simple).map(WireOffsetSpec),
            st.integers(0, 2**64 - 1).map(lambda v: WireOffsetSpec(OffsetType.OFFSET, v)),
            st.integers(-(2**63), 2**63 - 1).map(lambda v: WireOffsetSpec(OffsetType.TIMESTAMP, v)),
        )
    raise AssertionError(f"no strategy for field type {kind!r}")


def schema_strategy(schema: Schema) -> st.SearchStrategy[Any]:
    return st.builds(schema.build, *[strategy_for(kind) for kind in schema.types])


DECLARED = sorted(
    {*CLIENT_COMMANDS.values(), *SERVER_COMMANDS.values()}, key=lambda cls: cls.__name__
)


def decoders_of(cls: type[Message]) -> list[Any]:
    """The decoder(s) of the side(s) that receive ``cls``."""
    decoders = []
    if CLIENT_COMMANDS.get(cls.KEY) is cls:
        decoders.append(c.decode_client_frame)
    if SERVER_COMMANDS.get(cls.KEY) is cls:
        decoders.append(c.decode_server_frame)
    return decoders


def body_of(frame: bytes) -> memoryview:
    frames = FrameSplitter().feed(frame)
    assert len(frames) == 1
    return frames[0]


def test_every_command_without_a_hot_path_is_declared() -> None:
    hot = {Command.PUBLISH, Command.PUBLISH_CONFIRM, Command.DELIVER}
    # known to the server only to answer UNKNOWN_FRAME (docs/compatibility.md)
    unsupported = {Command.RESOLVE_OFFSET_SPEC}
    declared = {cls.KEY & ~RESPONSE_FLAG for cls in DECLARED}
    assert declared == set(Command) - hot - unsupported
    for cls in DECLARED:
        assert cls.__name__ in c.__all__, cls  # re-exported by the facade
        assert getattr(c, cls.__name__) is cls


@pytest.mark.parametrize("cls", DECLARED, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_declared_command_round_trips(cls: type[Message], data: st.DataObject) -> None:
    value = data.draw(schema_strategy(cls.SCHEMA))
    wire = value.encode()
    assert struct.unpack_from(">IHH", wire) == (len(wire) - 4, cls.KEY, 1)
    for decode in decoders_of(cls):
        assert decode(body_of(wire)) == value


@pytest.mark.parametrize("cls", DECLARED, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_declared_command_truncated_or_extended_is_a_typed_error(
    cls: type[Message], data: st.DataObject
) -> None:
    value = data.draw(schema_strategy(cls.SCHEMA))
    body = bytes(body_of(value.encode()))
    for decode in decoders_of(cls):
        with pytest.raises(FormatError):
            decode(body + data.draw(st.binary(min_size=1, max_size=3)))
        for cut in range(4, len(body)):
            try:
                decoded = decode(body[:cut])
            except FormatError:
                continue
            # Only a missing trailing field or a bare error answer may decode.
            assert cls.SCHEMA.has_trailing or isinstance(decoded, c.SimpleResponse), (cls, cut)


@pytest.mark.parametrize("cls", DECLARED, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_declared_command_refuses_values_its_fields_cannot_hold(
    cls: type[Message], data: st.DataObject
) -> None:
    value = data.draw(schema_strategy(cls.SCHEMA))
    for name, kind in cls.SCHEMA.fields:
        if isinstance(kind, Fixed):
            low, high = fixed_range(kind)
            too_big = dataclasses.replace(value, **{name: high + 1})
            with pytest.raises(ProtocolError):
                too_big.encode()
            too_small = dataclasses.replace(value, **{name: low - 1})
            with pytest.raises(ProtocolError):
                too_small.encode()
        elif kind is String:
            too_long = dataclasses.replace(value, **{name: "x" * 0x10000})
            with pytest.raises(ProtocolError):
                too_long.encode()


def test_trailing_default_is_not_shared_between_decoded_frames() -> None:
    wire = struct.pack(">HHIB", Command.SUBSCRIBE, 1, 1, 0) + b"\x00\x01s" + b"\x00\x01\x00\x05"
    first = c.decode_client_frame(wire)
    second = c.decode_client_frame(wire)
    assert isinstance(first, c.SubscribeRequest) and isinstance(second, c.SubscribeRequest)
    assert first.properties == {} and first.properties is not second.properties


def test_declarations_are_checked() -> None:
    with pytest.raises(TypeError, match="declared twice"):

        @command(Command.CREDIT, sent_by="client")
        @dataclasses.dataclass(frozen=True)
        class AnotherCredit(Message):
            subscription_id: Annotated[int, UInt8]

    with pytest.raises(TypeError, match="Annotated"):

        @command(Command.CREATE_SUPER_STREAM, sent_by="client")
        @dataclasses.dataclass(frozen=True)
        class Unannotated(Message):
            correlation_id: int

    with pytest.raises(TypeError, match="only the last field"):
        Schema([("a", Trailing(UInt8, 0)), ("b", UInt32)], tuple)
    with pytest.raises(ValueError):
        command(Command.CREATE_SUPER_STREAM, sent_by="nobody")
