"""The server-wide gate every connection passes: authentication, connection counts.

One ``Gatekeeper`` per server holds the ``Authenticator`` (users, tokens, permissions,
verified-credential cache, per-peer failure limiter) and counts open connections in
total and per user, so a few clients cannot take every socket or file descriptor.
Per-connection limits (pre-auth frame size, handshake deadline, memory budget,
publishers and subscriptions) are read from ``limits`` by the connection itself.
"""

from __future__ import annotations

from collections import Counter

from tierlog.metrics import Metrics
from tierlog.server.auth import Authenticator
from tierlog.server.config import LimitsSection, ServerConfig


class Gatekeeper:
    """Authentication and connection accounting shared by the stream and admin listeners."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        a = config.auth
        self.auth = Authenticator(a.users, a.tokens, a.permissions, a.loopback_users, a.tags)
        self.limits: LimitsSection = config.limits
        self.metrics = metrics
        self.connections = 0
        self.per_user: Counter[str] = Counter()

    def admit_connection(self) -> bool:
        if self.connections >= self.limits.max_connections:
            self.metrics.limits_hit.labels(limit="max_connections").inc()
            return False
        self.connections += 1
        return True

    def release_connection(self) -> None:
        self.connections -= 1

    def admit_user(self, user: str) -> bool:
        if self.per_user[user] >= self.limits.max_connections_per_user:
            self.metrics.limits_hit.labels(limit="max_connections_per_user").inc()
            return False
        self.per_user[user] += 1
        return True

    def release_user(self, user: str) -> None:
        self.per_user[user] -= 1
        if self.per_user[user] <= 0:
            del self.per_user[user]

    def refused(self, interface: str, action: str) -> None:
        """Count one request refused by authorisation."""
        self.metrics.access_refused.labels(interface=interface, action=action).inc()
