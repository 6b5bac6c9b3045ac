"""Consumers: subscribe (with an offset specification), credit, stored offsets,
unsubscribe, single-active-consumer updates.

Deliver is the hot path, specialised in ``deliver``.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from tierlog.formats.protocol.constants import Command, OffsetType
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.formats.protocol.schema import (
    CLIENT,
    SERVER,
    Bool,
    Message,
    String,
    StringMap,
    Trailing,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    command,
)
from tierlog.formats.protocol.wire import I64, U16, U64, Reader


@dataclass(frozen=True, slots=True)
class WireOffsetSpec:
    """Where a subscription starts: ``value`` is the offset (OFFSET) or ms (TIMESTAMP)."""

    type: OffsetType
    value: int = 0


class OffsetSpecType:
    """``Type:uint16`` then, for OFFSET a uint64, for TIMESTAMP an int64, else nothing.

    ``allow_none`` accepts type 0 (NONE), which only ConsumerUpdate answers use; there the
    spec is the frame's last field, and after types 0..3 RabbitMQ ignores whatever follows
    (``rabbit_stream_core:offset_spec/2``): the Node.js client writes the type alone,
    rstream always adds an 8-byte value. Both are accepted; other lengths stay malformed.
    """

    __slots__ = ("allow_none", "min_size")

    def __init__(self, *, allow_none: bool) -> None:
        self.allow_none = allow_none
        self.min_size = 2

    def encode(self, value: Any) -> bytes:
        if value.type == OffsetType.OFFSET:
            return U16.pack(value.type) + U64.pack(value.value)
        if value.type == OffsetType.TIMESTAMP:
            return U16.pack(value.type) + I64.pack(value.value)
        return U16.pack(value.type)

    def decode(self, reader: Reader) -> Any:
        raw_type = reader.u16()
        if raw_type == OffsetType.OFFSET:
            return WireOffsetSpec(OffsetType.OFFSET, reader.u64())
        if raw_type == OffsetType.TIMESTAMP:
            return WireOffsetSpec(OffsetType.TIMESTAMP, reader.i64())
        if raw_type in (OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT) or (
            self.allow_none and raw_type == OffsetType.NONE
        ):
            if self.allow_none and reader.remaining() == I64.size:
                reader.raw(I64.size)  # rstream's value after these types: meaningless
            return WireOffsetSpec(OffsetType(raw_type))
        raise ProtocolError(f"unknown offset type {raw_type}")


SubscribeOffset = OffsetSpecType(allow_none=False)
ConsumerUpdateOffset = OffsetSpecType(allow_none=True)


@command(Command.SUBSCRIBE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class SubscribeRequest(Message):
    """RabbitMQ's clients leave out an empty properties map."""

    correlation_id: Annotated[int, UInt32]
    subscription_id: Annotated[int, UInt8]
    stream: Annotated[str, String]
    offset_spec: Annotated[WireOffsetSpec, SubscribeOffset]
    credit: Annotated[int, UInt16]
    properties: Annotated[Mapping[str, str], Trailing(StringMap, {})] = field(default_factory=dict)


@command(Command.CREDIT, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class CreditRequest(Message):
    """No response unless it fails (then a CreditResponse)."""

    subscription_id: Annotated[int, UInt8]
    credit: Annotated[int, UInt16]


@command(Command.CREDIT, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class CreditResponse(Message):
    """The one response without a correlation id: code first, then the subscription."""

    response_code: Annotated[int, UInt16]
    subscription_id: Annotated[int, UInt8]


@command(Command.STORE_OFFSET, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class StoreOffsetRequest(Message):
    reference: Annotated[str, String]
    stream: Annotated[str, String]
    offset: Annotated[int, UInt64]


@command(Command.QUERY_OFFSET, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class QueryOffsetRequest(Message):
    correlation_id: Annotated[int, UInt32]
    reference: Annotated[str, String]
    stream: Annotated[str, String]


@command(Command.QUERY_OFFSET, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class QueryOffsetResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    offset: Annotated[int, UInt64]


@command(Command.UNSUBSCRIBE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class UnsubscribeRequest(Message):
    correlation_id: Annotated[int, UInt32]
    subscription_id: Annotated[int, UInt8]


@command(Command.CONSUMER_UPDATE, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class ConsumerUpdateRequest(Message):
    """Server → client (single active consumer): you are now (in)active."""

    correlation_id: Annotated[int, UInt32]
    subscription_id: Annotated[int, UInt8]
    active: Annotated[bool, Bool]


@command(Command.CONSUMER_UPDATE, response=True, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class ConsumerUpdateResponse(Message):
    """Client → server: where the newly active consumer wants to start."""

    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    offset_spec: Annotated[WireOffsetSpec, ConsumerUpdateOffset]
