"""The server-wide gate every connection passes: authentication, connection counts.

One ``Gatekeeper`` per server holds the ``Authenticator`` (users, tokens, permissions,
verified-credential cache, per-peer failure limiter) and counts open connections in
total and per user, so a few clients cannot take every socket or file descriptor.
Per-connection limits (pre-auth frame size, handshake deadline, memory budget,
publishers and subscriptions) are read from ``limits`` by the connection itself; the
node-wide budget of decoded publishes (``PublishMemory``) lives here, shared by all.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from tierlog.metrics import Metrics
from tierlog.server.auth import Authenticator
from tierlog.server.config import LimitsSection, ServerConfig


def authenticator_for(config: ServerConfig) -> Authenticator:
    """The ``Authenticator`` of a configuration's ``[auth]`` (at start and on reload)."""
    a = config.auth
    return Authenticator(a.users, a.tokens, a.permissions, a.loopback_users, a.tags)


class MemoryWaiter(Protocol):
    """A connection that stopped reading because the node-wide budget was spent."""

    def memory_relieved(self) -> None: ...


class PublishMemory:
    """What decoded publishes hold across the node, by their estimated cost in memory
    (``PublishBatch.held_bytes``), not their size on the wire: a frame of tiny messages
    costs ~20x its wire size once decoded. Over ``limit`` every connection that reads a
    Publish stops reading; when the held total falls to half the limit, each waiting
    connection is told (it resumes if its own budget allows). What is held here always
    drains (the log writes it), so a waiting connection never waits forever; a client's
    unsent output counts against its own connection budget only, so clients that never
    read cannot spend the node's budget for everyone else."""

    __slots__ = ("limit", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiting: set[MemoryWaiter] = set()

    def over(self, divisor: int = 1) -> bool:
        return self.used > self.limit // divisor

    def hold(self, size: int) -> None:
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size
        if self.waiting and not self.over(2):
            waiting, self.waiting = self.waiting, set()
            for connection in waiting:
                connection.memory_relieved()


class Gatekeeper:
    """Authentication and connection accounting shared by the stream and admin listeners."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.auth = authenticator_for(config)
        self.limits: LimitsSection = config.limits
        self.metrics = metrics
        self.connections = 0
        self.per_user: Counter[str] = Counter()
        self.publish_memory = PublishMemory(config.limits.publish_memory_bytes)

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
