"""Who may connect, and what each user may do: users, passwords, tokens, permissions.

Passwords in the config are either plain text or ``scrypt$N$r$p$salt$hash`` (base64
salt and hash; ``python -m tierlog.server.auth PASSWORD`` prints one). A slow hash on
two cores is a denial-of-service lever, so a verified credential is remembered (a
bounded LRU keyed by the SHA-256 of user and password, never the password itself) and
failed attempts are rate-limited per peer address.

Permissions have RabbitMQ's shape: per user and vhost, three regular expressions on
stream names — ``configure`` (create / delete / change a stream), ``write`` (publish)
and ``read`` (subscribe, offsets, stats). A user without a ``permissions`` entry has
full access to the default vhost ``/`` only, the way RabbitMQ sets up ``guest``.

Node and cluster administration (the admin API's ``/api/nodes`` and ``/api/cluster``
routes) is no stream's business: it needs the user tag ``administrator`` (RabbitMQ's
tag of the same name), never a stream pattern. Without an ``auth.tags`` table, ``guest``
(when it is a user) is the administrator, as in RabbitMQ's default set-up.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from tierlog.errors import ConfigError

ACTIONS = ("configure", "write", "read")
ADMINISTRATOR = "administrator"
TAGS = (ADMINISTRATOR,)
"""The user tags tierlog acts on (another RabbitMQ tag would be accepted and do nothing:
it is refused at load instead)."""
DEFAULT_ADMINISTRATOR = "guest"
DEFAULT_VHOST = "/"
SCRYPT_PREFIX = "scrypt$"
SHA256_PREFIX = "sha256$"
CACHE_ENTRIES = 1024
FAILURES_ALLOWED = 10
FAILURE_WINDOW_S = 60.0
TRACKED_PEERS = 10_000


@dataclass(frozen=True, slots=True)
class VhostPermission:
    """The three stream-name patterns of one user in one vhost (full match)."""

    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]

    def allows(self, action: str, stream: str) -> bool:
        pattern: re.Pattern[str] = getattr(self, action)
        return pattern.fullmatch(stream) is not None


FULL_ACCESS = VhostPermission(re.compile(".*"), re.compile(".*"), re.compile(".*"))
PermissionTable = Mapping[str, Mapping[str, VhostPermission]]


def parse_permissions(value: object, where: str = "auth.permissions") -> PermissionTable:
    """``{user: {vhost: {configure, write, read}}}`` from TOML; patterns compiled."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table of user = {{vhost = {{...}}}}")
    table: dict[str, dict[str, VhostPermission]] = {}
    for user, vhosts in value.items():
        if not isinstance(vhosts, Mapping):
            raise ConfigError(f"{where}.{user} must be a table of vhost = {{...}}")
        table[str(user)] = {}
        for vhost, perms in vhosts.items():
            if not isinstance(perms, Mapping) or set(perms) - set(ACTIONS):
                raise ConfigError(
                    f"{where}.{user}.{vhost!r} must be a table with configure, write, read"
                )
            compiled = []
            for action in ACTIONS:
                pattern = perms.get(action, "")
                if not isinstance(pattern, str):
                    raise ConfigError(f"{where}.{user}.{vhost!r}.{action} must be a string")
                try:
                    # an empty pattern grants nothing (as in RabbitMQ)
                    compiled.append(re.compile(pattern if pattern else "(?!)"))
                except re.error as exc:
                    raise ConfigError(
                        f"{where}.{user}.{vhost!r}.{action} is not a valid regex: {exc}"
                    ) from None
            table[str(user)][str(vhost)] = VhostPermission(*compiled)
    return table


UserTags = Mapping[str, tuple[str, ...]]


