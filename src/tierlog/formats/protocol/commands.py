"""Every stream-protocol command, and decoding of any frame in either direction.

Commands are declared as field schemas by area (``handshake``, ``streams``,
``publishers``, ``consumers``; see ``schema``) and re-exported here; the hot paths are
specialised in ``publish`` and ``deliver``. The server uses ``decode_client_frame`` on
what clients send and the ``encode`` method of responses; clients, tests and fuzzers use
``encode`` of requests and ``decode_server_frame``. Every ``encode`` returns a whole
frame, size prefix included. Frames a side does not know come back as ``UnknownCommand``
so the caller can answer with ``ResponseCode.UNKNOWN_FRAME``; malformed frames raise
ProtocolError.
"""

import struct
from collections.abc import Callable
from dataclasses import dataclass

from tierlog.formats.protocol.constants import (
    RESPONSE_FLAG,
    SUPPORTED_VERSIONS,
    Command,
    ResponseCode,
)
from tierlog.formats.protocol.consumers import (
    ConsumerUpdateRequest,
    ConsumerUpdateResponse,
    CreditRequest,
    CreditResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    StoreOffsetRequest,
    SubscribeRequest,
    UnsubscribeRequest,
    WireOffsetSpec,
)
from tierlog.formats.protocol.deliver import Deliver, decode_deliver
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.formats.protocol.frames import MIN_FRAME_SIZE
from tierlog.formats.protocol.handshake import (
    CloseRequest,
    CommandVersion,
    ExchangeCommandVersionsRequest,
    ExchangeCommandVersionsResponse,
    Heartbeat,
    OpenRequest,
    OpenResponse,
    PeerPropertiesRequest,
    PeerPropertiesResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    Tune,
    plain_credentials,
    plain_data,
)
from tierlog.formats.protocol.publish import (
    PublishBatch,
    PublishConfirm,
    decode_publish,
    decode_publish_confirm,
)
from tierlog.formats.protocol.publishers import (
    DeclarePublisherRequest,
    DeletePublisherRequest,
    PublishError,
    QueryPublisherSequenceRequest,
    QueryPublisherSequenceResponse,
)
from tierlog.formats.protocol.schema import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Message,
    UInt16,
    UInt32,
)
from tierlog.formats.protocol.streams import (
    BrokerAddress,
    CreateRequest,
    CreateSuperStreamRequest,
    DeleteRequest,
    DeleteSuperStreamRequest,
    MetadataRequest,
    MetadataResponse,
    MetadataUpdate,
    PartitionsRequest,
    PartitionsResponse,
    RouteRequest,
    RouteResponse,
    StreamMetadata,
    StreamStatsRequest,
    StreamStatsResponse,
)
from tierlog.formats.protocol.wire import FRAME_HEADER, U16, U32, Reader

_KEY_VERSION = struct.Struct(">HH")
_CORR_CODE = struct.Struct(">IH")
_BARE_RESPONSE_SIZE = _KEY_VERSION.size + _CORR_CODE.size


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
    key = (key & ~RESPONSE_FLAG) | RESPONSE_FLAG
    return FRAME_HEADER.pack(_BARE_RESPONSE_SIZE, key, 1) + _CORR_CODE.pack(correlation_id, code)


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
    | CreateSuperStreamRequest
    | DeleteSuperStreamRequest
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


# ---------------------------------------------------------------- decoding

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
"""Commands whose response is ``CorrelationId ResponseCode`` and nothing else."""

_CLIENT_SIMPLE_RESPONSES = frozenset({Command.CLOSE | RESPONSE_FLAG})
_SERVER_SIMPLE_RESPONSES = frozenset(c | RESPONSE_FLAG for c in _SIMPLE_RESPONSES)

_CLIENT_SCHEMAS: dict[int, type[Message]] = {
    **CLIENT_COMMANDS,
    Command.TUNE | RESPONSE_FLAG: Tune,  # some clients answer Tune with the response bit
}
_SERVER_SCHEMAS: dict[int, type[Message]] = dict(SERVER_COMMANDS)


def _may_be_bare_error(cls: type[Message]) -> bool:
    """A response whose body after ``CorrelationId ResponseCode`` is required: a server
    may still answer an error with those two fields alone (e.g. QueryOffset NO_OFFSET)."""
    fields = cls.SCHEMA.fields
    return (
        len(fields) > 2
        and fields[0] == ("correlation_id", UInt32)
        and fields[1] == ("response_code", UInt16)
        and not cls.SCHEMA.has_trailing
    )


