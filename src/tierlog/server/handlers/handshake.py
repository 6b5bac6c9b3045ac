"""Handshake commands: peer properties, SASL, tune, open, close, command versions.

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time

from tierlog import __version__
from tierlog.formats.protocol.commands import (
    CloseRequest,
    CommandVersion,
    ExchangeCommandVersionsRequest,
    ExchangeCommandVersionsResponse,
    Heartbeat,
    OpenRequest,
    OpenResponse,
    PeerPropertiesRequest,
    PeerPropertiesResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    SimpleResponse,
    Tune,
    UnknownCommand,
    plain_credentials,
)
from tierlog.formats.protocol.constants import (
    Command,
    ResponseCode,
)
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.logs import get_logger
from tierlog.server.connection_core import ConnectionCore

log = get_logger("tierlog.server.connection")

RABBITMQ_COMPATIBILITY_VERSION = "3.10.0"
"""The ``version`` PeerProperties announces: the RabbitMQ release whose stream features
tierlog offers, because clients switch features on by this number instead of asking.
The Node.js client (rabbitmq-stream-js-client) crashes without it and, from 3.13.0 on,
turns on filtering (Publish v2 with filter values, ``filter.N`` subscriptions), asks for
Deliver v2 and sends CreateSuperStream/DeleteSuperStream; the Go client turns on single
active consumer from 3.11.0. tierlog filters (Publish v2 is advertised) but has no SAC,
super streams or Deliver v2 yet, so it announces 3.10.0 (the
last release before SAC and super streams): those clients then refuse SAC, filtering and
super-stream management themselves with a clear error instead of meeting a server that
ignores them. Raise it to 3.11.0 once SAC and super streams (Route, Partitions) work,
and to 3.13.0 once CreateSuperStream/DeleteSuperStream and Deliver v2 do.
``tierlog_version`` carries tierlog's own version. See docs/compatibility.md."""

SERVER_PROPERTIES = {
    "product": "tierlog",
    "version": RABBITMQ_COMPATIBILITY_VERSION,
    "tierlog_version": __version__,
    "platform": "Python",
    "copyright": "tierlog authors",
}

ADVERTISED_COMMAND_VERSIONS: tuple[tuple[Command, int, int], ...] = (
    (Command.DECLARE_PUBLISHER, 1, 1),
    (Command.PUBLISH, 1, 2),
    (Command.QUERY_PUBLISHER_SEQUENCE, 1, 1),
    (Command.DELETE_PUBLISHER, 1, 1),
    (Command.SUBSCRIBE, 1, 1),
    (Command.CREDIT, 1, 1),
    (Command.STORE_OFFSET, 1, 1),
    (Command.QUERY_OFFSET, 1, 1),
    (Command.UNSUBSCRIBE, 1, 1),
    (Command.CREATE, 1, 1),
    (Command.DELETE, 1, 1),
    (Command.METADATA, 1, 1),
    (Command.CLOSE, 1, 1),
    (Command.HEARTBEAT, 1, 1),
    (Command.ROUTE, 1, 1),
    (Command.PARTITIONS, 1, 1),
    (Command.STREAM_STATS, 1, 1),
    (Command.CREATE_SUPER_STREAM, 1, 1),
    (Command.DELETE_SUPER_STREAM, 1, 1),
)
"""The ExchangeCommandVersions answer: (key, min, max) of every client command this server
serves, in key order like RabbitMQ's (rabbit_stream_utils:command_versions/0, which also
leaves out the handshake commands, that run before this exchange can, and the commands
only a server sends). It must start at key 1 with Publish second: rstream sends only
``(Publish, 1, 2)`` and reads the answer at index ``key - 1``. Publish goes up to version
2 (filter values build the chunks' bloom filters: rstream and the Go client turn filtering
on from this entry, as with RabbitMQ). Not listed, because they do not work yet:
ResolveOffsetSpec (answered UNKNOWN_FRAME) and Deliver v2 (tierlog sends Deliver v1 only;
rstream accepts nothing else)."""


class HandshakeHandlers(ConnectionCore):
    """Commands that set a connection up and take it down."""

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
        if user in self.gate.auth.loopback_users and not is_loopback(self.peer_host):
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

    def _on_exchange_versions(self, cmd: ExchangeCommandVersionsRequest) -> None:
        self.send(exchange_versions_answer(cmd.correlation_id))


def exchange_versions_answer(correlation_id: int) -> bytes:
    """The whole ExchangeCommandVersions response frame (whatever the client listed:
    RabbitMQ answers with its own list too)."""
    versions = [
        CommandVersion(int(key), low, high) for key, low, high in ADVERTISED_COMMAND_VERSIONS
    ]
    return ExchangeCommandVersionsResponse(correlation_id, ResponseCode.OK, versions).encode()


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


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
