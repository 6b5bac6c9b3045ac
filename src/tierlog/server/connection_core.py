"""One stream-protocol connection: handshake, commands, publish and deliver paths.

An ``asyncio.Protocol`` (no stream reader/writer layer): bytes go through a
FrameSplitter; Publish frames are decoded whole by ``decode_publish`` and queued on
the stream's group commit; everything else goes through ``decode_client_frame``.
A malformed frame, or one over the negotiated FrameMax, closes this connection only.
Commands the server does not handle are answered with UNKNOWN_FRAME.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

from tierlog.formats.protocol.commands import (
    CloseRequest,
    Heartbeat,
    MetadataUpdate,
    OpenRequest,
    PeerPropertiesRequest,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    SimpleResponse,
    Tune,
    decode_client_frame,
)
from tierlog.formats.protocol.constants import (
    Command,
    ResponseCode,
)
from tierlog.formats.protocol.deliver import deliver_prefix
from tierlog.formats.protocol.errors import FrameTooLargeError, ProtocolError
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.log.errors import ReservedNameError
from tierlog.log.names import check_client_name
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.server.broker import Broker, StreamHandle
from tierlog.server.chunk_source import DeliverableChunk
from tierlog.server.config import ServerConfig
from tierlog.server.handlers.publisher import Publisher
from tierlog.server.limits import Gatekeeper
from tierlog.server.sac import UpdateRequests
from tierlog.server.subscriptions import (
    Subscription,
)

log = get_logger("tierlog.server.connection")

WRITE_BUFFER_HIGH = 1024 * 1024
"""A connection's output buffer above which Deliver waits (the per-consumer buffer cap,
plus the one chunk being written): the kernel's socket buffer keeps the link busy
meanwhile, and a remote chunk's pieces pin their fragment block until written."""
_HANDSHAKE_COMMANDS = (
    PeerPropertiesRequest,
    SaslHandshakeRequest,
    SaslAuthenticateRequest,
    Tune,
    OpenRequest,
    Heartbeat,
    CloseRequest,
    SimpleResponse,
)


