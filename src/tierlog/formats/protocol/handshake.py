"""Connection set-up and teardown: peer properties, SASL, tune, open, heartbeat, close,
command version exchange."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.formats.protocol.schema import (
    BOTH,
    CLIENT,
    SERVER,
    Array,
    Bytes,
    Message,
    String,
    StringMap,
    Trailing,
    UInt16,
    UInt32,
    command,
    structure,
)


@command(Command.PEER_PROPERTIES, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class PeerPropertiesRequest(Message):
    correlation_id: Annotated[int, UInt32]
    properties: Annotated[Mapping[str, str], StringMap]


@command(Command.PEER_PROPERTIES, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class PeerPropertiesResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    properties: Annotated[Mapping[str, str], StringMap]


@command(Command.SASL_HANDSHAKE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class SaslHandshakeRequest(Message):
    correlation_id: Annotated[int, UInt32]


@command(Command.SASL_HANDSHAKE, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    mechanisms: Annotated[Sequence[str], Array(String)]


@command(Command.SASL_AUTHENTICATE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class SaslAuthenticateRequest(Message):
    """PLAIN data is ``authzid NUL user NUL password``; see ``plain_credentials``."""

    correlation_id: Annotated[int, UInt32]
    mechanism: Annotated[str, String]
    data: Annotated[bytes, Bytes]


@command(Command.SASL_AUTHENTICATE, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Message):
    """The challenge is sent only when non-empty (RabbitMQ does the same; rstream needs it)."""

    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    challenge: Annotated[bytes, Trailing(Bytes, b"", omit_default=True)] = b""


@command(Command.TUNE, sent_by=BOTH)
@dataclass(frozen=True, slots=True)
class Tune(Message):
    """Server proposes frame max / heartbeat, client answers with the values it accepts."""

    frame_max: Annotated[int, UInt32]
    heartbeat: Annotated[int, UInt32]


@command(Command.OPEN, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class OpenRequest(Message):
    correlation_id: Annotated[int, UInt32]
    virtual_host: Annotated[str, String]


@command(Command.OPEN, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class OpenResponse(Message):
    """RabbitMQ leaves the properties out of an error answer: they decode as empty."""

    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    properties: Annotated[Mapping[str, str], Trailing(StringMap, {})] = field(default_factory=dict)


@command(Command.HEARTBEAT, sent_by=BOTH)
@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    pass


@command(Command.CLOSE, sent_by=BOTH)
@dataclass(frozen=True, slots=True)
class CloseRequest(Message):
    """Sent by either side; the other answers with a SimpleResponse for CLOSE."""

    correlation_id: Annotated[int, UInt32]
    code: Annotated[int, UInt16]
    reason: Annotated[str, String]


@structure
@dataclass(frozen=True, slots=True)
class CommandVersion:
    key: Annotated[int, UInt16]
    min_version: Annotated[int, UInt16]
    max_version: Annotated[int, UInt16]


@command(Command.EXCHANGE_COMMAND_VERSIONS, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class ExchangeCommandVersionsRequest(Message):
    correlation_id: Annotated[int, UInt32]
    versions: Annotated[Sequence[CommandVersion], Array(CommandVersion)]


@command(Command.EXCHANGE_COMMAND_VERSIONS, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class ExchangeCommandVersionsResponse(Message):
    """rstream indexes the answer by ``key - 1``: list every key from 1 upwards, in order."""

    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    versions: Annotated[Sequence[CommandVersion], Array(CommandVersion)]


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
