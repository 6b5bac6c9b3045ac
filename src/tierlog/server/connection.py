"""One stream-protocol connection: handshake, commands, publish and deliver paths.

An ``asyncio.Protocol`` (no stream reader/writer layer): bytes go through a
FrameSplitter; Publish frames are decoded whole by ``decode_publish`` and queued on
the stream's group commit; everything else goes through ``decode_client_frame``.
A malformed frame, or one over the negotiated FrameMax, closes this connection only.
Commands the server does not handle are answered with UNKNOWN_FRAME.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.protocol.commands import (
    BrokerAddress,
    CloseRequest,
    CommandVersion,
    CreateRequest,
    CreditRequest,
    CreditResponse,
    DeclarePublisherRequest,
    DeletePublisherRequest,
    DeleteRequest,
    ExchangeCommandVersionsRequest,
    ExchangeCommandVersionsResponse,
    Heartbeat,
    MetadataRequest,
    MetadataResponse,
    MetadataUpdate,
    OpenRequest,
    OpenResponse,
    PartitionsRequest,
    PeerPropertiesRequest,
    PeerPropertiesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    QueryPublisherSequenceRequest,
    QueryPublisherSequenceResponse,
    RouteRequest,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    SimpleResponse,
    StoreOffsetRequest,
    StreamMetadata,
    StreamStatsRequest,
    StreamStatsResponse,
    SubscribeRequest,
    Tune,
    UnknownCommand,
    UnsubscribeRequest,
    WireOffsetSpec,
    decode_client_frame,
    plain_credentials,
)
from tierlog.formats.protocol.constants import (
    SUPPORTED_VERSIONS,
    Command,
    OffsetType,
    ResponseCode,
)
from tierlog.formats.protocol.deliver import deliver_prefix
from tierlog.formats.protocol.errors import FrameTooLargeError, ProtocolError
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.publish import (
    PublishError,
    decode_publish,
    encode_publish_confirm,
)
from tierlog.log.offset_spec import OffsetSpec
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.remote.errors import StreamExistsError, StreamNotFoundError
from tierlog.server.arguments import settings_from_arguments
from tierlog.server.broker import OPENING, Broker, StreamHandle
from tierlog.server.chunk_source import DeliverableChunk
from tierlog.server.config import ServerConfig
from tierlog.server.limits import Gatekeeper
from tierlog.server.subscriptions import (
    OVERTAKEN_ACTIONS,
    OVERTAKEN_PROPERTY,
    Subscription,
)

log = get_logger("tierlog.server.connection")

WRITE_BUFFER_HIGH = 1024 * 1024
"""A connection's output buffer above which Deliver waits (the per-consumer buffer cap,
plus the one chunk being written): the kernel's socket buffer keeps the link busy
meanwhile, and a remote chunk's pieces pin their fragment block until written."""
NO_LEADER = 0xFFFF
SERVER_PROPERTIES = {"product": "tierlog", "platform": "Python", "copyright": "tierlog authors"}
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


