"""Publisher management: declare, query the last publishing id, delete; PublishError.

Publish itself and PublishConfirm are the hot path, specialised in ``publish``.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.schema import (
    CLIENT,
    SERVER,
    Array,
    Message,
    String,
    TupleOf,
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


@command(Command.PUBLISH_ERROR, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class PublishError(Message):
    """Server → client: (publishing id, response code) pairs that were not stored."""

    publisher_id: Annotated[int, UInt8]
    errors: Annotated[Sequence[tuple[int, int]], Array(TupleOf(UInt64, UInt16))]
