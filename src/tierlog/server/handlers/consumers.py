"""Consumer commands: subscribe, credit, unsubscribe, store and query an offset.

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
"""

from __future__ import annotations

from typing import Any

from tierlog.errors import TierlogError
from tierlog.formats.bloom import filter_from_properties
from tierlog.formats.protocol.commands import (
    CreditRequest,
    CreditResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    SimpleResponse,
    StoreOffsetRequest,
    SubscribeRequest,
    UnsubscribeRequest,
)
from tierlog.formats.protocol.constants import (
    Command,
    OffsetType,
    ResponseCode,
)
from tierlog.log.errors import DamagedRangeError
from tierlog.logs import get_logger
from tierlog.server.broker import OPENING
from tierlog.server.errors import OffsetUnavailableError
from tierlog.server.handlers.sac import SacHandlers, log_spec
from tierlog.server.member_reads import MemberStreamHandle
from tierlog.server.meta_offsets import leader_query_offset
from tierlog.server.remote_stream import RemoteStreamHandle
from tierlog.server.subscriptions import (
    OVERTAKEN_ACTIONS,
    OVERTAKEN_PROPERTY,
    Subscription,
)

log = get_logger("tierlog.server.connection")


class ConsumerHandlers(SacHandlers):
    """Commands of consumers."""

    def _on_subscribe(self, cmd: SubscribeRequest) -> None:
        handle = self.broker.readable(self.vhost, cmd.stream)
        corr = cmd.correlation_id
        if cmd.subscription_id in self.subscriptions:
            code = ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS
        elif self._reserved("stream", cmd.stream):  # a system stream: no client reads it
            code = ResponseCode.ACCESS_REFUSED
        elif handle is None:
            code = self._missing(cmd.stream)
            if code == ResponseCode.STREAM_NOT_AVAILABLE:
                self._log_not_readable(cmd.stream)
        elif handle.unavailable == OPENING:  # its first resolution runs: retry shortly
            code = ResponseCode.STREAM_NOT_AVAILABLE
        elif isinstance(handle, MemberStreamHandle) and _member_refuses(handle, cmd):
            code = ResponseCode.STREAM_NOT_AVAILABLE  # read where Metadata names
        elif not self._permitted("read", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
        elif self._reserved("consumer name", cmd.properties.get("name")):
            code = ResponseCode.PRECONDITION_FAILED
        elif (refusal := self._sac_refusal(cmd)) is not None:
            code = refusal
        elif len(self.subscriptions) >= self.limits.max_subscriptions_per_connection:
            self.metrics.limits_hit.labels(limit="max_subscriptions").inc()
            code = ResponseCode.PRECONDITION_FAILED
        else:
            action = cmd.properties.get(OVERTAKEN_PROPERTY, "notify")
            if action not in OVERTAKEN_ACTIONS:
                code = ResponseCode.PRECONDITION_FAILED
            elif action == "notify" and _overtaken_at_subscribe(handle, cmd):
                # refused once, with its reason, rather than accepted and then ended by
                # a MetadataUpdate: a client that subscribes again at the same position
                # on every MetadataUpdate would loop for ever
                code = ResponseCode.PRECONDITION_FAILED
            else:
                try:
                    subscription = Subscription(
                        cmd.subscription_id,
                        handle.name,
                        handle.source,
                        log_spec(cmd.offset_spec),
                        cmd.credit,
                        self,
                        self.metrics,
                        overtaken=action,
                        want_file=self._use_sendfile,
                        chunk_filter=filter_from_properties(cmd.properties),
                        sac=self._sac_membership(cmd, handle.name),
                    )
                except DamagedRangeError as exc:
                    # offsets lost with a damaged chunk (no healthy copy): refused with
                    # the reason, like an overtaken offset, never skipped
                    log.warning(
                        "subscribe_refused_damaged_range",
                        stream=cmd.stream,
                        subscription=cmd.subscription_id,
                        first_offset=exc.first_offset,
                        reason=str(exc),
                    )
                    code = ResponseCode.PRECONDITION_FAILED
                except (TierlogError, OSError) as exc:
                    log.error("subscribe_failed", stream=cmd.stream, error=repr(exc))
                    code = ResponseCode.INTERNAL_ERROR
                else:
                    self.subscriptions[cmd.subscription_id] = subscription
                    self._use_stream(handle)
                    self.send(SimpleResponse(Command.SUBSCRIBE, corr, ResponseCode.OK).encode())
                    subscription.start()
                    if subscription.sac is not None:
                        self._sac_join(subscription, cmd)
                    return
        self.send(SimpleResponse(Command.SUBSCRIBE, corr, code).encode())

    def _log_not_readable(self, stream: str) -> None:
        """Why a Subscribe found no handle here and is told to retry: the state of the
        stream's opening on this node (resolving, failed with its error, or led
        elsewhere with no member or read-only handle yet), so a refusal that lasts says
        why in the log."""
        opening = self.broker.opening(self.vhost, stream)
        log.info(
            "subscribe_refused_not_available",
            stream=stream,
            opening=None if opening is None else opening.state,
            error=None if opening is None else opening.error,
        )

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
            self._sac_leave(subscription)
            code = ResponseCode.OK
        self.send(SimpleResponse(Command.UNSUBSCRIBE, cmd.correlation_id, code).encode())

    def _on_store_offset(self, cmd: StoreOffsetRequest) -> None:
        if self._reserved("stream", cmd.stream) or self._reserved("consumer name", cmd.reference):
            return  # no response to refuse with: ignored, counted and logged
        handle = self.broker.readable(self.vhost, cmd.stream)
        if handle is None or not cmd.reference or len(cmd.reference.encode("utf-8")) > 255:
            return  # StoreOffset has no response; RabbitMQ ignores these too
        if not self._permitted("read", cmd.stream):
            return
        handle.submit_store_offset(cmd.reference, cmd.offset)

    async def _on_query_offset(self, cmd: QueryOffsetRequest) -> None:
        handle = self.broker.readable(self.vhost, cmd.stream)
        corr = cmd.correlation_id
        if self._reserved("stream", cmd.stream):
            response = QueryOffsetResponse(corr, ResponseCode.ACCESS_REFUSED, 0)
        elif handle is None:
            response = QueryOffsetResponse(corr, self._missing(cmd.stream), 0)
        elif not self._permitted("read", cmd.stream):
            response = QueryOffsetResponse(corr, ResponseCode.ACCESS_REFUSED, 0)
        elif self._reserved("consumer name", cmd.reference):
            response = QueryOffsetResponse(corr, ResponseCode.PRECONDITION_FAILED, 0)
        else:
            await handle.flush()  # a StoreOffset sent just before is visible
            offset = None
            try:
                if cmd.reference and len(cmd.reference.encode("utf-8")) <= 255:
                    if isinstance(handle, RemoteStreamHandle):  # the leader's, or pending
                        offset = await handle.query_offset_async(cmd.reference)
                    else:  # the log's (or newer, from the MetaStore), once committed
                        offset = await leader_query_offset(handle, cmd.reference)
            except OffsetUnavailableError as exc:  # never an answer that could go back
                log.info("query_offset_unavailable", stream=cmd.stream, reason=str(exc))
                response = QueryOffsetResponse(corr, ResponseCode.STREAM_NOT_AVAILABLE, 0)
            else:
                if offset is None:
                    response = QueryOffsetResponse(corr, ResponseCode.NO_OFFSET, 0)
                else:
                    response = QueryOffsetResponse(corr, ResponseCode.OK, offset)
        self.send(response.encode())


def _member_refuses(handle: MemberStreamHandle, cmd: SubscribeRequest) -> bool:
    """Whether this member is outside its serving bound (``server.member_reads``)."""
    reason = handle.refusal()
    if reason is None:
        return False
    log.info("subscribe_refused_member", stream=cmd.stream, reason=reason)
    return True


def _overtaken_at_subscribe(handle: Any, cmd: SubscribeRequest) -> bool:
    """Whether the offset asked for is below the stream's first available offset (the
    same first offset the subscription's reader would raise ``OffsetOvertakenError``
    against); logged with its reason when it is."""
    spec = cmd.offset_spec
    if spec.type != OffsetType.OFFSET:
        return False
    first = handle.first_offset()
    if spec.value >= first:
        return False
    log.warning(
        "subscribe_refused_overtaken",
        stream=cmd.stream,
        subscription=cmd.subscription_id,
        position=spec.value,
        first_offset=first,
        reason=f"offset {spec.value} was removed by retention; the stream starts at {first}"
        " (subscribe at first, or with x-tierlog-overtaken=skip)",
    )
    return True
