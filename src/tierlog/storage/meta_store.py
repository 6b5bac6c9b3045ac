"""The MetaStore interface: versioned keys with epoch-checked conditional writes,
a durable on-delete cleanup queue, and leases.

It plays the role Khepri plays in the rabbitmq-stream-s3 design: per stream a
pointer ``{root uid, epoch}`` updated only by a conditional write that checks the
version and that the stored epoch is not newer than the writer's.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from tierlog.errors import ConfigError
from tierlog.storage.errors import InvalidKeyError

if TYPE_CHECKING:
    from tierlog.storage.etcd_client import EtcdTls

MAX_META_KEY_BYTES = 512
MAX_META_VALUE_BYTES = 1 << 20
MAX_EPOCH = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Versioned:
    """A value as stored. ``version`` comes from a store-wide counter: it grows on every
    write and is never reused, even after the key is deleted and created again."""

    key: str
    value: bytes
    version: int
    epoch: int


@dataclass(frozen=True, slots=True)
class CleanupItem:
    """A durable unit of work enqueued by ``delete(..., cleanup=...)``."""

    item_id: int  # unique, larger for later items of the same store
    queue: str
    payload: bytes
    ref: str = field(default="", compare=False)  # backend handle used by ``complete``


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    holder: str
    epoch: int  # strictly increases with every new acquisition of this lease name
    expires_at: float  # wall-clock seconds; advisory, the backend is the authority
    token: int = field(default=0, compare=False)  # backend handle (the etcd lease id)


def validate_meta_key(key: str) -> str:
    """A key (also a queue or lease name): non-empty, at most 512 UTF-8 bytes, no NUL,
    no ``..`` segment, not absolute."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"invalid metadata key {key!r}: empty or not a string")
    _check_key_text(key, "key")
    if key.startswith("/"):
        raise InvalidKeyError(f"invalid metadata key {key!r}: absolute")
    return key


def validate_meta_prefix(prefix: str) -> str:
    """A ``list`` prefix: like a key, but may be empty (everything)."""
    if not isinstance(prefix, str):
        raise InvalidKeyError(f"invalid metadata prefix {prefix!r}: not a string")
    if prefix:
        _check_key_text(prefix, "prefix")
        if prefix.startswith("/"):
            raise InvalidKeyError(f"invalid metadata prefix {prefix!r}: absolute")
    return prefix


def _check_key_text(text: str, what: str) -> None:
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"invalid metadata {what} {text!r}: not UTF-8") from exc
    if size > MAX_META_KEY_BYTES:
        raise InvalidKeyError(f"invalid metadata {what}: {size} bytes > {MAX_META_KEY_BYTES}")
    if "\x00" in text or ".." in text.split("/"):
        raise InvalidKeyError(f"invalid metadata {what} {text!r}: NUL or '..' segment")


