"""The MetaStore interface: versioned keys with epoch-checked conditional writes,
a durable on-delete cleanup queue, and leases.

It plays the role Khepri plays in the rabbitmq-stream-s3 design: per stream a
pointer ``{root uid, epoch}`` updated only by a conditional write that checks the
version and that the stored epoch is not newer than the writer's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from tierlog.storage.errors import InvalidKeyError

MAX_META_KEY_BYTES = 512
MAX_META_VALUE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Versioned:
    """A value as stored: ``version`` grows by at least one on every write."""

    key: str
    value: bytes
    version: int
    epoch: int


@dataclass(frozen=True, slots=True)
class CleanupItem:
    """A durable unit of work enqueued by ``delete(..., cleanup=...)``."""

    item_id: int
    queue: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    holder: str
    epoch: int  # strictly increases with every new acquisition of this lease name
    expires_at: float  # wall-clock seconds; advisory, the backend is the authority


def validate_meta_key(key: str) -> str:
    if not isinstance(key, str) or not key or len(key.encode()) > MAX_META_KEY_BYTES:
        raise InvalidKeyError(f"invalid metadata key {key!r}")
    if "\x00" in key or ".." in key.split("/"):
        raise InvalidKeyError(f"invalid metadata key {key!r}")
    return key


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
    def list(self, prefix: str) -> list[Versioned]:
        """All keys under ``prefix``, sorted by key."""

    # --- durable cleanup queue -------------------------------------------------
    @abstractmethod
    def enqueue(self, queue: str, payload: bytes) -> CleanupItem: ...

    @abstractmethod
    def pending(self, queue: str) -> list[CleanupItem]:
        """Items not yet completed, oldest first (scan this on start)."""

    @abstractmethod
    def complete(self, item: CleanupItem) -> None:
        """Remove a finished item (idempotent)."""

    @abstractmethod
    def wait_for_items(self, queue: str, timeout: float) -> bool:
        """Block until the queue may have new items or the timeout passes. A wake-up
        only: callers always re-scan ``pending``."""

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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def __enter__(self) -> MetaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
