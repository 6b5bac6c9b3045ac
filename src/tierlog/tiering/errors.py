"""Errors that stop tiering a stream."""

from __future__ import annotations

from tierlog.errors import TierlogError


class TieringError(TierlogError):
    """Base class of errors that stop tiering a stream."""


class FragmentConflictError(TieringError):
    """A remote fragment exists that this writer must not adopt."""


class DeposedError(TieringError):
    """A writer with a newer epoch owns the stream: stop tiering it."""


class LocalChunkCorruptError(FragmentConflictError):
    """A chunk cut into a fragment fails its CRC check: the fragment is not uploaded and
    tiering of the stream halts (alarm) instead of making bit rot the remote copy."""


class CommitRetryError(TieringError):
    """The commit did not happen but may be retried (transient error, lost race)."""


class EncryptionKeyMissingError(TieringError):
    """The stream is encrypted and this process holds no key-encryption key."""
