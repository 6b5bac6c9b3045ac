"""Stream management: create, delete, metadata (and its updates), stats, super streams."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.schema import (
    CLIENT,
    SERVER,
    Array,
    Int64,
    Map,
    Message,
    String,
    StringMap,
    UInt16,
    UInt32,
    command,
    structure,
)


@command(Command.CREATE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class CreateRequest(Message):
    correlation_id: Annotated[int, UInt32]
    stream: Annotated[str, String]
    arguments: Annotated[Mapping[str, str], StringMap]


@command(Command.DELETE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class DeleteRequest(Message):
    correlation_id: Annotated[int, UInt32]
    stream: Annotated[str, String]


@command(Command.METADATA, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class MetadataRequest(Message):
    correlation_id: Annotated[int, UInt32]
    streams: Annotated[Sequence[str], Array(String)]


@structure
@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A node as a Metadata response names it."""

    reference: Annotated[int, UInt16]
    host: Annotated[str, String]
    port: Annotated[int, UInt32]


@structure
@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """One stream of a Metadata response; leader 0xFFFF when the stream is not there."""

    name: Annotated[str, String]
    response_code: Annotated[int, UInt16]
    leader_reference: Annotated[int, UInt16]
    replica_references: Annotated[Sequence[int], Array(UInt16, tuple)] = ()


@command(Command.METADATA, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class MetadataResponse(Message):
    """No top-level response code: each stream carries its own."""

    correlation_id: Annotated[int, UInt32]
    brokers: Annotated[Sequence[BrokerAddress], Array(BrokerAddress)]
    streams: Annotated[Sequence[StreamMetadata], Array(StreamMetadata)]


@command(Command.METADATA_UPDATE, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class MetadataUpdate(Message):
    """Server → client: something happened to a stream (e.g. STREAM_NOT_AVAILABLE)."""

    code: Annotated[int, UInt16]
    stream: Annotated[str, String]


@command(Command.STREAM_STATS, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class StreamStatsRequest(Message):
    correlation_id: Annotated[int, UInt32]
    stream: Annotated[str, String]


@command(Command.STREAM_STATS, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class StreamStatsResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    stats: Annotated[Mapping[str, int], Map(String, Int64)]


@command(Command.ROUTE, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class RouteRequest(Message):
    correlation_id: Annotated[int, UInt32]
    routing_key: Annotated[str, String]
    super_stream: Annotated[str, String]


@command(Command.ROUTE, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class RouteResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    streams: Annotated[Sequence[str], Array(String)]


@command(Command.PARTITIONS, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class PartitionsRequest(Message):
    correlation_id: Annotated[int, UInt32]
    super_stream: Annotated[str, String]


@command(Command.PARTITIONS, response=True, sent_by=SERVER)
@dataclass(frozen=True, slots=True)
class PartitionsResponse(Message):
    correlation_id: Annotated[int, UInt32]
    response_code: Annotated[int, UInt16]
    streams: Annotated[Sequence[str], Array(String)]


@command(Command.CREATE_SUPER_STREAM, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class CreateSuperStreamRequest(Message):
    """``Name [Partition] [BindingKey] Arguments`` (PROTOCOL.adoc, key 0x001d): partitions
    in their order, one binding key per partition (the same count, checked by the server),
    the partitions' stream arguments. Answered with a bare response code."""

    correlation_id: Annotated[int, UInt32]
    name: Annotated[str, String]
    partitions: Annotated[Sequence[str], Array(String, tuple)]
    binding_keys: Annotated[Sequence[str], Array(String, tuple)]
    arguments: Annotated[Mapping[str, str], StringMap]


@command(Command.DELETE_SUPER_STREAM, sent_by=CLIENT)
@dataclass(frozen=True, slots=True)
class DeleteSuperStreamRequest(Message):
    """``Name`` (PROTOCOL.adoc, key 0x001e); answered with a bare response code."""

    correlation_id: Annotated[int, UInt32]
    name: Annotated[str, String]
