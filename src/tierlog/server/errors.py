"""Errors of the server: why it could not start (each names what failed and the setting
behind it), and why a stream or a subscription's data cannot be served."""

from __future__ import annotations

from tierlog.errors import ConfigError, TierlogError


class StartupError(TierlogError):
    """The server could not start (the message says what and which setting)."""


class ListenError(StartupError):
    """A listening port could not be bound (in use, not permitted, bad address)."""


class StoreUnavailableError(StartupError):
    """The data directory, object store or MetaStore could not be opened or reached."""


class DataDirLockedError(ConfigError):
    """Another process holds the data directory."""


class SourceClosedError(TierlogError):
    """The stream behind a cursor was closed or deleted."""


class UnreadableDataError(TierlogError):
    """The data at the cursor's position does not validate (a CRC mismatch in a local chunk
    or a remote fragment) or vanished; it is never served and never skipped: the
    subscription ends and the consumer is told. ``kind`` names the tier ("local",
    "remote")."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class ReadOnlyNodeError(ConfigError):
    """A command that writes (create, delete, settings) sent to a read-only node: send it
    to a member of the stream."""


class AdminRequestError(TierlogError):
    """An admin API request made by the command line failed (unreachable node, refused
    credentials, or the server's answer, which the message carries)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class OffsetUnavailableError(TierlogError):
    """A consumer offset cannot be answered now without risking an answer lower than one
    given before: the stream's leader could not commit the chunk holding it (cut from its
    members, stepping down), or no leader answered and no newer value is pending in the
    MetaStore. QueryOffset answers STREAM_NOT_AVAILABLE; the client asks again."""