def validate_meta_value(value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidKeyError(f"metadata value must be bytes, not {type(value).__name__}")
    value = bytes(value)
    if len(value) > MAX_META_VALUE_BYTES:
        raise InvalidKeyError(f"metadata value of {len(value)} bytes > {MAX_META_VALUE_BYTES}")
    return value


def validate_epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
        raise InvalidKeyError(f"invalid epoch {epoch!r}: must be an int in [0, 2**63)")
    return epoch


def validate_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidKeyError(f"invalid version {version!r}: must be a positive int")
    return version


def validate_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86400:
        raise InvalidKeyError(f"invalid lease ttl {ttl!r}: must be in (0, 86400] seconds")
    return float(ttl)


class MetaStore(ABC):
    """Synchronous interface; the etcd backend runs its asyncio client on its own thread."""

    @abstractmethod
    def get(self, key: str) -> Versioned | None: ...

    @abstractmethod
    def create(self, key: str, value: bytes, epoch: int = 0) -> Versioned:
        """Create a key; raise ``AlreadyExistsError`` if present."""

    @abstractmethod
    def put_if(self, key: str, value: bytes, expected_version: int, epoch: int) -> Versioned:
        """Atomically: key exists (else ``KeyDeletedError``), version == expected
        (else ``VersionConflictError``), stored epoch <= epoch (else ``EpochFencedError``);
        then store value and epoch. Never re-creates a deleted key."""

    @abstractmethod
    def delete(
        self,
        key: str,
        expected_version: int | None = None,
        cleanup: tuple[str, bytes] | None = None,
    ) -> None:
        """Delete a key; if ``cleanup=(queue, payload)`` enqueue that item in the same
        transaction. Raise ``NotFoundError`` if missing, ``VersionConflictError`` on a
        version mismatch."""

    @abstractmethod
    def list(self, prefix: str) -> builtins.list[Versioned]:
        """All keys under ``prefix``, sorted by key."""

    # --- durable cleanup queue -------------------------------------------------
    @abstractmethod
    def enqueue(self, queue: str, payload: bytes) -> CleanupItem: ...

    @abstractmethod
    def pending(self, queue: str) -> builtins.list[CleanupItem]:
        """Items not yet completed, oldest first (scan this on start)."""

    @abstractmethod
    def complete(self, item: CleanupItem) -> None:
        """Remove a finished item (idempotent)."""

    @abstractmethod
    def wait_for_items(self, queue: str, timeout: float) -> bool:
        """Block until the queue may have items enqueued after this store's last
        ``pending(queue)`` scan, or the timeout passes (then False). A wake-up only:
        callers always re-scan ``pending``."""

    # --- leases ------------------------------------------------------------------
    @abstractmethod
    def acquire_lease(self, name: str, holder: str, ttl: float) -> Lease:
        """Take a free or expired lease (``LeaseHeldError`` otherwise); each new
        acquisition returns a larger epoch than any before for ``name``."""

    @abstractmethod
    def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a held lease; ``LeaseLostError`` if it expired or moved."""

    @abstractmethod
    def release_lease(self, lease: Lease) -> None: ...

    def read_lease(self, name: str) -> Lease | None:
        """The current holder of lease ``name`` if it is live, else None: lets other
        nodes judge liveness (e.g. of a leader's node lease) without taking the lease.
        An expired lease never comes back with the same epoch."""
        from tierlog.storage.errors import UnsupportedBackendError

        raise UnsupportedBackendError(f"{type(self).__name__} cannot read leases")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def __enter__(self) -> MetaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_meta_store(uri: str, **options: Any) -> MetaStore:
    """Open a MetaStore by URI: ``sqlite:///abs/path.db`` (the embedded default) or
    ``etcd://host:port/prefix``. Backends are imported lazily (etcd needs ``aetcd``)."""
    if not isinstance(uri, str):
        raise ConfigError(f"metadata store URI must be a string, not {type(uri).__name__}")
    parts = urlsplit(uri)
    if parts.scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/") or parts.query or parts.fragment:
            raise ConfigError(f"metadata store URI {uri!r}: expected sqlite:///absolute/path.db")
        from tierlog.storage.sqlite_meta_store import SqliteMetaStore

        return SqliteMetaStore(parts.path, **options)
    if parts.scheme == "etcd":
        try:
            host, port = parts.hostname, parts.port
        except ValueError as exc:
            raise ConfigError(f"metadata store URI {uri!r}: bad port") from exc
        if not host or port is None or parts.fragment:
            raise ConfigError(f"metadata store URI {uri!r}: expected etcd://host:port/prefix")
        prefix = parts.path.strip("/") or "tierlog"
        try:
            validate_meta_key(prefix)
        except InvalidKeyError as exc:
            raise ConfigError(f"metadata store URI {uri!r}: bad prefix: {exc}") from exc
        if parts.username is not None:
            options.setdefault("username", unquote(parts.username))
            options.setdefault("password", unquote(parts.password or ""))
        from tierlog.storage.etcd_meta_store import EtcdMetaStore

        tls = _etcd_tls(uri, parts.query)
        if tls is not None:
            options.setdefault("tls", tls)
        return EtcdMetaStore(host, port, prefix, **options)
    raise ConfigError(f"metadata store URI {uri!r}: scheme must be sqlite or etcd")


ETCD_URI_PARAMETERS = ("cacert", "cert", "key")
"""Query parameters of an ``etcd://`` URI: TLS to etcd (``cacert``: the CA of etcd's
server certificate; ``cert`` + ``key``: a client certificate), named as etcdctl names
its flags. User and password go in the URI's user part."""


def _etcd_tls(uri: str, query: str) -> EtcdTls | None:
    from tierlog.storage.etcd_client import EtcdTls

    values: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if name not in ETCD_URI_PARAMETERS:
            raise ConfigError(
                f"metadata store URI {uri!r}: unknown parameter {name!r}"
                f" (known: {', '.join(ETCD_URI_PARAMETERS)})"
            )
        if name in values:
            raise ConfigError(f"metadata store URI {uri!r}: {name!r} given twice")
        values[name] = value
    if not values:
        return None
    if "cacert" not in values:
        raise ConfigError(f"metadata store URI {uri!r}: TLS to etcd needs cacert=")
    if ("cert" in values) != ("key" in values):
        raise ConfigError(f"metadata store URI {uri!r}: cert= and key= go together")
    return EtcdTls(values["cacert"], values.get("cert", ""), values.get("key", ""))
