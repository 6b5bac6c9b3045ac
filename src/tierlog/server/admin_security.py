"""Authentication, authorisation and request-forgery checks for the admin API.

Every request must carry a ``Host`` the server answers to (a DNS-rebinding page has
the attacker's name there) and, when a browser sends one, an allowed ``Origin``
(a cross-origin page cannot forge writes). Writes must be ``application/json``, which a
plain HTML form cannot send without a CORS preflight the server never grants. Then
HTTP basic (the ``[auth]`` users) or a bearer token from ``auth.tokens``; failed
attempts are rate-limited per peer and slow password hashes run off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from tierlog.logs import get_logger
from tierlog.server.config import AuthSection
from tierlog.server.limits import Gatekeeper

log = get_logger("tierlog.server.admin")

DEFAULT_ADMIN_HOSTS = ("localhost", "127.0.0.1", "[::1]")
HEALTH_LIVE = "/api/health/live"
HEALTH_READY = "/api/health/ready"
PROBES = frozenset({HEALTH_LIVE, HEALTH_READY})
"""Served to anyone (systemd, Kubernetes probes call them by the pod's address, with no
credentials): ``GET`` only, they change nothing and name no stream."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})
USER_KEY = web.RequestKey("user", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class AdminGuard:
    """The admin API's request checks, as an aiohttp middleware."""

    def __init__(self, auth: AuthSection, gate: Gatekeeper) -> None:
        self.auth_config = auth
        self.gate = gate
        self.port = 0
        """The bound admin port (set after listening): default Host names carry it."""
        self.scheme = "http"

    def host_allowed(self, host: str) -> bool:
        if self.auth_config.admin_hosts:
            allowed = self.auth_config.admin_hosts
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            return host in allowed or name in allowed
        return host in DEFAULT_ADMIN_HOSTS or any(
            host == f"{name}:{self.port}" for name in DEFAULT_ADMIN_HOSTS
        )

    def origin_allowed(self, origin: str) -> bool:
        if self.auth_config.admin_origins:
            return origin in self.auth_config.admin_origins
        scheme, sep, host = origin.partition("://")
        return bool(sep) and scheme == self.scheme and self.host_allowed(host)

    async def _user(self, request: web.Request, only_verified: bool = False) -> str | None:
        """The authenticated user, or None. ``only_verified``: accept only credentials
        verified before (no hashing for a peer over its failure limit)."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        value = value.strip()
        auth = self.gate.auth
        if scheme.lower() == "bearer" and value:
            return auth.verified_token(value) if only_verified else auth.check_token(value)
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if not sep:
            return None
        if only_verified:
            return user if auth.is_verified(user, password) else None
        if auth.needs_slow_check(user, password):
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(None, auth.check_password, user, password)
        else:
            ok = auth.check_password(user, password)
        return user if ok else None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBES and request.method in ("GET", "HEAD"):
            return await handler(request)
        host = request.headers.get("Host", "")
        if not self.host_allowed(host):
            self.gate.refused("admin", "host")
            return _json_error(421, "unknown Host")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            self.gate.refused("admin", "origin")
            return _json_error(403, "cross-origin requests are refused")
        if request.method in WRITE_METHODS and request.content_type != "application/json":
            return _json_error(415, "writes must be application/json")
        if request.path == "/metrics" and self.auth_config.metrics_public:
            return await handler(request)
        peer = request.remote or ""
        limiter = self.gate.auth.limiter
        blocked = limiter.blocked(peer)
        user = await self._user(request, only_verified=blocked)
        if user is None and blocked:
            return _json_error(429, "too many failed attempts", {"Retry-After": "60"})
        if user is None:
            limiter.failed(peer)
            self.gate.metrics.auth_failures.inc()
            log.warning("admin_auth_failed", peer=peer)
            challenge = {"WWW-Authenticate": 'Basic realm="tierlog"'}
            return _json_error(401, "authentication required", challenge)
        request[USER_KEY] = user
        return await handler(request)

    def require(self, request: web.Request, vhost: str, action: str, stream: str) -> None:
        """Raise 403 unless the request's user may do ``action`` on ``stream``."""
        user = request.get(USER_KEY, "")
        if not self.gate.auth.allowed(user, vhost, action, stream):
            self.gate.refused("admin", action)
            raise web.HTTPForbidden(
                text=json.dumps({"error": f"user {user!r} may not {action} {stream!r}"}),
                content_type="application/json",
            )

    def may(self, request: web.Request, vhost: str, action: str, stream: str) -> bool:
        return self.gate.auth.allowed(request.get(USER_KEY, ""), vhost, action, stream)