def parse_tags(value: object, where: str = "auth.tags") -> UserTags:
    """``{user: [tag, ...]}`` (or ``{user: "tag"}``) from TOML, or ``"user:tag,user:tag"``
    from the environment; every tag must be one of ``TAGS``."""
    pairs: list[tuple[str, object]]
    if isinstance(value, str):
        pairs = []
        for item in (p.strip() for p in value.split(",")):
            user, sep, tag = item.partition(":")
            if not item:
                continue
            if not sep or not user.strip():
                raise ConfigError(f"{where} must look like 'user:administrator,user2:...'")
            pairs.append((user.strip(), tag.strip()))
    elif isinstance(value, Mapping):
        pairs = [(str(u), t) for u, t in value.items()]
    else:
        raise ConfigError(f"{where} must be a table of user = [tags]")
    table: dict[str, tuple[str, ...]] = {}
    for user, tags in pairs:
        listed = [tags] if isinstance(tags, str) else tags
        if not isinstance(listed, list | tuple) or not all(isinstance(t, str) for t in listed):
            raise ConfigError(f"{where}.{user} must be a list of tags")
        for tag in listed:
            if tag not in TAGS:
                raise ConfigError(f"{where}.{user}: unknown tag {tag!r} (known: {', '.join(TAGS)})")
        table[user] = tuple(dict.fromkeys((*table.get(user, ()), *listed)))
    return table


def default_tags(users: Mapping[str, str]) -> UserTags:
    """Without ``auth.tags``: ``guest``, when it is a user, is the administrator."""
    return {DEFAULT_ADMINISTRATOR: (ADMINISTRATOR,)} if DEFAULT_ADMINISTRATOR in users else {}


def hash_password(password: str, *, n: int = 2**14, r: int = 8, p: int = 1) -> str:
    """The ``scrypt$N$r$p$salt$hash`` form of a password for the config file."""
    import os

    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=32)
    b64 = base64.b64encode
    return f"scrypt${n}${r}${p}${b64(salt).decode()}${b64(digest).decode()}"


def check_stored_secret(stored: str, where: str) -> None:
    """Reject a malformed hashed password at config load, not at first login."""
    if stored.startswith(SCRYPT_PREFIX):
        parts = stored.split("$")
        try:
            _, n, r, p, salt, digest = parts
            int(n), int(r), int(p)
            base64.b64decode(salt, validate=True), base64.b64decode(digest, validate=True)
        except ValueError:
            want = "scrypt$N$r$p$salt$hash"
            raise ConfigError(f"{where}: malformed scrypt hash (want {want})") from None
    elif stored.startswith(SHA256_PREFIX) and not re.fullmatch(
        r"[0-9a-fA-F]{64}", stored[len(SHA256_PREFIX) :]
    ):
        raise ConfigError(f"{where}: malformed sha256 hash (want sha256$<64 hex digits>)")


def secret_matches(stored: str, presented: str) -> bool:
    """Constant-time comparison of a presented secret with its stored (maybe hashed) form."""
    data = presented.encode("utf-8")
    if stored.startswith(SCRYPT_PREFIX):
        _, n, r, p, salt_b64, digest_b64 = stored.split("$")
        expected = base64.b64decode(digest_b64)
        actual = hashlib.scrypt(
            data,
            salt=base64.b64decode(salt_b64),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=256 * 1024 * 1024,
        )
        return hmac.compare_digest(expected, actual)
    if stored.startswith(SHA256_PREFIX):
        expected_hex = stored[len(SHA256_PREFIX) :].lower()
        return hmac.compare_digest(expected_hex, hashlib.sha256(data).hexdigest())
    return hmac.compare_digest(stored.encode("utf-8"), data)


class FailureLimiter:
    """At most ``allowed`` failed attempts per peer within ``window`` seconds."""

    def __init__(
        self,
        allowed: int = FAILURES_ALLOWED,
        window: float = FAILURE_WINDOW_S,
        max_peers: int = TRACKED_PEERS,
    ) -> None:
        self.allowed = allowed
        self.window = window
        self.max_peers = max_peers
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def blocked(self, peer: str) -> bool:
        times = self._failures.get(peer)
        if times is None:
            return False
        cutoff = time.monotonic() - self.window
        while times and times[0] < cutoff:
            times.popleft()
        if not times:
            del self._failures[peer]
            return False
        return len(times) >= self.allowed

    def failed(self, peer: str) -> None:
        times = self._failures.get(peer)
        if times is None:
            times = self._failures[peer] = deque(maxlen=self.allowed)
            while len(self._failures) > self.max_peers:
                self._failures.popitem(last=False)
        else:
            self._failures.move_to_end(peer)
        times.append(time.monotonic())


