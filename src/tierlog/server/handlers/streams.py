"""Stream commands: create, delete, metadata, stream stats (super streams: ``super_streams``).

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
"""

from __future__ import annotations

from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.protocol.commands import (
    BrokerAddress,
    CreateRequest,
    DeleteRequest,
    MetadataRequest,
    MetadataResponse,
    SimpleResponse,
    StreamMetadata,
    StreamStatsRequest,
    StreamStatsResponse,
)
from tierlog.formats.protocol.constants import (
    Command,
    ResponseCode,
)
from tierlog.logs import get_logger
from tierlog.remote.errors import StreamExistsError, StreamNotFoundError
from tierlog.server.arguments import settings_from_arguments
from tierlog.server.broker import OPENING, StreamHandle
from tierlog.server.cluster_gates import cluster_metadata
from tierlog.server.cluster_service import ClusterService
from tierlog.server.connection_core import ConnectionCore
from tierlog.server.member_reads import MemberStreamHandle
from tierlog.server.remote_stream import RemoteStreamHandle

log = get_logger("tierlog.server.connection")

NO_LEADER = 0xFFFF


class StreamHandlers(ConnectionCore):
    """Commands about streams themselves."""

    async def _on_create(self, cmd: CreateRequest) -> None:
        # a reserved name is no name a client may create, checked before permissions: what
        # RabbitMQ answers for its reserved ``amq.`` prefix (docs/security.md)
        if self._reserved("stream", cmd.stream):
            code = ResponseCode.PRECONDITION_FAILED
            self.send(SimpleResponse(Command.CREATE, cmd.correlation_id, code).encode())
            return
        if not self._permitted("configure", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
            self.send(SimpleResponse(Command.CREATE, cmd.correlation_id, code).encode())
            return
        try:
            # as RabbitMQ: the arguments are validated first (PRECONDITION_FAILED), then
            # an existing stream is STREAM_ALREADY_EXISTS whatever the cluster's state
            # (an app declaring its stream at start must start while a node is down)
            settings = settings_from_arguments(cmd.arguments)
            placement = self.broker.placement
            if isinstance(placement, ClusterService):
                placement.cluster_size(cmd.arguments)
            if await self.broker.exists(self.vhost, cmd.stream):
                raise StreamExistsError(f"stream {cmd.stream!r} already exists")
            if isinstance(placement, ClusterService):
                placement.check_create(self.vhost, cmd.stream, cmd.arguments)
            await self.broker.create_stream(self.vhost, cmd.stream, settings)
            code = ResponseCode.OK
        except StreamExistsError:
            code = ResponseCode.STREAM_ALREADY_EXISTS
        except ConfigError as exc:
            log.info("create_rejected", stream=cmd.stream, error=str(exc))
            code = ResponseCode.PRECONDITION_FAILED
        except (TierlogError, OSError) as exc:
            log.error("create_failed", stream=cmd.stream, error=repr(exc))
            code = ResponseCode.INTERNAL_ERROR
        self.send(SimpleResponse(Command.CREATE, cmd.correlation_id, code).encode())

    async def _on_delete(self, cmd: DeleteRequest) -> None:
        if self._reserved("stream", cmd.stream) or not self._permitted("configure", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
            self.send(SimpleResponse(Command.DELETE, cmd.correlation_id, code).encode())
            return
        try:
            await self.broker.delete_stream(self.vhost, cmd.stream)
            code = ResponseCode.OK
        except (StreamNotFoundError, ConfigError):
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        except (TierlogError, OSError) as exc:
            log.error("delete_failed", stream=cmd.stream, error=repr(exc))
            code = ResponseCode.INTERNAL_ERROR
        self.send(SimpleResponse(Command.DELETE, cmd.correlation_id, code).encode())

    def _on_metadata(self, cmd: MetadataRequest) -> None:
        refused = {n for n in cmd.streams if self._reserved("stream", n)}
        placement = self.broker.placement
        if isinstance(placement, ClusterService):
            brokers, streams = cluster_metadata(placement, self.vhost, cmd.streams)
            streams = [
                StreamMetadata(s.name, ResponseCode.ACCESS_REFUSED, NO_LEADER, ())
                if s.name in refused
                else s
                for s in streams
            ]
            self.send(MetadataResponse(cmd.correlation_id, brokers, streams).encode())
            return
        host, port = self._advertised()
        streams = []
        for name in cmd.streams:
            handle = self.broker.get(self.vhost, name)
            if name in refused:  # a system stream exists, but is no client's to use
                streams.append(StreamMetadata(name, ResponseCode.ACCESS_REFUSED, NO_LEADER, ()))
            elif handle is None:
                streams.append(StreamMetadata(name, self._missing(name), NO_LEADER, ()))
            elif handle.unavailable == OPENING:  # its first resolution runs
                code = ResponseCode.STREAM_NOT_AVAILABLE
                streams.append(StreamMetadata(name, code, NO_LEADER, ()))
            else:
                streams.append(StreamMetadata(name, ResponseCode.OK, 0, ()))
        self.send(
            MetadataResponse(cmd.correlation_id, [BrokerAddress(0, host, port)], streams).encode()
        )

    async def _on_stream_stats(self, cmd: StreamStatsRequest) -> None:
        if self._reserved("stream", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
            self.send(SimpleResponse(Command.STREAM_STATS, cmd.correlation_id, code).encode())
            return
        # on any node, as RabbitMQ answers from a member or the leader: the stream's own
        # handle here, a member's, or the read-only one of a non-member
        handle = self.broker.readable(self.vhost, cmd.stream)
        if handle is None or not self._permitted("read", cmd.stream):
            refused = ResponseCode.ACCESS_REFUSED
            code = self._missing(cmd.stream) if handle is None else refused
            # with the empty map, as RabbitMQ: the Node.js client reads it on errors too
            self.send(StreamStatsResponse(cmd.correlation_id, code, {}).encode())
            return
        stats = await stream_stats(handle)
        self.send(StreamStatsResponse(cmd.correlation_id, ResponseCode.OK, stats).encode())


async def stream_stats(handle: StreamHandle) -> dict[str, int]:
    """StreamStats of a stream on this node: its first chunk id and the last chunk its
    consumers may read as committed. The leader (or a single node): its consumers' view
    (the cluster commit; an ``ack = remote`` stream's remote commit). A member that does
    not lead: the commit its leader announced (what its own consumers read). A node
    serving the stream from the remote tier (a non-member, a member of an ``ack =
    remote`` stream, a read-only node): the leader's committed chunk when it answers,
    else the last offset the remote tier holds."""
    first = handle.first_offset()
    if isinstance(handle, MemberStreamHandle):
        committed = handle.view.commit_point().chunk_id
    elif isinstance(handle, RemoteStreamHandle):
        tail = await handle.streams.leader_tail(handle.record, "")
        if tail is not None and tail.commit_chunk_id >= 0:
            committed = tail.commit_chunk_id
        else:
            committed = handle.log.commit_point().chunk_id
    elif handle.remote_ack is not None:  # what consumers may read: the remote commit
        committed = handle.remote_ack.view.commit_point().chunk_id
    else:
        committed = handle.log.commit_point().chunk_id
        if handle.cluster_commit is not None:  # a leader: up to the cluster commit
            committed = min(committed, handle.cluster_commit())
    return {"first_chunk_id": first, "committed_chunk_id": committed}
