"""Publisher commands: declare and delete a publisher, publish, query its sequence.

Mixed into ``Connection``; ``_on_publish`` is the publish hot path (called once per
Publish frame, straight from ``data_received``).
"""

from __future__ import annotations

import time
from typing import Any

from tierlog.errors import TierlogError
from tierlog.formats.protocol.commands import (
    DeclarePublisherRequest,
    DeletePublisherRequest,
    QueryPublisherSequenceRequest,
    QueryPublisherSequenceResponse,
    SimpleResponse,
)
from tierlog.formats.protocol.constants import (
    Command,
    ResponseCode,
)
from tierlog.formats.protocol.publish import (
    PublishError,
    decode_publish,
    encode_publish_confirm,
)
from tierlog.logs import get_logger
from tierlog.server.broker import OPENING
from tierlog.server.connection_core import ConnectionCore
from tierlog.server.delayed_intake import publisher_sequence
from tierlog.server.handlers.publisher import Publisher
from tierlog.server.remote_stream import RemoteStreamHandle

log = get_logger("tierlog.server.connection")


class PublisherHandlers(ConnectionCore):
    """Commands of publishers."""

    def _on_declare_publisher(self, cmd: DeclarePublisherRequest) -> None:
        handle = self.broker.get(self.vhost, cmd.stream)
        if self._reserved("stream", cmd.stream):  # a system stream: the server's alone
            code = ResponseCode.ACCESS_REFUSED
        elif handle is None or handle.unavailable == OPENING:
            code = (
                self._missing(cmd.stream) if handle is None else ResponseCode.STREAM_NOT_AVAILABLE
            )
        elif not self._permitted("write", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
        elif cmd.publisher_id in self.publishers:
            code = ResponseCode.PRECONDITION_FAILED
        elif len(self.publishers) >= self.limits.max_publishers_per_connection:
            self.metrics.limits_hit.labels(limit="max_publishers").inc()
            code = ResponseCode.PRECONDITION_FAILED
        else:
            reference = cmd.reference or None
            if reference is not None and len(reference.encode("utf-8")) > 255:
                code = ResponseCode.PRECONDITION_FAILED
            elif self._reserved("producer reference", reference):
                # the server's own producers (the delayed dispatcher): a client declaring
                # one could move the sequence the server judges its appends by
                code = ResponseCode.PRECONDITION_FAILED
            else:
                self.publishers[cmd.publisher_id] = Publisher(cmd.publisher_id, handle, reference)
                self._use_stream(handle)
                code = ResponseCode.OK
        self.send(SimpleResponse(Command.DECLARE_PUBLISHER, cmd.correlation_id, code).encode())

    def _on_delete_publisher(self, cmd: DeletePublisherRequest) -> None:
        if self.publishers.pop(cmd.publisher_id, None) is None:
            code = ResponseCode.PUBLISHER_DOES_NOT_EXIST
        else:
            code = ResponseCode.OK
        self.send(SimpleResponse(Command.DELETE_PUBLISHER, cmd.correlation_id, code).encode())

    def _on_query_publisher_sequence(self, cmd: QueryPublisherSequenceRequest) -> None:
        handle = self.broker.get(self.vhost, cmd.stream) or self.broker.readable(
            self.vhost, cmd.stream
        )
        if self._reserved("stream", cmd.stream):
            response = QueryPublisherSequenceResponse(
                cmd.correlation_id, ResponseCode.ACCESS_REFUSED, 0
            )
        elif handle is None:
            response = QueryPublisherSequenceResponse(
                cmd.correlation_id, self._missing(cmd.stream), 0
            )
        elif not self.gate.auth.allowed(
            self.user, self.vhost, "write", cmd.stream
        ) and not self._permitted("read", cmd.stream):
            response = QueryPublisherSequenceResponse(
                cmd.correlation_id, ResponseCode.ACCESS_REFUSED, 0
            )
        elif self._reserved("producer reference", cmd.reference):
            response = QueryPublisherSequenceResponse(
                cmd.correlation_id, ResponseCode.PRECONDITION_FAILED, 0
            )
        elif isinstance(handle, RemoteStreamHandle):  # written elsewhere: the leader knows
            remote = handle
            self._spawn(lambda c: self._sequence_from_leader(c, remote))(cmd)
            return
        else:
            sequence = 0
            if cmd.reference:
                try:
                    sequence = publisher_sequence(self.broker, handle, cmd.reference) or 0
                except (TierlogError, ValueError):
                    sequence = 0
            response = QueryPublisherSequenceResponse(cmd.correlation_id, ResponseCode.OK, sequence)
        self.send(response.encode())

    async def _sequence_from_leader(
        self, cmd: QueryPublisherSequenceRequest, handle: RemoteStreamHandle
    ) -> None:
        """QueryPublisherSequence where the stream is not written: the leader's answer,
        else STREAM_NOT_AVAILABLE (clients look the leader up and ask it), never a guess
        a producer would resume from."""
        code, sequence = ResponseCode.OK, 0
        if cmd.reference:
            tail = await handle.leader_tail(cmd.reference)
            if tail is None:
                code = ResponseCode.STREAM_NOT_AVAILABLE
            else:
                sequence = tail.sequence or 0
        self.send(QueryPublisherSequenceResponse(cmd.correlation_id, code, sequence).encode())

    def _on_publish(self, frame: memoryview) -> None:
        batch = decode_publish(frame)
        ids = batch.publishing_ids
        metrics = self.metrics
        metrics.published_messages.inc(len(ids))
        metrics.published_bytes.inc(len(frame))
        publisher = self.publishers.get(batch.publisher_id)
        if publisher is None or publisher.stream.closed:
            code = (
                ResponseCode.PUBLISHER_DOES_NOT_EXIST
                if publisher is None
                else ResponseCode.STREAM_DOES_NOT_EXIST
            )
            self._publish_error(batch.publisher_id, ids, code)
            return
        if not ids:
            return
        handle = publisher.stream
        publisher_id = batch.publisher_id
        received = time.perf_counter()
        cost = batch.held_bytes(len(frame))

        def done(code: int) -> None:
            self._release_publish(cost)
            if code == ResponseCode.OK:
                metrics.confirmed_messages.inc(len(ids))
                metrics.publish_confirm_seconds.observe(time.perf_counter() - received)
                self.send(encode_publish_confirm(publisher_id, ids))
            else:
                self._publish_error(publisher_id, ids, code)

        self._hold_publish(cost)
        if handle.delayed is not None:  # x-tierlog-delayed: some messages may be scheduled

            def settle(confirmed: Any, errors: Any) -> None:
                self._release_publish(cost)
                if confirmed:
                    metrics.confirmed_messages.inc(len(confirmed))
                    self.send(encode_publish_confirm(publisher_id, confirmed))
                if errors:
                    for _pid, code in errors:
                        self.metrics.publish_errors.labels(code=str(code)).inc()
                    self.send(PublishError(publisher_id, list(errors)).encode())

            handle.delayed.submit(batch, publisher.reference, settle)
        else:
            handle.submit_publish(batch, publisher.reference, done)
        if handle.congested:
            handle.block(self)
            self.pause(f"stream:{handle.name}")

    def _publish_error(self, publisher_id: int, ids: Any, code: int) -> None:
        self.metrics.publish_errors.labels(code=str(code)).inc(len(ids))
        self.send(PublishError(publisher_id, [(pid, code) for pid in ids]).encode())