_SERVER_BARE_ERRORS = frozenset(k for k, cls in _SERVER_SCHEMAS.items() if _may_be_bare_error(cls))

_FrameDecoder = Callable[[memoryview | bytes], object]

# Whole-frame decoders of the hot paths (they check their own version and trailing bytes).
_CLIENT_FRAME_DECODERS: dict[int, _FrameDecoder] = {Command.PUBLISH: decode_publish}
_SERVER_FRAME_DECODERS: dict[int, _FrameDecoder] = {
    Command.PUBLISH_CONFIRM: decode_publish_confirm,
    Command.DELIVER: decode_deliver,
}
_MULTI_VERSION = {
    command: SUPPORTED_VERSIONS[command] for command in (Command.PUBLISH, Command.DELIVER)
}


def _decode(
    body: memoryview | bytes,
    schemas: dict[int, type[Message]],
    frame_decoders: dict[int, _FrameDecoder],
    simple_responses: frozenset[int],
    bare_errors: frozenset[int],
) -> object:
    if len(body) < MIN_FRAME_SIZE:
        raise ProtocolError("frame too short for key and version")
    key, version = _KEY_VERSION.unpack_from(body, 0)
    low, high = _MULTI_VERSION.get(key & ~RESPONSE_FLAG, (1, 1))
    frame_decoder = frame_decoders.get(key)
    schema_class = schemas.get(key)
    known = frame_decoder is not None or schema_class is not None or key in simple_responses
    if not known or not low <= version <= high:
        corr = U32.unpack_from(body, 4)[0] if len(body) >= 8 else None
        return UnknownCommand(key, version, corr)
    if frame_decoder is not None:
        return frame_decoder(body)
    reader = Reader(body, MIN_FRAME_SIZE)
    command: object
    if schema_class is None or (
        key in bare_errors
        and len(body) == _BARE_RESPONSE_SIZE
        and U16.unpack_from(body, _BARE_RESPONSE_SIZE - 2)[0] != ResponseCode.OK
    ):
        command = SimpleResponse(key & ~RESPONSE_FLAG, reader.u32(), reader.u16())
    else:
        command = schema_class.SCHEMA.decode(reader)
    reader.done()
    return command


def decode_client_frame(body: memoryview | bytes) -> ClientCommand:
    """Decode a frame sent by a client (the server's view); ``body`` excludes the size."""
    return _decode(  # type: ignore[return-value]
        body, _CLIENT_SCHEMAS, _CLIENT_FRAME_DECODERS, _CLIENT_SIMPLE_RESPONSES, frozenset()
    )


def decode_server_frame(body: memoryview | bytes) -> ServerCommand:
    """Decode a frame sent by a server (the client's view); ``body`` excludes the size."""
    return _decode(  # type: ignore[return-value]
        body,
        _SERVER_SCHEMAS,
        _SERVER_FRAME_DECODERS,
        _SERVER_SIMPLE_RESPONSES,
        _SERVER_BARE_ERRORS,
    )


__all__ = [
    "BrokerAddress",
    "ClientCommand",
    "CloseRequest",
    "CommandVersion",
    "ConsumerUpdateRequest",
    "ConsumerUpdateResponse",
    "CreateRequest",
    "CreateSuperStreamRequest",
    "CreditRequest",
    "CreditResponse",
    "DeclarePublisherRequest",
    "DeletePublisherRequest",
    "DeleteRequest",
    "DeleteSuperStreamRequest",
    "Deliver",
    "ExchangeCommandVersionsRequest",
    "ExchangeCommandVersionsResponse",
    "Heartbeat",
    "MetadataRequest",
    "MetadataResponse",
    "MetadataUpdate",
    "OpenRequest",
    "OpenResponse",
    "PartitionsRequest",
    "PartitionsResponse",
    "PeerPropertiesRequest",
    "PeerPropertiesResponse",
    "PublishBatch",
    "PublishConfirm",
    "PublishError",
    "QueryOffsetRequest",
    "QueryOffsetResponse",
    "QueryPublisherSequenceRequest",
    "QueryPublisherSequenceResponse",
    "RouteRequest",
    "RouteResponse",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "ServerCommand",
    "SimpleResponse",
    "StoreOffsetRequest",
    "StreamMetadata",
    "StreamStatsRequest",
    "StreamStatsResponse",
    "SubscribeRequest",
    "Tune",
    "UnknownCommand",
    "UnsubscribeRequest",
    "WireOffsetSpec",
    "decode_client_frame",
    "decode_server_frame",
    "encode_error_response",
    "plain_credentials",
    "plain_data",
]
