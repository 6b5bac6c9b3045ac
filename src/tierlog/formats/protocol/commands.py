"""Typed stream-protocol commands with encoders and decoders for both directions.

The server uses ``decode_client_frame`` on what clients send and the ``encode`` method
of responses; tests and fuzzers use the client side (``encode`` of requests,
``decode_server_frame``). Every ``encode`` returns a whole frame, size prefix
included. Frames a side does not know come back as ``UnknownCommand`` so the caller can
answer with ``ResponseCode.UNKNOWN_FRAME``; malformed frames raise ProtocolError.
"""

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from tierlog.formats.protocol.constants import RESPONSE_FLAG, Command, OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver, decode_deliver
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.formats.protocol.frames import MIN_FRAME_SIZE
from tierlog.formats.protocol.publish import (
    PublishBatch,
    PublishConfirm,
    PublishError,
    decode_publish,
    decode_publish_confirm,
    decode_publish_error,
)
from tierlog.formats.protocol.wire import (
    I64,
    U8,
    U16,
    U32,
    U64,
    Reader,
    encode_bytes,
    encode_string,
    encode_string_map,
    encode_strings,
    frame,
)

_KEY_VERSION = struct.Struct(">HH")
_CORR_CODE = struct.Struct(">IH")
_COMMAND_VERSION = struct.Struct(">HHH")


def _request(command: Command, correlation_id: int, *parts: bytes) -> bytes:
    return frame(command, 1, U32.pack(correlation_id), *parts)


def _response(command: Command, correlation_id: int, code: int, *parts: bytes) -> bytes:
    return frame(command | RESPONSE_FLAG, 1, _CORR_CODE.pack(correlation_id, code), *parts)