class ConnectionCore(asyncio.Protocol):
    """The server side of one client connection: framing, handshake state, the dispatch
    table (one dict lookup per frame; Publish frames go straight to ``_on_publish``), flow
    control and the Deliver writer. The command handlers live in ``handlers/``, by area."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        metrics: Metrics,
        gate: Gatekeeper | None = None,
    ) -> None:
        self.broker = broker
        self.config = config
        self.metrics = metrics
        self.gate = gate if gate is not None else Gatekeeper(config, metrics)
        self.limits = config.limits
        # until Tune, only handshake-sized frames: an anonymous peer cannot make us buffer MiBs
        self.splitter = FrameSplitter(self.limits.preauth_frame_max)
        self._admitted = False
        self._user_counted = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._held_publish_bytes = 0
        self._deferred: list[memoryview] = []  # frames read, not handled: over budget
        self._relief_scheduled = False
        self.transport: asyncio.Transport | None = None
        self.peer_host = ""
        self.local_addr: tuple[str, int] = ("127.0.0.1", 0)
        self.state = "start"  # start → authenticated → tuned → open → closed
        self.user = ""
        self.vhost = "/"
        self.frame_max = config.server.frame_max
        self.heartbeat = config.server.heartbeat
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.sac_requests = UpdateRequests()  # ConsumerUpdates awaiting the client's answer
        self.streams_used: set[StreamHandle] = set()
        self._pause_reasons: set[str] = set()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._last_received = time.monotonic()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._use_sendfile = config.server.use_sendfile and _loop_has_sendfile(self._loop)
        self._dispatch = self._dispatch_table()
        self._tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport
        self.transport = transport
        # never above half the memory budget: a connection paused for unsent output is
        # resumed by resume_writing, which only a buffer past its high-water mark brings
        high = min(WRITE_BUFFER_HIGH, self.limits.connection_memory_bytes // 2)
        transport.set_write_buffer_limits(high=high)
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.peer_host = str(peer[0]) if peer else ""
        if sock:
            self.local_addr = (str(sock[0]), int(sock[1]))
        self.metrics.connections.inc()
        self.metrics.connections_opened.inc()
        self.broker.connections.add(self)
        self._admitted = self.gate.admit_connection()
        if not self._admitted:
            log.warning("connection_refused", reason="max_connections", peer=self.peer_host)
            self.state = "closed"
            transport.abort()
            return
        self._handshake_timer = self._loop.call_later(
            self.limits.handshake_timeout_seconds, self._handshake_expired
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = "closed"
        if self._admitted:
            self._admitted = False
            self.gate.release_connection()
        if self._user_counted:
            self._user_counted = False
            self.gate.release_user(self.user)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.metrics.connections.dec()
        self.broker.connections.discard(self)
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        for sub in self.subscriptions.values():
            sub.stop_nowait()
        self.subscriptions.clear()
        self.sac_requests.close()
        # its single active consumers leave their groups (every one: an Unsubscribe cut
        # short by the close has already taken its subscription out of ``subscriptions``)
        self.broker.sac.member_down(self)
        self.publishers.clear()
        for handle in self.streams_used:
            handle.listeners.discard(self)
            handle.blocked.discard(self)
        self.streams_used.clear()
        for task in self._tasks:
            task.cancel()
        self._can_write.set()
        self._deferred = []
        self.gate.publish_memory.waiting.discard(self)

    def pause_writing(self) -> None:
        # a peer that does not read (confirms, deliveries) is not read either
        self._can_write.clear()
        self.pause("output")

    def resume_writing(self) -> None:
        self._can_write.set()
        self.unpause("output")
        self.memory_relieved()

    def data_received(self, data: bytes) -> None:
        if self.state == "closed":
            return
        self._last_received = time.monotonic()
        try:
            frames = self.splitter.feed(data)
        except FrameTooLargeError as exc:
            self._fail("frame_too_large", ResponseCode.FRAME_TOO_LARGE, str(exc))
            return
        except ProtocolError as exc:
            self._fail("malformed", ResponseCode.UNKNOWN_FRAME, str(exc))
            return
        if self._deferred:  # reading was paused; keep the order of what was read
            self._deferred.extend(frames)
            return
        self._handle_frames(frames)

    def _handle_frames(self, frames: list[memoryview]) -> None:
        """Handle frames in order; once over the memory budget, the rest wait undecoded
        (``_deferred``, their wire bytes only) until the budget is relieved."""
        for index, frame in enumerate(frames):
            if self.state == "closed":
                return
            if "memory" in self._pause_reasons:
                self._deferred = frames[index:]
                return
            try:
                if frame[0] == 0 and frame[1] == Command.PUBLISH and self.state == "open":
                    memory = self.gate.publish_memory
                    if memory.over():  # decoded, it would cost many times its wire size
                        memory.waiting.add(self)
                        self.pause("memory")
                        self._deferred = frames[index:]
                        return
                    self._on_publish(frame)
                    continue
                command = decode_client_frame(frame)
                if self.state != "open" and not isinstance(command, _HANDSHAKE_COMMANDS):
                    self._fail("not_open", ResponseCode.ACCESS_REFUSED, "connection not open")
                    return
                self._dispatch[type(command)](command)
            except ProtocolError as exc:
                self._fail("malformed", ResponseCode.UNKNOWN_FRAME, str(exc))
                return

    def eof_received(self) -> bool | None:
        return None

    # ----------------------------------------------------------------- helpers

    def send(self, data: bytes) -> None:
        if self.transport is not None and self.state != "closed":
            self.transport.write(data)

    def _fail(self, reason: str, code: int, message: str) -> None:
        """Close this connection because of a bad frame or protocol violation."""
        self.metrics.frame_errors.labels(reason=reason).inc()
        log.warning("connection_closed", reason=reason, peer=self.peer_host, detail=message)
        if self.transport is not None and self.state != "closed":
            self.transport.write(CloseRequest(1, code, reason).encode())
            self.transport.close()
        self.state = "closed"

    def close_for_reload(self) -> None:
        """Close this connection: its user was removed by a configuration reload."""
        if self.transport is not None and self.state != "closed":
            self.transport.write(
                CloseRequest(1, ResponseCode.AUTHENTICATION_FAILURE, "user removed").encode()
            )
            self.transport.close()
        self.state = "closed"

    def _spawn(self, handler: Callable[[Any], Any]) -> Callable[[Any], None]:
        def start(command: Any) -> None:
            task = asyncio.ensure_future(handler(command))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

        return start

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("command_failed", error=repr(task.exception()))

    def pause(self, reason: str) -> None:
        if not self._pause_reasons and self.transport is not None:
            self.transport.pause_reading()
        self._pause_reasons.add(reason)

    def unpause(self, reason: str) -> None:
        if reason in self._pause_reasons:
            self._pause_reasons.discard(reason)
            if not self._pause_reasons and self.transport is not None and self.state != "closed":
                self.transport.resume_reading()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if self.state not in ("open", "closed"):
            # No Close frame, as RabbitMQ (close_immediately at its handshake state
            # timeout): a client that is not open yet cannot expect a server Close, and
            # the Node.js client fails on one ("Unknown response 22").
            self.metrics.limits_hit.labels(limit="handshake_timeout").inc()
            self.metrics.frame_errors.labels(reason="handshake_timeout").inc()
            log.warning("connection_closed", reason="handshake_timeout", peer=self.peer_host)
            self.state = "closed"
            self._close_transport()

    def _advertised(self) -> tuple[str, int]:
        s = self.config.server
        return (s.advertised_host or self.local_addr[0], s.advertised_port or self.local_addr[1])

    def _over_budget(self, divisor: int) -> bool:
        """Held publishes plus unsent output above the connection's budget (``/ divisor``)."""
        transport = self.transport
        unsent = transport.get_write_buffer_size() if transport is not None else 0
        used = self._held_publish_bytes + unsent
        return used > self.limits.connection_memory_bytes // divisor

    def _hold_publish(self, cost: int) -> None:
        """A decoded Publish is queued: count its cost here and node-wide; stop reading
        when either budget is spent."""
        self._held_publish_bytes += cost
        memory = self.gate.publish_memory
        memory.hold(cost)
        if memory.over():
            memory.waiting.add(self)
        elif not self._over_budget(1):
            return
        if "memory" not in self._pause_reasons:
            self.metrics.limits_hit.labels(limit="memory_paused").inc()
            self.pause("memory")

    def _release_publish(self, cost: int) -> None:
        """A queued Publish was settled (confirmed or refused): its objects are freed."""
        self._held_publish_bytes -= cost
        self.gate.publish_memory.release(cost)
        self.memory_relieved()

    def memory_relieved(self) -> None:
        """Memory was freed (here, node-wide or in the socket): resume reading when both
        budgets are at most half spent; the frames read meanwhile are handled first."""
        if "memory" not in self._pause_reasons or self._relief_scheduled:
            return
        if self.state == "closed" or self._over_budget(2):
            return  # this connection's own settles or resume_writing call again
        memory = self.gate.publish_memory
        if memory.over(2):
            memory.waiting.add(self)
            return
        self._relief_scheduled = True
        self._loop.call_soon(self._resume_after_relief)

    def _resume_after_relief(self) -> None:
        self._relief_scheduled = False
        if self.state == "closed" or "memory" not in self._pause_reasons:
            return
        frames, self._deferred = self._deferred, []
        self._pause_reasons.discard("memory")
        self._handle_frames(frames)
        if not self._pause_reasons and self.transport is not None and self.state != "closed":
            self.transport.resume_reading()

    def _dispatch_table(self) -> dict[type, Callable[[Any], None]]:
        """Decoded command type → handler (one dict lookup per frame); ``Connection``
        builds it from the handlers of every area."""
        raise NotImplementedError

    def _on_publish(self, frame: memoryview) -> None:
        """A Publish frame (the hot path); ``PublisherHandlers`` handles it."""
        raise NotImplementedError

    # ----------------------------------------------------------------- StreamListener

    def stream_unavailable(self, stream: StreamHandle) -> None:
        """The stream was deleted: tell the client once, drop its publishers/subscriptions."""
        for pid in [p.id for p in self.publishers.values() if p.stream is stream]:
            del self.publishers[pid]
        for sid in [s.id for s in self.subscriptions.values() if s.stream_name == stream.name]:
            self._subscription_ended(self.subscriptions.pop(sid))
        self.streams_used.discard(stream)
        self.unpause(f"stream:{stream.name}")
        self.send(MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, stream.name).encode())

    def resume_publishing(self, stream: StreamHandle) -> None:
        self.unpause(f"stream:{stream.name}")

    def _subscription_ended(self, subscription: Subscription) -> None:
        """A subscription removed from ``subscriptions`` stops; a single active consumer
        leaves its group (the next one is activated)."""
        subscription.stop_nowait()
        self._sac_leave(subscription)

    def _sac_leave(self, subscription: Subscription) -> None:
        if subscription.sac is not None:
            self.sac_requests.forget(subscription.id)
            self.broker.sac.unregister(subscription.sac.group, self, subscription.id)

    def consumer_update(self, subscription_id: int, active: bool, stepping_down: bool) -> None:
        """The ``SacMember`` port (``server/sac.py``); ``SacHandlers`` implements it."""
        raise NotImplementedError

    def _use_stream(self, handle: StreamHandle) -> None:
        handle.listeners.add(self)
        self.streams_used.add(handle)

    def _permitted(self, action: str, stream: str) -> bool:
        """May this connection's user do ``action`` on ``stream``? Refusals are counted."""
        if self.gate.auth.allowed(self.user, self.vhost, action, stream):
            return True
        self.gate.refused("stream", action)
        log.info("access_refused", user=self.user, vhost=self.vhost, action=action, stream=stream)
        return False

    def _reserved(self, kind: str, name: str | None) -> bool:
        """True when the client named a ``kind`` (stream, producer reference, consumer
        name, ...) with the server's reserved prefix (``log/names.py``): the command is
        refused whatever the user's permissions; the refusal is counted and logged."""
        try:
            check_client_name(kind, name)
        except ReservedNameError:
            self.gate.refused("stream", "reserved_name")
            log.info(
                "reserved_name_refused", user=self.user, vhost=self.vhost, kind=kind, name=name
            )
            return True
        return False

    def _missing(self, stream: str) -> ResponseCode:
        """The code for a stream that is not open: retriable while it is being resolved
        (or failed to open) after a restart, else it does not exist."""
        if self.broker.not_available_yet(self.vhost, stream):
            return ResponseCode.STREAM_NOT_AVAILABLE
        return ResponseCode.STREAM_DOES_NOT_EXIST

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ----------------------------------------------------------------- DeliverySink

    def unsent_bytes(self) -> int:
        """Bytes written to the transport and not yet accepted by the socket."""
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    async def deliver(self, subscription_id: int, chunk: DeliverableChunk) -> None:
        transport = self.transport
        if transport is None or self.state == "closed":
            raise asyncio.CancelledError
        if not self._can_write.is_set():
            await self._can_write.wait()
            if self.state == "closed":
                raise asyncio.CancelledError
        await self.broker.delivery_turns.take(chunk.wire_size)
        if self.state == "closed":
            raise asyncio.CancelledError
        prefix = deliver_prefix(subscription_id, chunk.wire_size)
        if chunk.parts is not None:
            # Scatter-gather: the pieces (views into a fragment buffer for remote
            # chunks) go to the socket as they are, never joined into a copy.
            transport.writelines((prefix, *chunk.parts))
            return
        assert chunk.file is not None
        transport.write(prefix)
        for position, length in chunk.ranges:
            await self._loop.sendfile(transport, chunk.file, position, length)
        self.metrics.sendfile_chunks.inc()

    def subscription_overtaken(self, subscription: Subscription) -> None:
        if self.subscriptions.get(subscription.id) is subscription:
            del self.subscriptions[subscription.id]
            self._subscription_ended(subscription)
        self.send(
            MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, subscription.stream_name).encode()
        )

    def subscription_failed(self, subscription: Subscription, reason: str) -> None:
        self.subscription_overtaken(subscription)


def _loop_has_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    """True when the loop implements sendfile natively (the stdlib loop; not uvloop)."""
    return type(loop).sendfile is not asyncio.AbstractEventLoop.sendfile and isinstance(
        loop, asyncio.BaseEventLoop
    )
