"""Errors that stop tiering a stream."""

from __future__ import annotations

from tierlog.errors import TierlogError


class TieringError(TierlogError):
    """Base class of errors that stop tiering a stream."""


class FragmentConflictError(TieringError):
    """A remote fragment exists that this writer must not adopt."""


class DeposedError(TieringError):
    """A writer with a newer epoch owns the stream: stop tiering it."""
