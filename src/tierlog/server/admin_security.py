"""Authentication, authorisation and request-forgery checks for the admin API.

Every request must carry a ``Host`` the server answers to (a DNS-rebinding page has
the attacker's name there) and, when a browser sends one, an allowed ``Origin``
(a cross-origin page cannot forge writes). Writes must be ``application/json``, which a
plain HTML form cannot send without a CORS preflight the server never grants. Then
HTTP basic (the ``[auth]`` users) or a bearer token from ``auth.tokens``; failed
attempts are rate-limited per peer and slow password hashes run off the event loop.

Then the route's declared permission (``ROUTE_PERMISSIONS``, the one table of who may
call what, which docs/security.md lists and a test compares with the router): a route
that is not declared is refused (fail closed); node and cluster routes need the user
tag ``administrator``, never a stream pattern; a stream route needs its permission on
the stream named in the path, and a reserved stream name (``log/names.py``) is refused
whatever the user may do.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from tierlog.log.names import is_reserved
from tierlog.logs import get_logger
from tierlog.server.config import AuthSection
from tierlog.server.limits import Gatekeeper

log = get_logger("tierlog.server.admin")

DEFAULT_ADMIN_HOSTS = ("localhost", "127.0.0.1", "[::1]")
HEALTH_LIVE = "/api/health/live"
HEALTH_READY = "/api/health/ready"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})
USER_KEY = web.RequestKey("user", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC = "public"
"""No credentials, and no ``Host`` / ``Origin`` check (they guard requests that carry
credentials or change something): the health probes, which systemd and Kubernetes call by
the pod's address; ``GET`` only, they change nothing and name no stream."""
METRICS = "public while auth.metrics_public"
"""No credentials while ``auth.metrics_public`` (``/metrics``), else as ``USER``."""
USER = "user"
"""Any authenticated user (the route itself shows only what the user may see)."""
ADMINISTRATOR = "administrator"
"""The user tag ``administrator`` (``auth.tags``): nodes and the cluster."""
CONFIGURE, READ, READ_OR_CONFIGURE = "configure", "read", "read or configure"
"""Permissions on the stream the path names (``vhost`` query parameter, default ``/``);
``POST /api/streams`` checks ``configure`` on the name in its body."""
STREAM_ROUTE_PREFIX = "/api/streams/{name}"
SUPER_STREAM_ROUTE_PREFIX = "/api/super-streams/{name}"
"""Routes naming a super stream: checked like stream routes, against the super stream's
name (RabbitMQ checks its exchange); the handler checks the partitions too."""

ROUTE_PERMISSIONS: dict[tuple[str, str], str] = {
    ("GET", "/api/health"): USER,
    ("GET", HEALTH_LIVE): PUBLIC,
    ("GET", HEALTH_READY): PUBLIC,
    ("GET", "/api/streams"): USER,
    ("POST", "/api/streams"): CONFIGURE,
    ("GET", "/api/streams/{name}"): READ_OR_CONFIGURE,
    ("PATCH", "/api/streams/{name}"): CONFIGURE,
    ("DELETE", "/api/streams/{name}"): CONFIGURE,
    ("PUT", "/api/streams/{name}/offload"): CONFIGURE,
    ("GET", "/api/streams/{name}/offload"): READ_OR_CONFIGURE,
    ("GET", "/api/streams/{name}/messages"): READ,
    ("GET", "/api/streams/{name}/delayed"): READ_OR_CONFIGURE,
    ("POST", "/api/streams/{name}/delayed/cancel"): CONFIGURE,
    ("POST", "/api/streams/{name}/members"): CONFIGURE,
    ("GET", "/api/super-streams"): USER,
    ("POST", "/api/super-streams"): CONFIGURE,
    ("GET", "/api/super-streams/{name}"): READ_OR_CONFIGURE,
    ("DELETE", "/api/super-streams/{name}"): CONFIGURE,
    ("GET", "/api/cluster"): ADMINISTRATOR,
    ("GET", "/api/nodes"): ADMINISTRATOR,
    ("GET", "/api/nodes/{name}"): ADMINISTRATOR,
    ("POST", "/api/nodes/{name}/retire"): ADMINISTRATOR,
    ("DELETE", "/api/nodes/{name}/retire"): ADMINISTRATOR,
    ("GET", "/metrics"): METRICS,
}
"""Every admin route (method, path pattern) and what it needs (docs/security.md)."""


def route_key(request: web.Request) -> tuple[str, str] | None:
    """(method, path pattern) of the route the request matched; None when none did (the
    router answers 404 / 405). HEAD is GET's."""
    info = request.match_info
    if info.http_exception is not None:
        return None
    method = "GET" if request.method == "HEAD" else request.method
    return method, info.route.resource.canonical if info.route.resource else ""


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
        key = route_key(request)
        permission = ROUTE_PERMISSIONS.get(key) if key is not None else None
        if permission == PUBLIC:
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
        if permission == METRICS and self.auth_config.metrics_public:
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
        if key is not None:
            refused = self._route_refusal(request, key, permission)
            if refused is not None:
                return refused
        return await handler(request)

    def _route_refusal(
        self, request: web.Request, key: tuple[str, str], permission: str | None
    ) -> web.Response | None:
        """403 unless the user has the route's declared permission."""
        user = request[USER_KEY]
        if permission is None:  # a route nobody declared: refused until it is
            log.error("admin_route_undeclared", method=key[0], path=key[1])
            self.gate.refused("admin", "undeclared_route")
            return _json_error(403, f"{key[0]} {key[1]} has no declared permission")
        if permission == ADMINISTRATOR:
            if self.gate.auth.is_administrator(user):
                return None
            self.gate.refused("admin", ADMINISTRATOR)
            return _json_error(403, f"user {user!r} is not an administrator (auth.tags)")
        if not key[1].startswith((STREAM_ROUTE_PREFIX, SUPER_STREAM_ROUTE_PREFIX)):
            return None  # USER / METRICS, or checked on the body's name (POST ...)
        vhost, name = request.query.get("vhost", "/"), request.match_info["name"]
        if is_reserved(name):
            self.gate.refused("admin", "reserved_name")
            return _json_error(403, f"stream name {name!r} is reserved for the server")
        actions = ("read", "configure") if permission == READ_OR_CONFIGURE else (permission,)
        if any(self.may(request, vhost, a, name) for a in actions):
            return None
        self.gate.refused("admin", actions[0])
        return _json_error(403, f"user {user!r} may not {' or '.join(actions)} {name!r}")

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
