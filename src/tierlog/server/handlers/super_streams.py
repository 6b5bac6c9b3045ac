"""Super-stream commands: CreateSuperStream, DeleteSuperStream, Route, Partitions.

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
Codes and permission checks as RabbitMQ's stream plugin (``rabbit_stream_reader``,
``rabbit_stream_utils:check_super_stream_management_permitted``), with the super stream
(RabbitMQ's exchange) checked against the same permission patterns as stream names:

* CreateSuperStream / DeleteSuperStream: ``configure`` and ``read`` on the super stream,
  ``configure`` and ``write`` on every partition — else ACCESS_REFUSED. A reserved name
  (super stream or partition) is PRECONDITION_FAILED on create, checked first, as
  RabbitMQ's ``amq.`` prefix; ACCESS_REFUSED on delete.
* Route: ``write`` on the super stream and on every partition it answers; a routing key no
  binding key matches is OK with no stream.
* Partitions: ``read`` or ``write`` on the super stream and on every partition.
* Route and Partitions of a super stream that does not exist (or is being created or
  deleted) answer STREAM_DOES_NOT_EXIST with the empty stream list; a partition deleted on
  its own is left out of both answers, as RabbitMQ drops a deleted queue's binding.
"""

from __future__ import annotations

from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.protocol.commands import (
    CreateSuperStreamRequest,
    DeleteSuperStreamRequest,
    PartitionsRequest,
    PartitionsResponse,
    RouteRequest,
    RouteResponse,
    SimpleResponse,
)
from tierlog.formats.protocol.constants import Command, ResponseCode
from tierlog.log.errors import ReservedNameError
from tierlog.log.names import check_super_stream
from tierlog.logs import get_logger
from tierlog.remote.errors import StreamExistsError, SuperStreamNotFoundError
from tierlog.remote.super_streams import SuperStreamDefinition
from tierlog.server.connection_core import ConnectionCore
from tierlog.server.super_streams import super_streams_of

log = get_logger("tierlog.server.connection")


class SuperStreamHandlers(ConnectionCore):
    """Commands about super streams."""

    def _may_manage(self, super_stream: str, partitions: tuple[str, ...]) -> bool:
        """RabbitMQ's management check: configure + read on the super stream, configure +
        write on every partition."""
        return (
            self._permitted("configure", super_stream)
            and all(self._permitted("configure", p) for p in partitions)
            and self._permitted("read", super_stream)
            and all(self._permitted("write", p) for p in partitions)
        )

    def _reserved_super_stream(self, name: str, partitions: tuple[str, ...]) -> bool:
        try:
            check_super_stream(name, partitions)
        except ReservedNameError as exc:
            self.gate.refused("stream", "reserved_name")
            log.info("reserved_name_refused", user=self.user, vhost=self.vhost, kind=exc.kind)
            return True
        return False

    async def _on_create_super_stream(self, cmd: CreateSuperStreamRequest) -> None:
        partitions = tuple(cmd.partitions)
        definition = SuperStreamDefinition(
            self.vhost, cmd.name, partitions, tuple(cmd.binding_keys), dict(cmd.arguments)
        )
        if self._reserved_super_stream(cmd.name, partitions):
            code = ResponseCode.PRECONDITION_FAILED
        elif not self._may_manage(cmd.name, partitions):
            code = ResponseCode.ACCESS_REFUSED
        else:
            try:
                await super_streams_of(self.broker).create(definition)
                code = ResponseCode.OK
            except StreamExistsError:  # the super stream, or (new) one of its partitions
                code = ResponseCode.STREAM_ALREADY_EXISTS
            except ConfigError as exc:
                log.info("create_super_stream_rejected", super_stream=cmd.name, error=str(exc))
                code = ResponseCode.PRECONDITION_FAILED
            except (TierlogError, OSError) as exc:
                log.error("create_super_stream_failed", super_stream=cmd.name, error=repr(exc))
                code = ResponseCode.INTERNAL_ERROR
        answer = SimpleResponse(Command.CREATE_SUPER_STREAM, cmd.correlation_id, code)
        self.send(answer.encode())

    async def _on_delete_super_stream(self, cmd: DeleteSuperStreamRequest) -> None:
        code = ResponseCode.OK
        if self._reserved("super stream", cmd.name) or not self._permitted("configure", cmd.name):
            code = ResponseCode.ACCESS_REFUSED
        else:
            super_streams = super_streams_of(self.broker)
            try:
                record = await super_streams.get(self.vhost, cmd.name)
                if record is None:
                    code = ResponseCode.STREAM_DOES_NOT_EXIST
                elif not self._may_manage(cmd.name, record.partitions):
                    code = ResponseCode.ACCESS_REFUSED
                else:
                    await super_streams.delete(self.vhost, cmd.name)
            except SuperStreamNotFoundError:
                code = ResponseCode.STREAM_DOES_NOT_EXIST
            except ConfigError as exc:  # a read-only node
                log.info("delete_super_stream_rejected", super_stream=cmd.name, error=str(exc))
                code = ResponseCode.PRECONDITION_FAILED
            except (TierlogError, OSError) as exc:
                log.error("delete_super_stream_failed", super_stream=cmd.name, error=repr(exc))
                code = ResponseCode.INTERNAL_ERROR
        answer = SimpleResponse(Command.DELETE_SUPER_STREAM, cmd.correlation_id, code)
        self.send(answer.encode())

    async def _on_route(self, cmd: RouteRequest) -> None:
        streams: list[str] = []
        if self._reserved("super stream", cmd.super_stream) or not self._permitted(
            "write", cmd.super_stream
        ):
            code = ResponseCode.ACCESS_REFUSED
        else:
            code, streams = await self._super_stream_answer(cmd.super_stream, cmd.routing_key)
            if streams and not all(self._permitted("write", s) for s in streams):
                code, streams = ResponseCode.ACCESS_REFUSED, []
        self.send(RouteResponse(cmd.correlation_id, code, streams).encode())

    async def _on_partitions(self, cmd: PartitionsRequest) -> None:
        streams: list[str] = []
        name = cmd.super_stream
        if self._reserved("super stream", name) or not self._may_use(name):
            code = ResponseCode.ACCESS_REFUSED
        else:
            code, streams = await self._super_stream_answer(name, None)
            if not all(self._may_use(s) for s in streams):
                code, streams = ResponseCode.ACCESS_REFUSED, []
        self.send(PartitionsResponse(cmd.correlation_id, code, streams).encode())

    def _may_use(self, name: str) -> bool:
        """Read or write (RabbitMQ's ``check_read_or_write_permitted``); one refusal
        counted when neither."""
        auth = self.gate.auth
        if auth.allowed(self.user, self.vhost, "read", name):
            return True
        return self._permitted("write", name)

    async def _super_stream_answer(
        self, name: str, routing_key: str | None
    ) -> tuple[ResponseCode, list[str]]:
        """(code, streams): the partitions, or those bound with ``routing_key``."""
        try:
            record = await super_streams_of(self.broker).ready(self.vhost, name)
        except SuperStreamNotFoundError:
            return ResponseCode.STREAM_DOES_NOT_EXIST, []
        except (TierlogError, OSError) as exc:
            log.error("super_stream_lookup_failed", super_stream=name, error=repr(exc))
            return ResponseCode.INTERNAL_ERROR, []
        streams = list(record.partitions) if routing_key is None else record.route(routing_key)
        # a partition deleted on its own (Delete) is no longer answered: RabbitMQ drops the
        # binding of a deleted queue
        return ResponseCode.OK, [s for s in streams if await self.broker.exists(self.vhost, s)]
