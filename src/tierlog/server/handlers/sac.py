"""Single active consumer, the connection side: who may join a group, ConsumerUpdate
requests and their answers (``server/sac.py`` holds the groups).

As RabbitMQ (``rabbit_stream_reader``): a single-active-consumer Subscribe is answered OK
and the subscription delivers nothing until its group makes it active; then the server
sends ConsumerUpdate(active=true) and starts delivering at the offset spec of the client's
answer (type 0, "none": the Subscribe's own spec). A consumer that loses its turn stops at
once and gets ConsumerUpdate(active=false). A client that answers no ConsumerUpdate within
``[limits] request_timeout_seconds`` is disconnected, and its consumers leave their groups.

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
"""

from __future__ import annotations

from tierlog.cluster.consumer_groups import NO_PARTITION, GroupKey
from tierlog.errors import TierlogError
from tierlog.formats.protocol.commands import (
    ConsumerUpdateRequest,
    ConsumerUpdateResponse,
    SubscribeRequest,
    WireOffsetSpec,
)
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.log.offset_spec import OffsetSpec
from tierlog.logs import get_logger
from tierlog.server.connection_core import ConnectionCore
from tierlog.server.sac import UpdateRequest
from tierlog.server.subscriptions import SacMembership, Subscription

log = get_logger("tierlog.server.sac")

SAC_PROPERTY = "single-active-consumer"
NAME_PROPERTY = "name"
SUPER_STREAM_PROPERTY = "super-stream"


def wants_sac(cmd: SubscribeRequest) -> bool:
    """Whether a Subscribe asks for single active consumer (RabbitMQ: the value "true")."""
    return cmd.properties.get(SAC_PROPERTY, "").lower() == "true"


def log_spec(spec: WireOffsetSpec) -> OffsetSpec:
    """The log's offset spec of a wire one (FIRST, LAST, NEXT, OFFSET, TIMESTAMP)."""
    if spec.type == OffsetType.FIRST:
        return OffsetSpec.first()
    if spec.type == OffsetType.LAST:
        return OffsetSpec.last()
    if spec.type == OffsetType.NEXT:
        return OffsetSpec.next()
    if spec.type == OffsetType.OFFSET:
        return OffsetSpec.offset(spec.value)
    return OffsetSpec.timestamp(spec.value)


class SacHandlers(ConnectionCore):
    """Single-active-consumer subscriptions of one connection."""

    def _sac_refusal(self, cmd: SubscribeRequest) -> ResponseCode | None:
        """Why a single-active-consumer Subscribe is refused, or None (also for others)."""
        if not wants_sac(cmd):
            return None
        if cmd.properties.get(NAME_PROPERTY) is None:
            # RabbitMQ: "a single active consumer must have a name"
            log.info("sac_refused", reason="no name", subscription=cmd.subscription_id)
            return ResponseCode.PRECONDITION_FAILED
        if self.config.cluster.enabled:
            # the groups live on each node; consumers of one group on two nodes would
            # both be active: refused until the groups live with the stream's leader
            log.warning(
                "sac_refused",
                reason="single active consumer is not cluster-wide yet",
                stream=cmd.stream,
                subscription=cmd.subscription_id,
            )
            return ResponseCode.PRECONDITION_FAILED
        return None

    def _sac_membership(self, cmd: SubscribeRequest, stream: str) -> SacMembership | None:
        if not wants_sac(cmd):
            return None
        group = GroupKey(self.vhost, stream, cmd.properties[NAME_PROPERTY])
        return SacMembership(group, log_spec(cmd.offset_spec))

    def _sac_join(self, subscription: Subscription, cmd: SubscribeRequest) -> None:
        """Enter the subscription's group (after the Subscribe response was sent: a
        ConsumerUpdate for it never comes first)."""
        membership = subscription.sac
        assert membership is not None
        super_stream = cmd.properties.get(SUPER_STREAM_PROPERTY)
        index = NO_PARTITION
        if super_stream is not None:
            index = self.broker.sac.partition_index(self.vhost, super_stream, cmd.stream)
        self.broker.sac.register(membership.group, self, subscription.id, index)

    # ----------------------------------------------------------------- SacMember port

    def consumer_update(self, subscription_id: int, active: bool, stepping_down: bool) -> None:
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None or subscription.sac is None or self.state == "closed":
            return
        if not active:
            subscription.deactivate()
        request = UpdateRequest(subscription_id, subscription.sac.group, active, stepping_down)
        corr = self.sac_requests.open(request)
        self.sac_requests.arm(
            corr,
            self._loop.call_later(
                self.limits.request_timeout_seconds, self._consumer_update_overdue, corr
            ),
        )
        self.send(ConsumerUpdateRequest(corr, subscription_id, active).encode())

    def _on_consumer_update(self, answer: ConsumerUpdateResponse) -> None:
        request = self.sac_requests.take(answer.correlation_id)
        if request is None:
            return  # not asked, or the subscription ended meanwhile: ignored
        if answer.response_code != ResponseCode.OK:
            log.info("consumer_update_answer_code", code=answer.response_code)  # as RabbitMQ
        sac = self.broker.sac
        if not request.active:
            if request.stepping_down:
                sac.stepped_down(request.group, self, request.subscription_id)
            return
        subscription = self.subscriptions.get(request.subscription_id)
        if subscription is None or subscription.sac is None:
            return
        if not sac.is_active(request.group, self, request.subscription_id):
            return  # told to step down since: this answer is stale
        spec = answer.offset_spec
        start = subscription.sac.subscribe_spec if spec.type == OffsetType.NONE else log_spec(spec)
        try:
            subscription.activate(start)
        except (TierlogError, OSError) as exc:
            log.error("sac_activation_failed", stream=subscription.stream_name, error=repr(exc))
            self.subscription_failed(subscription, str(exc))

    def _consumer_update_overdue(self, correlation_id: int) -> None:
        if self.state == "closed" or correlation_id not in self.sac_requests.pending:
            return
        # RabbitMQ closes the connection of a client that does not answer a request
        # (rabbit_stream_reader, check_outstanding_requests): no Close frame
        self.metrics.limits_hit.labels(limit="request_timeout").inc()
        log.warning(
            "connection_closed",
            reason="consumer_update_unanswered",
            peer=self.peer_host,
            timeout_s=self.limits.request_timeout_seconds,
        )
        self.state = "closed"
        self._close_transport()
