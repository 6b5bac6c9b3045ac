"""Why a server could not start: each names what failed and the setting behind it."""

from __future__ import annotations

from tierlog.errors import TierlogError


class StartupError(TierlogError):
    """The server could not start (the message says what and which setting)."""


class ListenError(StartupError):
    """A listening port could not be bound (in use, not permitted, bad address)."""


class StoreUnavailableError(StartupError):
    """The data directory, object store or MetaStore could not be opened or reached."""