@dataclass(slots=True)
class Publisher:
    id: int
    stream: StreamHandle
    reference: str | None


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class Connection(asyncio.Protocol):
    """The server side of one client connection."""

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
        self._queued_publish_bytes = 0
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
        self.streams_used: set[StreamHandle] = set()
        self._pause_reasons: set[str] = set()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._last_received = time.monotonic()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._use_sendfile = config.server.use_sendfile and _loop_has_sendfile(self._loop)
        self._dispatch: dict[type, Callable[[Any], None]] = {
            PeerPropertiesRequest: self._on_peer_properties,
            SaslHandshakeRequest: self._on_sasl_handshake,
            SaslAuthenticateRequest: self._on_sasl_authenticate,
            Tune: self._on_tune,
            OpenRequest: self._on_open,
            Heartbeat: lambda _c: None,
            CloseRequest: self._on_close,
            SimpleResponse: lambda _c: None,  # e.g. the answer to our Close
            CreateRequest: self._spawn(self._on_create),
            DeleteRequest: self._spawn(self._on_delete),
            MetadataRequest: self._on_metadata,
            StreamStatsRequest: self._on_stream_stats,
            RouteRequest: self._on_super_stream,
            PartitionsRequest: self._on_super_stream,
            ExchangeCommandVersionsRequest: self._on_exchange_versions,
            DeclarePublisherRequest: self._on_declare_publisher,
            QueryPublisherSequenceRequest: self._on_query_publisher_sequence,
            DeletePublisherRequest: self._on_delete_publisher,
            SubscribeRequest: self._on_subscribe,
            CreditRequest: self._on_credit,
            StoreOffsetRequest: self._on_store_offset,
            QueryOffsetRequest: self._spawn(self._on_query_offset),
            UnsubscribeRequest: self._spawn(self._on_unsubscribe),
            UnknownCommand: self._on_unknown,
        }
        self._tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
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
        self.publishers.clear()
        for handle in self.streams_used:
            handle.listeners.discard(self)
            handle.blocked.discard(self)
        self.streams_used.clear()
        for task in self._tasks:
            task.cancel()
        self._can_write.set()

    def pause_writing(self) -> None:
        # a peer that does not read (confirms, deliveries) is not read either
        self._can_write.clear()
        self.pause("output")

    def resume_writing(self) -> None:
        self._can_write.set()
        self.unpause("output")
        if "memory" in self._pause_reasons and not self._over_budget(2):
            self.unpause("memory")

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
        for frame in frames:
            if self.state == "closed":
                return
            try:
                if frame[0] == 0 and frame[1] == Command.PUBLISH and self.state == "open":
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

    # ----------------------------------------------------------------- StreamListener

    def stream_unavailable(self, stream: StreamHandle) -> None:
        """The stream was deleted: tell the client once, drop its publishers/subscriptions."""
        for pid in [p.id for p in self.publishers.values() if p.stream is stream]:
            del self.publishers[pid]
        for sid in [s.id for s in self.subscriptions.values() if s.stream_name == stream.name]:
            self.subscriptions.pop(sid).stop_nowait()
        self.streams_used.discard(stream)
        self.unpause(f"stream:{stream.name}")
        self.send(MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, stream.name).encode())

    def resume_publishing(self, stream: StreamHandle) -> None:
        self.unpause(f"stream:{stream.name}")

    def _use_stream(self, handle: StreamHandle) -> None:
        handle.listeners.add(self)
        self.streams_used.add(handle)

    # ----------------------------------------------------------------- handshake

    def _on_peer_properties(self, cmd: PeerPropertiesRequest) -> None:
        self.send(
            PeerPropertiesResponse(cmd.correlation_id, ResponseCode.OK, SERVER_PROPERTIES).encode()
        )

    def _on_sasl_handshake(self, cmd: SaslHandshakeRequest) -> None:
        mechanisms = ["PLAIN"]
        if certificate_user(self.transport) is not None:
            mechanisms.append("EXTERNAL")
        self.send(SaslHandshakeResponse(cmd.correlation_id, ResponseCode.OK, mechanisms).encode())

    def _on_sasl_authenticate(self, cmd: SaslAuthenticateRequest) -> None:
        if self.state != "start":
            self._fail("reauthenticate", ResponseCode.SASL_ERROR, "already authenticated")
            return
        corr = cmd.correlation_id
        auth = self.gate.auth
        if cmd.mechanism == "EXTERNAL":
            user = certificate_user(self.transport)
            if user is None or user not in auth.users:
                self._auth_done(corr, user or "", ResponseCode.AUTHENTICATION_FAILURE)
            else:
                self._auth_done(corr, user, self._loopback_rule(user))
            return
        if cmd.mechanism != "PLAIN":
            unsupported = ResponseCode.SASL_MECHANISM_NOT_SUPPORTED
            self.send(SaslAuthenticateResponse(corr, unsupported).encode())
            return
        try:
            user, password = plain_credentials(cmd.data)
        except ProtocolError:
            user, password = "", ""
        if auth.limiter.blocked(self.peer_host) and not auth.is_verified(user, password):
            self._auth_done(corr, user, ResponseCode.AUTHENTICATION_FAILURE)
            return
        if not auth.needs_slow_check(user, password):
            self._auth_done(corr, user, self._password_code(user, password))
            return
        # a slow hash runs off the event loop; nothing else is read meanwhile
        self.pause("auth")
        future = self._loop.run_in_executor(None, self._password_code, user, password)

        def finished(f: asyncio.Future[int]) -> None:
            self.unpause("auth")
            if self.state == "start":
                failed = f.cancelled() or f.exception() is not None
                code = ResponseCode.AUTHENTICATION_FAILURE if failed else f.result()
                self._auth_done(corr, user, code)

        future.add_done_callback(finished)

    def _password_code(self, user: str, password: str) -> int:
        if not self.gate.auth.check_password(user, password):
            return ResponseCode.AUTHENTICATION_FAILURE
        return self._loopback_rule(user)

    def _loopback_rule(self, user: str) -> int:
        if user in self.config.auth.loopback_users and not is_loopback(self.peer_host):
            return ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK
        return ResponseCode.OK

    def _auth_done(self, correlation_id: int, user: str, code: int) -> None:
        if code == ResponseCode.OK and not self.gate.admit_user(user):
            log.warning("connection_refused", reason="max_connections_per_user", user=user)
            code = ResponseCode.ACCESS_REFUSED
        elif code == ResponseCode.OK:
            self._user_counted = True
        self.send(SaslAuthenticateResponse(correlation_id, code).encode())
        if code != ResponseCode.OK:
            if code == ResponseCode.AUTHENTICATION_FAILURE:
                self.gate.auth.limiter.failed(self.peer_host)
            self.metrics.auth_failures.inc()
            log.warning("auth_failed", user=user, peer=self.peer_host, code=code)
            self._loop.call_later(0.05, self._close_transport)
            self.state = "closed"
            return
        self.user = user
        self.state = "authenticated"
        self.send(Tune(self.config.server.frame_max, self.config.server.heartbeat).encode())

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if self.state not in ("open", "closed"):
            self.metrics.limits_hit.labels(limit="handshake_timeout").inc()
            self._fail("handshake_timeout", ResponseCode.INTERNAL_ERROR, "handshake too slow")

    def _permitted(self, action: str, stream: str) -> bool:
        """May this connection's user do ``action`` on ``stream``? Refusals are counted."""
        if self.gate.auth.allowed(self.user, self.vhost, action, stream):
            return True
        self.gate.refused("stream", action)
        log.info("access_refused", user=self.user, vhost=self.vhost, action=action, stream=stream)
        return False

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _on_tune(self, cmd: Tune) -> None:
        if self.state != "authenticated":
            return
        ours = self.config.server.frame_max
        self.frame_max = min(ours, cmd.frame_max) if cmd.frame_max else ours
        self.frame_max = max(self.frame_max, 1024)
        self.splitter.max_frame_size = self.frame_max
        ours_hb = self.config.server.heartbeat
        self.heartbeat = min(ours_hb, cmd.heartbeat) if cmd.heartbeat and ours_hb else 0
        self.state = "tuned"
        if self.heartbeat:
            self._heartbeat_task = asyncio.ensure_future(self._heartbeats())

    def _on_open(self, cmd: OpenRequest) -> None:
        if self.state != "tuned":
            self._fail("open_before_tune", ResponseCode.ACCESS_REFUSED, "Open before Tune")
            return
        if self.gate.auth.vhost_permission(self.user, cmd.virtual_host) is None:
            self.gate.refused("stream", "vhost")
            code = ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE
            self.send(OpenResponse(cmd.correlation_id, code, {}).encode())
            self._loop.call_later(0.05, self._close_transport)
            self.state = "closed"
            return
        self.vhost = cmd.virtual_host
        host, port = self._advertised()
        props = {"advertised_host": host, "advertised_port": str(port)}
        self.send(OpenResponse(cmd.correlation_id, ResponseCode.OK, props).encode())
        self.state = "open"
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def _advertised(self) -> tuple[str, int]:
        s = self.config.server
        return (s.advertised_host or self.local_addr[0], s.advertised_port or self.local_addr[1])

    async def _heartbeats(self) -> None:
        interval = self.heartbeat
        while self.state != "closed":
            await asyncio.sleep(interval)
            if time.monotonic() - self._last_received > 3 * interval:
                self._fail("heartbeat_timeout", ResponseCode.INTERNAL_ERROR, "missed heartbeats")
                return
            self.send(Heartbeat().encode())

    def _on_close(self, cmd: CloseRequest) -> None:
        self.send(SimpleResponse(Command.CLOSE, cmd.correlation_id, ResponseCode.OK).encode())
        if self.transport is not None:
            self.transport.close()
        self.state = "closed"

    def _on_unknown(self, cmd: UnknownCommand) -> None:
        self.metrics.unknown_commands.inc()
        if cmd.key & 0x8000:
            return  # an unexpected response: nothing to answer
        self.send(cmd.error_response())

    # ----------------------------------------------------------------- streams

    async def _on_create(self, cmd: CreateRequest) -> None:
        if not self._permitted("configure", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
            self.send(SimpleResponse(Command.CREATE, cmd.correlation_id, code).encode())
            return
        try:
            settings = settings_from_arguments(cmd.arguments)
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
        if not self._permitted("configure", cmd.stream):
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

    def _missing(self, stream: str) -> ResponseCode:
        """The code for a stream that is not open: retriable while it is being resolved
        (or failed to open) after a restart, else it does not exist."""
        if self.broker.not_available_yet(self.vhost, stream):
            return ResponseCode.STREAM_NOT_AVAILABLE
        return ResponseCode.STREAM_DOES_NOT_EXIST

    def _on_metadata(self, cmd: MetadataRequest) -> None:
        host, port = self._advertised()
        streams = []
        for name in cmd.streams:
            handle = self.broker.get(self.vhost, name)
            if handle is None:
                streams.append(StreamMetadata(name, self._missing(name), NO_LEADER, ()))
            elif handle.unavailable == OPENING:  # its first resolution runs
                code = ResponseCode.STREAM_NOT_AVAILABLE
                streams.append(StreamMetadata(name, code, NO_LEADER, ()))
            else:
                streams.append(StreamMetadata(name, ResponseCode.OK, 0, ()))
        self.send(
            MetadataResponse(cmd.correlation_id, [BrokerAddress(0, host, port)], streams).encode()
        )

    def _on_stream_stats(self, cmd: StreamStatsRequest) -> None:
        handle = self.broker.get(self.vhost, cmd.stream)
        if handle is None or not self._permitted("read", cmd.stream):
            refused = ResponseCode.ACCESS_REFUSED
            code = self._missing(cmd.stream) if handle is None else refused
            self.send(SimpleResponse(Command.STREAM_STATS, cmd.correlation_id, code).encode())
            return
        stats = {
            "first_chunk_id": handle.first_offset(),
            "committed_chunk_id": handle.log.commit_point().chunk_id,
        }
        self.send(StreamStatsResponse(cmd.correlation_id, ResponseCode.OK, stats).encode())

    def _on_super_stream(self, cmd: RouteRequest | PartitionsRequest) -> None:
        code = ResponseCode.STREAM_DOES_NOT_EXIST  # super streams are not supported
        self.send(SimpleResponse(cmd.command, cmd.correlation_id, code).encode())

    def _on_exchange_versions(self, cmd: ExchangeCommandVersionsRequest) -> None:
        versions = []
        for key in sorted(SUPPORTED_VERSIONS):
            low, high = SUPPORTED_VERSIONS[key]
            if key == Command.DELIVER:
                high = 1  # Deliver v2 is not sent (rstream accepts v1 only)
            versions.append(CommandVersion(int(key), low, high))
        self.send(
            ExchangeCommandVersionsResponse(cmd.correlation_id, ResponseCode.OK, versions).encode()
        )

    # ----------------------------------------------------------------- publishing

    def _on_declare_publisher(self, cmd: DeclarePublisherRequest) -> None:
        handle = self.broker.get(self.vhost, cmd.stream)
        if handle is None or handle.unavailable == OPENING:
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
        handle = self.broker.get(self.vhost, cmd.stream)
        if handle is None:
            response = QueryPublisherSequenceResponse(
                cmd.correlation_id, self._missing(cmd.stream), 0
            )
        elif not self.gate.auth.allowed(
            self.user, self.vhost, "write", cmd.stream
        ) and not self._permitted("read", cmd.stream):
            response = QueryPublisherSequenceResponse(
                cmd.correlation_id, ResponseCode.ACCESS_REFUSED, 0
            )
        else:
            sequence = 0
            if cmd.reference:
                try:
                    sequence = handle.log.producer_sequence(cmd.reference) or 0
                except (TierlogError, ValueError):
                    sequence = 0
            response = QueryPublisherSequenceResponse(cmd.correlation_id, ResponseCode.OK, sequence)
        self.send(response.encode())

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
        size = len(frame)
        self._queued_publish_bytes += size

        def done(code: int) -> None:
            self._queued_publish_bytes -= size
            if "memory" in self._pause_reasons and not self._over_budget(2):
                self.unpause("memory")
            if code == ResponseCode.OK:
                metrics.confirmed_messages.inc(len(ids))
                metrics.publish_confirm_seconds.observe(time.perf_counter() - received)
                self.send(encode_publish_confirm(publisher_id, ids))
            else:
                self._publish_error(publisher_id, ids, code)

        handle.submit_publish(batch, publisher.reference, done)
        if handle.congested:
            handle.block(self)
            self.pause(f"stream:{handle.name}")
        if self._over_budget(1):
            self.metrics.limits_hit.labels(limit="memory_paused").inc()
            self.pause("memory")

    def _over_budget(self, divisor: int) -> bool:
        """Queued publishes plus unsent output above the budget (``/ divisor``)."""
        transport = self.transport
        unsent = transport.get_write_buffer_size() if transport is not None else 0
        used = self._queued_publish_bytes + unsent
        return used > self.limits.connection_memory_bytes // divisor

    def _publish_error(self, publisher_id: int, ids: Any, code: int) -> None:
        self.metrics.publish_errors.labels(code=str(code)).inc(len(ids))
        self.send(PublishError(publisher_id, [(pid, code) for pid in ids]).encode())

    # ----------------------------------------------------------------- consuming

    def _on_subscribe(self, cmd: SubscribeRequest) -> None:
        handle = self.broker.get(self.vhost, cmd.stream)
        corr = cmd.correlation_id
        if cmd.subscription_id in self.subscriptions:
            code = ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS
        elif handle is None:
            code = self._missing(cmd.stream)
        elif handle.unavailable == OPENING:  # its first resolution runs: retry shortly
            code = ResponseCode.STREAM_NOT_AVAILABLE
        elif not self._permitted("read", cmd.stream):
            code = ResponseCode.ACCESS_REFUSED
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
        handle = self.broker.get(self.vhost, cmd.stream)
        if handle is None or not cmd.reference or len(cmd.reference.encode("utf-8")) > 255:
            return  # StoreOffset has no response; RabbitMQ ignores these too
        if not self._permitted("read", cmd.stream):
            return
        handle.submit_store_offset(cmd.reference, cmd.offset)

    async def _on_query_offset(self, cmd: QueryOffsetRequest) -> None:
        handle = self.broker.get(self.vhost, cmd.stream)
        corr = cmd.correlation_id
        if handle is None:
            response = QueryOffsetResponse(corr, self._missing(cmd.stream), 0)
        elif not self._permitted("read", cmd.stream):
            response = QueryOffsetResponse(corr, ResponseCode.ACCESS_REFUSED, 0)
        else:
            await handle.flush()  # a StoreOffset sent just before is visible
            offset = None
            if cmd.reference and len(cmd.reference.encode("utf-8")) <= 255:
                offset = handle.log.query_offset(cmd.reference)
            if offset is None:
                response = QueryOffsetResponse(corr, ResponseCode.NO_OFFSET, 0)
            else:
                response = QueryOffsetResponse(corr, ResponseCode.OK, offset)
        self.send(response.encode())

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
            subscription.stop_nowait()
        self.send(
            MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, subscription.stream_name).encode()
        )

    def subscription_failed(self, subscription: Subscription, reason: str) -> None:
        self.subscription_overtaken(subscription)


def certificate_user(transport: asyncio.BaseTransport | None) -> str | None:
    """The CN of a verified client certificate (mutual TLS), or None."""
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


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


def _loop_has_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    """True when the loop implements sendfile natively (the stdlib loop; not uvloop)."""
    return type(loop).sendfile is not asyncio.AbstractEventLoop.sendfile and isinstance(
        loop, asyncio.BaseEventLoop
    )
