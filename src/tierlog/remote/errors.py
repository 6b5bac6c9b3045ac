"""Errors of the remote tier's model: manifest lookups, manifest shape, deleted streams."""

from __future__ import annotations

from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.errors import UnknownKeyError


class RemoteTierError(TierlogError):
    """Base class of errors about a stream's remote tier."""


class StreamDeletedError(RemoteTierError):
    """The stream incarnation was deleted (its manifest pointer is gone)."""


class CorruptFragmentError(RemoteTierError):
    """The object under a fragment key is not a valid fragment, or not the one its key names."""


class ManifestTreeError(RemoteTierError):
    """Base class of manifest tree errors."""


class ManifestGapError(ManifestTreeError, ValueError):
    """Appended fragments leave a gap or overlap what the manifest already covers."""


class InvalidFragmentEntryError(ManifestTreeError, ValueError):
    """An appended fragment entry is malformed (counts, sizes, timestamps)."""


class ManifestCorruptError(ManifestTreeError):
    """A loaded node is valid bytes but contradicts the entry that points to it."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


class OffsetOutOfRangeError(ManifestTreeError, LookupError):
    """The offset is outside the manifest's ``[first, next)``."""


class OffsetOvertakenError(OffsetOutOfRangeError):
    """The offset is below the stream's first offset: retention removed it; never skipped
    silently. The one type for this in every tier (manifest lookups, the cross-tier reader,
    the server's cursors, the Spark streaming source, which adds how to go on).

    ``first_available`` is the stream's first offset now: re-attach there (or wherever the
    application decides) to go on.
    """

    def __init__(self, position: int, first_available: int, message: str = "") -> None:
        default = (
            f"offset {position} was removed by retention; the first available is {first_available}"
        )
        super().__init__(message or default)
        self.position = position
        self.first_available = first_available


class OffsetBeyondEndError(OffsetOutOfRangeError):
    """The offset is at or past the next offset: not in the remote tier (yet)."""


class CorruptPointerError(TierlogError):
    """A stream's manifest pointer in the MetaStore does not decode; rebuild it from the
    root objects in the store (``tierlog recover-pointers``)."""


class StreamExistsError(TierlogError):
    """A stream of that name already exists in the vhost."""


class StreamNotFoundError(TierlogError, KeyError):
    """No live stream of that name in the vhost."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "stream not found"


class MissingDictionaryError(CorruptFragmentError):
    """A fragment names a dictionary that is not in the object store."""


class SealingKeyMissingError(UnknownKeyError):
    """A stream asks for encryption and the process holds no key-encryption key."""


class KeyIndexManifestError(RemoteTierError):
    """The key-index manifest is damaged or cannot be committed."""


class KeyIndexFencedError(KeyIndexManifestError):
    """A writer of a higher epoch committed the key-index manifest."""


class AckModeError(ConfigError):
    """A stream's ack mode cannot be combined with its other settings (``segments``
    offload with ``ack = remote``: whole sealed segments reach the remote tier hours
    after a publish, so a confirm would wait that long)."""


class SuperStreamExistsError(StreamExistsError):
    """A super stream of that name already exists in the vhost (or is being created or
    deleted there): CreateSuperStream answers STREAM_ALREADY_EXISTS, as RabbitMQ does."""


class SuperStreamNotFoundError(StreamNotFoundError):
    """No super stream of that name in the vhost (none, or one still being created or
    deleted)."""
