"""Consumer commands: subscribe, credit, unsubscribe, store and query an offset.

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
"""

from __future__ import annotations

from tierlog.errors import TierlogError
from tierlog.formats.protocol.commands import (
    CreditRequest,
    CreditResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    SimpleResponse,
    StoreOffsetRequest,
    SubscribeRequest,
    UnsubscribeRequest,
    WireOffsetSpec,
)
from tierlog.formats.protocol.constants import (
    Command,
    OffsetType,
    ResponseCode,
)
from tierlog.log.offset_spec import OffsetSpec
from tierlog.logs import get_logger
from tierlog.server.broker import OPENING
from tierlog.server.connection_core import ConnectionCore
from tierlog.server.meta_offsets import leader_query_offset
from tierlog.server.remote_stream import RemoteStreamHandle
from tierlog.server.subscriptions import (
    OVERTAKEN_ACTIONS,
    OVERTAKEN_PROPERTY,
    Subscription,
)

log = get_logger("tierlog.server.connection")


class ConsumerHandlers(ConnectionCore):
    """Commands of consumers."""

    def _on_subscribe(self, cmd: SubscribeRequest) -> None:
        handle = self.broker.readable(self.vhost, cmd.stream)
        corr = cmd.correlation_id
        if cmd.subscription_id in self.subscriptions:
            code = ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS
        elif handle is None:
            code = self._missing(cmd.stream)
        elif handle.unavailable == OPENING:  # its first resolution runs: retry shortly
            code = ResponseCode.STREAM_NOT_AVAILABLE
        elif not self._permitted("read", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
        elif cmd.properties.get("single-active-consumer", "").lower() == "true":
            # no single active consumer yet: refused, never every consumer getting
            # everything (docs/compatibility.md)
            code = ResponseCode.PRECONDITION_FAILED
        elif len(self.subscriptions) >= self.limits.max_subscriptions_per_connection:
            self.metrics.limits_hit.labels(limit="max_subscriptions").inc()
            code = ResponseCode.PRECONDITION_FAILED
        else:
            action = cmd.properties.get(OVERTAKEN_PROPERTY, "notify")
            if action not in OVERTAKEN_ACTIONS:
                code = ResponseCode.PRECONDITION_FAILED
            else:
                try:
                    subscription = Subscription(
                        cmd.subscription_id,
                        handle.name,
                        handle.source,
                        _log_spec(cmd.offset_spec),
                        cmd.credit,
                        self,
                        self.metrics,
                        overtaken=action,
                        want_file=self._use_sendfile,
                    )
                except (TierlogError, OSError) as exc:
                    log.error("subscribe_failed", stream=cmd.stream, error=repr(exc))
                    code = ResponseCode.INTERNAL_ERROR
                else:
                    self.subscriptions[cmd.subscription_id] = subscription
                    self._use_stream(handle)
                    self.send(SimpleResponse(Command.SUBSCRIBE, corr, ResponseCode.OK).encode())
                    subscription.start()
                    return
        self.send(SimpleResponse(Command.SUBSCRIBE, corr, code).encode())

    def _on_credit(self, cmd: CreditRequest) -> None:
        subscription = self.subscriptions.get(cmd.subscription_id)
        if subscription is None:
            code = ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
            self.send(CreditResponse(code, cmd.subscription_id).encode())
            return
        subscription.add_credit(cmd.credit)

    async def _on_unsubscribe(self, cmd: UnsubscribeRequest) -> None:
        subscription = self.subscriptions.pop(cmd.subscription_id, None)
        if subscription is None:
            code = ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
        else:
            await subscription.stop()
            code = ResponseCode.OK
        self.send(SimpleResponse(Command.UNSUBSCRIBE, cmd.correlation_id, code).encode())

    def _on_store_offset(self, cmd: StoreOffsetRequest) -> None:
        handle = self.broker.readable(self.vhost, cmd.stream)
        if handle is None or not cmd.reference or len(cmd.reference.encode("utf-8")) > 255:
            return  # StoreOffset has no response; RabbitMQ ignores these too
        if not self._permitted("read", cmd.stream):
            return
        handle.submit_store_offset(cmd.reference, cmd.offset)

    async def _on_query_offset(self, cmd: QueryOffsetRequest) -> None:
        handle = self.broker.readable(self.vhost, cmd.stream)
        corr = cmd.correlation_id
        if handle is None:
            response = QueryOffsetResponse(corr, self._missing(cmd.stream), 0)
        elif not self._permitted("read", cmd.stream):
            response = QueryOffsetResponse(corr, ResponseCode.ACCESS_REFUSED, 0)
        else:
            await handle.flush()  # a StoreOffset sent just before is visible
            offset = None
            if cmd.reference and len(cmd.reference.encode("utf-8")) <= 255:
                if isinstance(handle, RemoteStreamHandle):  # the leader's, else the MetaStore's
                    offset = await handle.query_offset_async(cmd.reference)
                else:  # the log's, or a newer one stored where the leader was unreachable
                    offset = await leader_query_offset(handle, cmd.reference)
            if offset is None:
                response = QueryOffsetResponse(corr, ResponseCode.NO_OFFSET, 0)
            else:
                response = QueryOffsetResponse(corr, ResponseCode.OK, offset)
        self.send(response.encode())


def _log_spec(spec: WireOffsetSpec) -> OffsetSpec:
    if spec.type == OffsetType.FIRST:
        return OffsetSpec.first()
    if spec.type == OffsetType.LAST:
        return OffsetSpec.last()
    if spec.type == OffsetType.NEXT:
        return OffsetSpec.next()
    if spec.type == OffsetType.OFFSET:
        return OffsetSpec.offset(spec.value)
    return OffsetSpec.timestamp(spec.value)