class Authenticator:
    """Checks users' passwords and bearer tokens; remembers what it has verified."""

    def __init__(
        self,
        users: Mapping[str, str],
        tokens: Mapping[str, str] | None = None,
        permissions: PermissionTable | None = None,
        loopback_users: tuple[str, ...] = (),
        tags: UserTags | None = None,
    ) -> None:
        self.users = dict(users)
        self.tokens = dict(tokens or {})
        self.permissions = permissions or {}
        self.tags = dict(default_tags(self.users) if tags is None else tags)
        self.loopback_users = loopback_users
        self.limiter = FailureLimiter()
        self._verified: OrderedDict[bytes, str] = OrderedDict()

    # ----------------------------------------------------------------- authentication

    def _cached(self, key: bytes) -> str | None:
        user = self._verified.get(key)
        if user is not None:
            self._verified.move_to_end(key)
        return user

    def _remember(self, key: bytes, user: str) -> None:
        self._verified[key] = user
        while len(self._verified) > CACHE_ENTRIES:
            self._verified.popitem(last=False)

    def is_verified(self, user: str, password: str) -> bool:
        """True when this exact credential was verified before (cached; cheap).

        A peer over its failure limit may still use credentials that already worked,
        so one misbehaving client does not lock out every other client at its address.
        """
        return self._cached(_key(b"user", user, password)) == user

    def needs_slow_check(self, user: str, password: str) -> bool:
        """True when verifying would compute a slow hash (not yet cached)."""
        stored = self.users.get(user, "")
        if not stored.startswith(SCRYPT_PREFIX):
            return False
        return self._cached(_key(b"user", user, password)) is None

    def check_password(self, user: str, password: str) -> bool:
        """True when ``password`` is ``user``'s; successes are cached."""
        key = _key(b"user", user, password)
        if self._cached(key) == user:
            return True
        stored = self.users.get(user)
        if stored is None or not secret_matches(stored, password):
            return False
        self._remember(key, user)
        return True

    def verified_token(self, token: str) -> str | None:
        """The user of a token verified before (cached), or None."""
        return self._cached(_key(b"token", "", token))

    def check_token(self, token: str) -> str | None:
        """The user a bearer token stands for, or None."""
        key = _key(b"token", "", token)
        cached = self._cached(key)
        if cached is not None:
            return cached
        for stored, user in self.tokens.items():
            if secret_matches(stored, token):
                self._remember(key, user)
                return user
        return None

    # ----------------------------------------------------------------- authorisation

    def vhost_permission(self, user: str, vhost: str) -> VhostPermission | None:
        """The user's permissions in ``vhost``; None = no access to that vhost."""
        table = self.permissions.get(user)
        if table is None:
            return FULL_ACCESS if vhost == DEFAULT_VHOST else None
        return table.get(vhost)

    def allowed(self, user: str, vhost: str, action: str, stream: str) -> bool:
        permission = self.vhost_permission(user, vhost)
        return permission is not None and permission.allows(action, stream)

    def is_administrator(self, user: str) -> bool:
        """May ``user`` administer nodes and the cluster (the ``administrator`` tag)?"""
        return user in self.users and ADMINISTRATOR in self.tags.get(user, ())


def _key(kind: bytes, user: str, secret: str) -> bytes:
    return hashlib.sha256(
        kind + b"\0" + user.encode("utf-8") + b"\0" + secret.encode("utf-8")
    ).digest()


def main(argv: list[str]) -> int:
    """Print the scrypt form of the password given as the only argument."""
    if len(argv) != 1:
        print("usage: python -m tierlog.server.auth PASSWORD", file=sys.stderr)
        return 2
    print(hash_password(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