# ---------------------------------------------------------------- shared structures


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a subscription starts: ``value`` is the offset (OFFSET) or ms (TIMESTAMP)."""

    type: OffsetType
    value: int = 0

    def encode(self) -> bytes:
        if self.type == OffsetType.OFFSET:
            return U16.pack(self.type) + U64.pack(self.value)
        if self.type == OffsetType.TIMESTAMP:
            return U16.pack(self.type) + I64.pack(self.value)
        return U16.pack(self.type)

    @staticmethod
    def read(reader: Reader, allow_none: bool = False) -> "OffsetSpec":
        raw_type = reader.u16()
        if raw_type == OffsetType.OFFSET:
            return OffsetSpec(OffsetType.OFFSET, reader.u64())
        if raw_type == OffsetType.TIMESTAMP:
            return OffsetSpec(OffsetType.TIMESTAMP, reader.i64())
        if raw_type in (OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT) or (
            allow_none and raw_type == OffsetType.NONE
        ):
            return OffsetSpec(OffsetType(raw_type))
        raise ProtocolError(f"unknown offset type {raw_type}")


@dataclass(frozen=True, slots=True)
class CommandVersion:
    key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class Broker:
    reference: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """One stream of a Metadata response; leader 0xFFFF when the stream is not there."""

    name: str
    response_code: int
    leader_reference: int
    replica_references: Sequence[int] = ()


# ---------------------------------------------------------------- connection set-up


@dataclass(frozen=True, slots=True)
class PeerPropertiesRequest:
    command: ClassVar[Command] = Command.PEER_PROPERTIES
    correlation_id: int
    properties: Mapping[str, str]

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, encode_string_map(self.properties))


@dataclass(frozen=True, slots=True)
class PeerPropertiesResponse:
    command: ClassVar[Command] = Command.PEER_PROPERTIES
    correlation_id: int
    response_code: int
    properties: Mapping[str, str]

    def encode(self) -> bytes:
        return _response(
            self.command,
            self.correlation_id,
            self.response_code,
            encode_string_map(self.properties),
        )


@dataclass(frozen=True, slots=True)
class SaslHandshakeRequest:
    command: ClassVar[Command] = Command.SASL_HANDSHAKE
    correlation_id: int

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id)


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse:
    command: ClassVar[Command] = Command.SASL_HANDSHAKE
    correlation_id: int
    response_code: int
    mechanisms: Sequence[str]

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, encode_strings(self.mechanisms)
        )


@dataclass(frozen=True, slots=True)
class SaslAuthenticateRequest:
    """PLAIN data is ``authzid NUL user NUL password``; see ``plain_credentials``."""

    command: ClassVar[Command] = Command.SASL_AUTHENTICATE
    correlation_id: int
    mechanism: str
    data: bytes

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            encode_string(self.mechanism),
            encode_bytes(self.data),
        )


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse:
    """The challenge is sent only when non-empty (RabbitMQ does the same; rstream needs it)."""

    command: ClassVar[Command] = Command.SASL_AUTHENTICATE
    correlation_id: int
    response_code: int
    challenge: bytes = b""

    def encode(self) -> bytes:
        extra = encode_bytes(self.challenge) if self.challenge else b""
        return _response(self.command, self.correlation_id, self.response_code, extra)


@dataclass(frozen=True, slots=True)
class Tune:
    """Server proposes frame max / heartbeat, client answers with the values it accepts."""

    command: ClassVar[Command] = Command.TUNE
    frame_max: int
    heartbeat: int

    def encode(self) -> bytes:
        return frame(self.command, 1, U32.pack(self.frame_max), U32.pack(self.heartbeat))


@dataclass(frozen=True, slots=True)
class OpenRequest:
    command: ClassVar[Command] = Command.OPEN
    correlation_id: int
    virtual_host: str

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, encode_string(self.virtual_host))


@dataclass(frozen=True, slots=True)
class OpenResponse:
    command: ClassVar[Command] = Command.OPEN
    correlation_id: int
    response_code: int
    properties: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _response(
            self.command,
            self.correlation_id,
            self.response_code,
            encode_string_map(self.properties),
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    command: ClassVar[Command] = Command.HEARTBEAT

    def encode(self) -> bytes:
        return frame(self.command, 1)


@dataclass(frozen=True, slots=True)
class CloseRequest:
    """Sent by either side; the other answers with a SimpleResponse for CLOSE."""

    command: ClassVar[Command] = Command.CLOSE
    correlation_id: int
    code: int
    reason: str

    def encode(self) -> bytes:
        return _request(
            self.command, self.correlation_id, U16.pack(self.code), encode_string(self.reason)
        )


@dataclass(frozen=True, slots=True)
class SimpleResponse:
    """A response that carries only a code (DeclarePublisher, Subscribe, Create, Close, ...).

    Also the shape of an error answer to any request, e.g. UNKNOWN_FRAME.
    """

    command: Command | int
    correlation_id: int
    response_code: int

    def encode(self) -> bytes:
        return encode_error_response(self.command, self.correlation_id, self.response_code)


def encode_error_response(key: int, correlation_id: int, code: int) -> bytes:
    """A bare ``CorrelationId ResponseCode`` response for any key (known or not)."""
    return frame((key & ~RESPONSE_FLAG) | RESPONSE_FLAG, 1, _CORR_CODE.pack(correlation_id, code))


# ---------------------------------------------------------------- streams


@dataclass(frozen=True, slots=True)
class CreateRequest:
    command: ClassVar[Command] = Command.CREATE
    correlation_id: int
    stream: str
    arguments: Mapping[str, str]

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            encode_string(self.stream),
            encode_string_map(self.arguments),
        )


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    command: ClassVar[Command] = Command.DELETE
    correlation_id: int
    stream: str

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, encode_string(self.stream))


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    command: ClassVar[Command] = Command.METADATA
    correlation_id: int
    streams: Sequence[str]

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, encode_strings(self.streams))


@dataclass(frozen=True, slots=True)
class MetadataResponse:
    """No top-level response code: each stream carries its own."""

    command: ClassVar[Command] = Command.METADATA
    correlation_id: int
    brokers: Sequence[Broker]
    streams: Sequence[StreamMetadata]

    def encode(self) -> bytes:
        parts = [U32.pack(self.correlation_id), U32.pack(len(self.brokers))]
        for b in self.brokers:
            parts += (U16.pack(b.reference), encode_string(b.host), U32.pack(b.port))
        parts.append(U32.pack(len(self.streams)))
        for s in self.streams:
            parts += (
                encode_string(s.name),
                U16.pack(s.response_code),
                U16.pack(s.leader_reference),
                U32.pack(len(s.replica_references)),
                b"".join(U16.pack(r) for r in s.replica_references),
            )
        return frame(self.command | RESPONSE_FLAG, 1, *parts)


@dataclass(frozen=True, slots=True)
class MetadataUpdate:
    """Server → client: something happened to a stream (e.g. STREAM_NOT_AVAILABLE)."""

    command: ClassVar[Command] = Command.METADATA_UPDATE
    code: int
    stream: str

    def encode(self) -> bytes:
        return frame(self.command, 1, U16.pack(self.code), encode_string(self.stream))


@dataclass(frozen=True, slots=True)
class StreamStatsRequest:
    command: ClassVar[Command] = Command.STREAM_STATS
    correlation_id: int
    stream: str

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, encode_string(self.stream))


@dataclass(frozen=True, slots=True)
class StreamStatsResponse:
    command: ClassVar[Command] = Command.STREAM_STATS
    correlation_id: int
    response_code: int
    stats: Mapping[str, int]

    def encode(self) -> bytes:
        parts = [U32.pack(len(self.stats))]
        for key, value in self.stats.items():
            parts += (encode_string(key), I64.pack(value))
        return _response(self.command, self.correlation_id, self.response_code, *parts)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    command: ClassVar[Command] = Command.ROUTE
    correlation_id: int
    routing_key: str
    super_stream: str

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            encode_string(self.routing_key),
            encode_string(self.super_stream),
        )


@dataclass(frozen=True, slots=True)
class RouteResponse:
    command: ClassVar[Command] = Command.ROUTE
    correlation_id: int
    response_code: int
    streams: Sequence[str]

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, encode_strings(self.streams)
        )


@dataclass(frozen=True, slots=True)
class PartitionsRequest:
    command: ClassVar[Command] = Command.PARTITIONS
    correlation_id: int
    super_stream: str

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, encode_string(self.super_stream))


@dataclass(frozen=True, slots=True)
class PartitionsResponse:
    command: ClassVar[Command] = Command.PARTITIONS
    correlation_id: int
    response_code: int
    streams: Sequence[str]

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, encode_strings(self.streams)
        )


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersionsRequest:
    command: ClassVar[Command] = Command.EXCHANGE_COMMAND_VERSIONS
    correlation_id: int
    versions: Sequence[CommandVersion]

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, _encode_versions(self.versions))


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersionsResponse:
    """rstream indexes the answer by ``key - 1``: list every key from 1 upwards, in order."""

    command: ClassVar[Command] = Command.EXCHANGE_COMMAND_VERSIONS
    correlation_id: int
    response_code: int
    versions: Sequence[CommandVersion]

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, _encode_versions(self.versions)
        )


def _encode_versions(versions: Sequence[CommandVersion]) -> bytes:
    items = b"".join(_COMMAND_VERSION.pack(v.key, v.min_version, v.max_version) for v in versions)
    return U32.pack(len(versions)) + items


def _read_versions(reader: Reader) -> list[CommandVersion]:
    return [
        CommandVersion(reader.u16(), reader.u16(), reader.u16())
        for _ in range(reader.count(_COMMAND_VERSION.size))
    ]


# ---------------------------------------------------------------- publishers


@dataclass(frozen=True, slots=True)
class DeclarePublisherRequest:
    """``reference`` is empty for an unnamed publisher (no deduplication)."""

    command: ClassVar[Command] = Command.DECLARE_PUBLISHER
    correlation_id: int
    publisher_id: int
    reference: str
    stream: str

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            U8.pack(self.publisher_id),
            encode_string(self.reference),
            encode_string(self.stream),
        )


@dataclass(frozen=True, slots=True)
class QueryPublisherSequenceRequest:
    command: ClassVar[Command] = Command.QUERY_PUBLISHER_SEQUENCE
    correlation_id: int
    reference: str
    stream: str

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            encode_string(self.reference),
            encode_string(self.stream),
        )


@dataclass(frozen=True, slots=True)
class QueryPublisherSequenceResponse:
    command: ClassVar[Command] = Command.QUERY_PUBLISHER_SEQUENCE
    correlation_id: int
    response_code: int
    sequence: int

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, U64.pack(self.sequence)
        )


@dataclass(frozen=True, slots=True)
class DeletePublisherRequest:
    command: ClassVar[Command] = Command.DELETE_PUBLISHER
    correlation_id: int
    publisher_id: int

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, U8.pack(self.publisher_id))


# ---------------------------------------------------------------- consumers


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    command: ClassVar[Command] = Command.SUBSCRIBE
    correlation_id: int
    subscription_id: int
    stream: str
    offset_spec: OffsetSpec
    credit: int
    properties: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            U8.pack(self.subscription_id),
            encode_string(self.stream),
            self.offset_spec.encode(),
            U16.pack(self.credit),
            encode_string_map(self.properties),
        )


@dataclass(frozen=True, slots=True)
class CreditRequest:
    """No response unless it fails (then a CreditResponse)."""

    command: ClassVar[Command] = Command.CREDIT
    subscription_id: int
    credit: int

    def encode(self) -> bytes:
        return frame(self.command, 1, U8.pack(self.subscription_id), U16.pack(self.credit))


@dataclass(frozen=True, slots=True)
class CreditResponse:
    """The one response without a correlation id: code first, then the subscription."""

    command: ClassVar[Command] = Command.CREDIT
    response_code: int
    subscription_id: int

    def encode(self) -> bytes:
        return frame(
            self.command | RESPONSE_FLAG,
            1,
            U16.pack(self.response_code),
            U8.pack(self.subscription_id),
        )


@dataclass(frozen=True, slots=True)
class StoreOffsetRequest:
    command: ClassVar[Command] = Command.STORE_OFFSET
    reference: str
    stream: str
    offset: int

    def encode(self) -> bytes:
        return frame(
            self.command,
            1,
            encode_string(self.reference),
            encode_string(self.stream),
            U64.pack(self.offset),
        )


@dataclass(frozen=True, slots=True)
class QueryOffsetRequest:
    command: ClassVar[Command] = Command.QUERY_OFFSET
    correlation_id: int
    reference: str
    stream: str

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            encode_string(self.reference),
            encode_string(self.stream),
        )


@dataclass(frozen=True, slots=True)
class QueryOffsetResponse:
    command: ClassVar[Command] = Command.QUERY_OFFSET
    correlation_id: int
    response_code: int
    offset: int

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, U64.pack(self.offset)
        )


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    command: ClassVar[Command] = Command.UNSUBSCRIBE
    correlation_id: int
    subscription_id: int

    def encode(self) -> bytes:
        return _request(self.command, self.correlation_id, U8.pack(self.subscription_id))


@dataclass(frozen=True, slots=True)
class ConsumerUpdateRequest:
    """Server → client (single active consumer): you are now (in)active."""

    command: ClassVar[Command] = Command.CONSUMER_UPDATE
    correlation_id: int
    subscription_id: int
    active: bool

    def encode(self) -> bytes:
        return _request(
            self.command,
            self.correlation_id,
            U8.pack(self.subscription_id),
            U8.pack(1 if self.active else 0),
        )


@dataclass(frozen=True, slots=True)
class ConsumerUpdateResponse:
    """Client → server: where the newly active consumer wants to start."""

    command: ClassVar[Command] = Command.CONSUMER_UPDATE
    correlation_id: int
    response_code: int
    offset_spec: OffsetSpec

    def encode(self) -> bytes:
        return _response(
            self.command, self.correlation_id, self.response_code, self.offset_spec.encode()
        )


@dataclass(frozen=True, slots=True)
class UnknownCommand:
    """A frame this side does not handle (unknown key or unsupported version).

    ``correlation_id`` is bytes 4..8 when the frame is long enough (every request with
    a response has it there), else None.
    """

    key: int
    version: int
    correlation_id: int | None

    def error_response(self) -> bytes:
        """The UNKNOWN_FRAME answer, or b"" when there is no correlation id to answer."""
        if self.correlation_id is None:
            return b""
        return encode_error_response(self.key, self.correlation_id, ResponseCode.UNKNOWN_FRAME)


ClientCommand = (
    PeerPropertiesRequest
    | SaslHandshakeRequest
    | SaslAuthenticateRequest
    | Tune
    | OpenRequest
    | Heartbeat
    | CloseRequest
    | SimpleResponse
    | CreateRequest
    | DeleteRequest
    | MetadataRequest
    | StreamStatsRequest
    | RouteRequest
    | PartitionsRequest
    | ExchangeCommandVersionsRequest
    | DeclarePublisherRequest
    | PublishBatch
    | QueryPublisherSequenceRequest
    | DeletePublisherRequest
    | SubscribeRequest
    | CreditRequest
    | StoreOffsetRequest
    | QueryOffsetRequest
    | UnsubscribeRequest
    | ConsumerUpdateResponse
    | UnknownCommand
)
"""Everything ``decode_client_frame`` returns."""

ServerCommand = (
    PeerPropertiesResponse
    | SaslHandshakeResponse
    | SaslAuthenticateResponse
    | Tune
    | OpenResponse
    | Heartbeat
    | CloseRequest
    | SimpleResponse
    | MetadataResponse
    | MetadataUpdate
    | StreamStatsResponse
    | RouteResponse
    | PartitionsResponse
    | ExchangeCommandVersionsResponse
    | QueryPublisherSequenceResponse
    | PublishConfirm
    | PublishError
    | Deliver
    | CreditResponse
    | QueryOffsetResponse
    | ConsumerUpdateRequest
    | UnknownCommand
)
"""Everything ``decode_server_frame`` returns."""


def plain_credentials(data: bytes) -> tuple[str, str]:
    """Split SASL PLAIN data (``[authzid] NUL user NUL password``) into user and password."""
    parts = data.split(b"\x00")
    if len(parts) != 3:
        raise ProtocolError("SASL PLAIN data must hold exactly two NUL separators")
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("SASL PLAIN credentials are not valid UTF-8") from None


def plain_data(username: str, password: str) -> bytes:
    return b"\x00" + username.encode("utf-8") + b"\x00" + password.encode("utf-8")


# ---------------------------------------------------------------- decoding


def _corr(reader: Reader) -> int:
    return reader.u32()


def _client_sasl_authenticate(r: Reader) -> SaslAuthenticateRequest:
    return SaslAuthenticateRequest(_corr(r), r.string(), r.bytes())


def _client_subscribe(r: Reader) -> SubscribeRequest:
    corr = _corr(r)
    subscription_id = r.u8()
    stream = r.string()
    spec = OffsetSpec.read(r)
    credit = r.u16()
    properties = r.string_map() if r.remaining() else {}  # RabbitMQ omits an empty map
    return SubscribeRequest(corr, subscription_id, stream, spec, credit, properties)


def _client_close_response(r: Reader) -> SimpleResponse:
    return SimpleResponse(Command.CLOSE, r.u32(), r.u16())


def _client_consumer_update_response(r: Reader) -> ConsumerUpdateResponse:
    corr, code = r.u32(), r.u16()
    return ConsumerUpdateResponse(corr, code, OffsetSpec.read(r, allow_none=True))


_Decoder = Callable[[Reader], object]

_CLIENT_DECODERS: dict[int, _Decoder] = {
    Command.PEER_PROPERTIES: lambda r: PeerPropertiesRequest(_corr(r), r.string_map()),
    Command.SASL_HANDSHAKE: lambda r: SaslHandshakeRequest(_corr(r)),
    Command.SASL_AUTHENTICATE: _client_sasl_authenticate,
    Command.TUNE: lambda r: Tune(r.u32(), r.u32()),
    Command.TUNE | RESPONSE_FLAG: lambda r: Tune(r.u32(), r.u32()),
    Command.OPEN: lambda r: OpenRequest(_corr(r), r.string()),
    Command.HEARTBEAT: lambda r: Heartbeat(),
    Command.CLOSE: lambda r: CloseRequest(_corr(r), r.u16(), r.string()),
    Command.CLOSE | RESPONSE_FLAG: _client_close_response,
    Command.CREATE: lambda r: CreateRequest(_corr(r), r.string(), r.string_map()),
    Command.DELETE: lambda r: DeleteRequest(_corr(r), r.string()),
    Command.METADATA: lambda r: MetadataRequest(_corr(r), r.strings()),
    Command.STREAM_STATS: lambda r: StreamStatsRequest(_corr(r), r.string()),
    Command.ROUTE: lambda r: RouteRequest(_corr(r), r.string(), r.string()),
    Command.PARTITIONS: lambda r: PartitionsRequest(_corr(r), r.string()),
    Command.EXCHANGE_COMMAND_VERSIONS: lambda r: ExchangeCommandVersionsRequest(
        _corr(r), _read_versions(r)
    ),
    Command.DECLARE_PUBLISHER: lambda r: DeclarePublisherRequest(
        _corr(r), r.u8(), r.string(), r.string()
    ),
    Command.QUERY_PUBLISHER_SEQUENCE: lambda r: QueryPublisherSequenceRequest(
        _corr(r), r.string(), r.string()
    ),
    Command.DELETE_PUBLISHER: lambda r: DeletePublisherRequest(_corr(r), r.u8()),
    Command.SUBSCRIBE: _client_subscribe,
    Command.CREDIT: lambda r: CreditRequest(r.u8(), r.u16()),
    Command.STORE_OFFSET: lambda r: StoreOffsetRequest(r.string(), r.string(), r.u64()),
    Command.QUERY_OFFSET: lambda r: QueryOffsetRequest(_corr(r), r.string(), r.string()),
    Command.UNSUBSCRIBE: lambda r: UnsubscribeRequest(_corr(r), r.u8()),
    Command.CONSUMER_UPDATE | RESPONSE_FLAG: _client_consumer_update_response,
}

_SIMPLE_RESPONSES = (
    Command.DECLARE_PUBLISHER,
    Command.DELETE_PUBLISHER,
    Command.SUBSCRIBE,
    Command.UNSUBSCRIBE,
    Command.CREATE,
    Command.DELETE,
    Command.CLOSE,
    Command.CREATE_SUPER_STREAM,
    Command.DELETE_SUPER_STREAM,
)


def _server_open_response(r: Reader) -> OpenResponse:
    corr, code = r.u32(), r.u16()
    properties = r.string_map() if r.remaining() else {}  # RabbitMQ omits an empty map
    return OpenResponse(corr, code, properties)


def _server_sasl_authenticate_response(r: Reader) -> SaslAuthenticateResponse:
    corr, code = r.u32(), r.u16()
    challenge = r.bytes() if r.remaining() else b""
    return SaslAuthenticateResponse(corr, code, challenge)


def _server_metadata_response(r: Reader) -> MetadataResponse:
    corr = r.u32()
    brokers = [Broker(r.u16(), r.string(), r.u32()) for _ in range(r.count(8))]
    streams = []
    for _ in range(r.count(10)):
        name, code, leader = r.string(), r.u16(), r.u16()
        replicas = tuple(r.u16() for _ in range(r.count(2)))
        streams.append(StreamMetadata(name, code, leader, replicas))
    return MetadataResponse(corr, brokers, streams)


def _server_stream_stats_response(corr: int, code: int, r: Reader) -> StreamStatsResponse:
    stats: dict[str, int] = {}
    for _ in range(r.count(10)):
        key = r.string()
        stats[key] = r.i64()
    return StreamStatsResponse(corr, code, stats)


def _with_code(build: Callable[[int, int, Reader], object]) -> _Decoder:
    """Decode ``CorrelationId ResponseCode`` then the body; a bare error → SimpleResponse."""

    def decode(r: Reader) -> object:
        corr, code = r.u32(), r.u16()
        if not r.remaining() and code != ResponseCode.OK:
            key = _KEY_VERSION.unpack_from(r.buf, 0)[0] & ~RESPONSE_FLAG
            return SimpleResponse(key, corr, code)
        return build(corr, code, r)

    return decode


def _simple_response(command: Command) -> _Decoder:
    return lambda r: SimpleResponse(command, r.u32(), r.u16())


_SERVER_DECODERS: dict[int, _Decoder] = {
    **{c | RESPONSE_FLAG: _simple_response(c) for c in _SIMPLE_RESPONSES},
    Command.PEER_PROPERTIES | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: PeerPropertiesResponse(corr, code, r.string_map())
    ),
    Command.SASL_HANDSHAKE | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: SaslHandshakeResponse(corr, code, r.strings())
    ),
    Command.SASL_AUTHENTICATE | RESPONSE_FLAG: _server_sasl_authenticate_response,
    Command.TUNE: lambda r: Tune(r.u32(), r.u32()),
    Command.OPEN | RESPONSE_FLAG: _server_open_response,
    Command.HEARTBEAT: lambda r: Heartbeat(),
    Command.CLOSE: lambda r: CloseRequest(_corr(r), r.u16(), r.string()),
    Command.METADATA | RESPONSE_FLAG: _server_metadata_response,
    Command.METADATA_UPDATE: lambda r: MetadataUpdate(r.u16(), r.string()),
    Command.STREAM_STATS | RESPONSE_FLAG: _with_code(_server_stream_stats_response),
    Command.ROUTE | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: RouteResponse(corr, code, r.strings())
    ),
    Command.PARTITIONS | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: PartitionsResponse(corr, code, r.strings())
    ),
    Command.EXCHANGE_COMMAND_VERSIONS | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: ExchangeCommandVersionsResponse(corr, code, _read_versions(r))
    ),
    Command.QUERY_PUBLISHER_SEQUENCE | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: QueryPublisherSequenceResponse(corr, code, r.u64())
    ),
    Command.CREDIT | RESPONSE_FLAG: lambda r: CreditResponse(r.u16(), r.u8()),
    Command.QUERY_OFFSET | RESPONSE_FLAG: _with_code(
        lambda corr, code, r: QueryOffsetResponse(corr, code, r.u64())
    ),
    Command.CONSUMER_UPDATE: lambda r: ConsumerUpdateRequest(_corr(r), r.u8(), r.u8() != 0),
}

# Whole-frame decoders (they check their own key/version and trailing bytes).
_CLIENT_FRAME_DECODERS: dict[int, Callable[[memoryview | bytes], object]] = {
    Command.PUBLISH: decode_publish,
}
_SERVER_FRAME_DECODERS: dict[int, Callable[[memoryview | bytes], object]] = {
    Command.PUBLISH_CONFIRM: decode_publish_confirm,
    Command.PUBLISH_ERROR: decode_publish_error,
    Command.DELIVER: decode_deliver,
}
_MULTI_VERSION = {Command.PUBLISH: (1, 2), Command.DELIVER: (1, 2)}


def _decode(
    body: memoryview | bytes,
    decoders: dict[int, _Decoder],
    frame_decoders: dict[int, Callable[[memoryview | bytes], object]],
) -> object:
    if len(body) < MIN_FRAME_SIZE:
        raise ProtocolError("frame too short for key and version")
    key, version = _KEY_VERSION.unpack_from(body, 0)
    low_key = key & ~RESPONSE_FLAG
    allowed = _MULTI_VERSION.get(low_key, (1, 1))
    frame_decoder = frame_decoders.get(key)
    decoder = decoders.get(key)
    if (frame_decoder is None and decoder is None) or not allowed[0] <= version <= allowed[1]:
        corr = U32.unpack_from(body, 4)[0] if len(body) >= 8 else None
        return UnknownCommand(key, version, corr)
    if frame_decoder is not None:
        return frame_decoder(body)
    assert decoder is not None
    reader = Reader(body, 4)
    command = decoder(reader)
    reader.done()
    return command


def decode_client_frame(body: memoryview | bytes) -> ClientCommand:
    """Decode a frame sent by a client (the server's view); ``body`` excludes the size."""
    return _decode(body, _CLIENT_DECODERS, _CLIENT_FRAME_DECODERS)  # type: ignore[return-value]


def decode_server_frame(body: memoryview | bytes) -> ServerCommand:
    """Decode a frame sent by a server (the client's view); ``body`` excludes the size."""
    return _decode(body, _SERVER_DECODERS, _SERVER_FRAME_DECODERS)  # type: ignore[return-value]
