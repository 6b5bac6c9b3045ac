"""Handshake commands: peer properties, SASL, tune, open, close, command versions.

Mixed into ``Connection``; methods run on the event loop with the connection as ``self``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time

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
    SUPPORTED_VERSIONS,
    Command,
    ResponseCode,
)
from tierlog.formats.protocol.errors import ProtocolError
from tierlog.logs import get_logger
from tierlog.server.connection_core import ConnectionCore

log = get_logger("tierlog.server.connection")

SERVER_PROPERTIES = {"product": "tierlog", "platform": "Python", "copyright": "tierlog authors"}


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
        versions = []
        for key in sorted(SUPPORTED_VERSIONS):
            low, high = SUPPORTED_VERSIONS[key]
            if key == Command.DELIVER:
                high = 1  # Deliver v2 is not sent (rstream accepts v1 only)
            versions.append(CommandVersion(int(key), low, high))
        self.send(
            ExchangeCommandVersionsResponse(cmd.correlation_id, ResponseCode.OK, versions).encode()
        )


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
