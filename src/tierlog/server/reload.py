"""SIGHUP: reload users, permissions and TLS certificates without a restart.

The configuration is read again from where it came from (the file, then ``TIERLOG_*``
variables) and validated whole before anything changes: a reload that fails (a file
that does not parse, a permission that is not a regex, a certificate that does not load
or does not match its key) changes nothing and logs why, and the server keeps serving
with the configuration it had. What a reload applies:

- ``[auth]`` (users, tokens, permissions, loopback users, admin hosts and origins): a new
  ``Authenticator`` replaces the old one (its verified-credential cache goes with it, so
  a changed or removed password stops working at once; the per-peer failure counts stay).
  Open connections of users that no longer exist are closed; the others are checked
  against the new permissions from their next command.
- ``[tls]`` certificate, key and CA files: loaded into the listeners' contexts, so new
  handshakes present the new certificate; open connections keep theirs.

Every other setting needs a restart; a reload that finds one changed says so in its log
line (``restart_needed``) and applies the rest.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterable
from dataclasses import fields

from tierlog.errors import ConfigError
from tierlog.logs import get_logger
from tierlog.server.admin_security import AdminGuard
from tierlog.server.config import ServerConfig, TlsSection
from tierlog.server.connection_core import ConnectionCore
from tierlog.server.limits import Gatekeeper, authenticator_for
from tierlog.server.tls import server_context

log = get_logger("tierlog.server.reload")

RELOADABLE_SECTIONS = ("auth", "tls")
_TLS_RELOADABLE = ("certfile", "keyfile", "cafile")


class ConfigReloader:
    """Applies a re-read configuration to a running server's gate, admin guard and TLS
    contexts (the pieces every new connection or request consults)."""

    def __init__(
        self,
        config: ServerConfig,
        load: Callable[[], ServerConfig],
        gate: Gatekeeper,
        guard: AdminGuard,
        tls_contexts: Iterable[ssl.SSLContext],
        connections: Callable[[], Iterable[ConnectionCore]],
    ) -> None:
        self.config = config
        self._load = load
        self._gate = gate
        self._guard = guard
        self._tls_contexts = list(tls_contexts)
        self._connections = connections
        self.reloads = 0
        self.failures = 0

    def reload(self) -> bool:
        """Read the configuration again and apply it; False (old one kept) on failure."""
        try:
            new = self._load()
            _check_tls(self.config.tls, new.tls)
            authenticator = authenticator_for(new)
        except (ConfigError, OSError, ssl.SSLError) as exc:
            self.failures += 1
            log.error("config_reload_failed", error=str(exc), kept="previous configuration")
            return False
        authenticator.limiter = self._gate.auth.limiter
        self._gate.auth = authenticator
        self._guard.auth_config = new.auth
        for context in self._tls_contexts:
            _load_certificates(context, new.tls)
        closed = self._close_removed_users(new)
        restart_needed = _restart_needed(self.config, new)
        self.config = new
        self.reloads += 1
        log.info(
            "config_reloaded",
            users=len(new.auth.users),
            tokens=len(new.auth.tokens),
            tls=new.tls.enabled,
            connections_closed=closed,
            restart_needed=",".join(restart_needed) or None,
        )
        return True

    def _close_removed_users(self, new: ServerConfig) -> int:
        """Close open connections of users the new configuration no longer has."""
        closed = 0
        for connection in list(self._connections()):
            if connection.user and connection.user not in new.auth.users:
                log.info("connection_closed", reason="user_removed", user=connection.user)
                connection.close_for_reload()
                closed += 1
        return closed


def _check_tls(old: TlsSection, new: TlsSection) -> None:
    """The new certificate, key and CA load (a context is built from them and thrown
    away); TLS cannot be switched on or off without a restart (no listener to add)."""
    if old.enabled != new.enabled:
        raise ConfigError("tls: enabling or disabling TLS needs a restart")
    server_context(new)


def _load_certificates(context: ssl.SSLContext, tls: TlsSection) -> None:
    """Load the (checked) certificate chain into a live context: handshakes from now on
    present it. A CA file's certificates are added to those trusted."""
    context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.cafile:
        context.load_verify_locations(cafile=tls.cafile)


def _restart_needed(old: ServerConfig, new: ServerConfig) -> list[str]:
    """Settings that differ but only take effect at the next start."""
    changed = []
    for f in fields(ServerConfig):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if f.name == "auth" or before == after:
            continue
        for item in fields(before):
            if f.name == "tls" and item.name in _TLS_RELOADABLE:
                continue
            if getattr(before, item.name) != getattr(after, item.name):
                changed.append(f"{f.name}.{item.name}")
    return changed
