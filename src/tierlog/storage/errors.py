"""Typed errors of the outside stores (object store and metadata store)."""

from tierlog.errors import TierlogError


class StorageError(TierlogError):
    """Base class of object-store and metadata-store errors."""


class InvalidKeyError(StorageError, ValueError):
    """A key is empty, too long, absolute, or could escape its namespace."""


class NotFoundError(StorageError, KeyError):
    """The object or key does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text
        return str(self.args[0]) if self.args else "not found"


class AlreadyExistsError(StorageError):
    """A create-only write found the key already present."""


class PreconditionFailedError(StorageError):
    """A conditional operation's precondition did not hold."""


class TransientError(StorageError):
    """A failure that may succeed if retried (timeouts, throttling, 5xx).

    ``kind`` names what failed (``throttled``, ``server_error``, ``connection``, ``timeout``,
    ``incomplete_body``, ``io``) for retry warnings and metrics; empty = unknown."""

    def __init__(self, *args: object, kind: str = "") -> None:
        super().__init__(*args)
        self.kind = kind


class PermanentError(StorageError):
    """A failure that will not go away by retrying (auth, bad bucket, bad request)."""


class UnsupportedBackendError(StorageError):
    """The backend lacks a guarantee tierlog needs (e.g. S3 without If-None-Match)."""


class VersionConflictError(PreconditionFailedError):
    """MetaStore: the key's version is not the one the writer expected."""


class EpochFencedError(PreconditionFailedError):
    """MetaStore: the stored epoch is newer than the writer's: the writer was deposed."""


class KeyDeletedError(PreconditionFailedError):
    """MetaStore: a conditional put found the key deleted; it is never re-created."""


class LeaseHeldError(StorageError):
    """MetaStore: the lease is held by another holder."""


class LeaseLostError(StorageError):
    """MetaStore: the lease expired or was taken over; the holder must stop."""


class InvalidRangeError(StorageError, ValueError):
    """A byte range or part number that can never be valid (negative, out of bounds)."""


class InvalidMetadataError(StorageError, ValueError):
    """User metadata that S3 would reject or alter (case, characters, size)."""


class StoreStartupTimeoutError(StorageError):
    """A store stayed unusable, failing transiently, for the whole start-up deadline."""
