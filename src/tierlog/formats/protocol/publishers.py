"""Publisher management: declare, query the last publishing id, delete.

Publish itself, PublishConfirm and PublishError are the hot path, specialised in
``publish``.
"""

from dataclasses import dataclass
from typing import Annotated

from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.schema import (
    CLIENT,
    SERVER,
    Message,
    String,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    command,
)


@command(Command.DECLARE_PUBLISHER, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class DeclarePublisherRequest(Message):
    """``reference`` is empty for an unnamed publisher (no deduplication)."""

    correlation_id: Annotated[int, UInt32]
    publisher_id: Annotated[int, UInt8]
    reference: Annotated[str, String]
    stream: Annotated[str, String]


@command(Command.QUERY_PUBLISHER_SEQUENCE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class QueryPublisherSequenceRequest(Message):
    correlation_id: Annotated[int, UInt32]
    reference: Annotated[str, String]
    stream: Annotated[str, String]


@command(Command.QUERY_PUBLISHER_SEQUENCE, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class QueryPublisherSequenceResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    sequence: Annotated[int, UInt64]


@command(Command.DELETE_PUBLISHER, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class DeletePublisherRequest(Message):
    correlation_id: Annotated[int, UInt32]
    publisher_id: Annotated[int, UInt8]
