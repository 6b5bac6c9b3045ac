"""Typed errors of segment offload (``tierlog.offload``)."""

from __future__ import annotations

from tierlog.errors import TierlogError


class OffloadError(TierlogError):
    """Base class of segment offload errors."""


class OffloadSourceError(OffloadError):
    """The local segment cannot be offloaded as it is: not sealed (bytes after the last
    indexed chunk), an index that disagrees with the chunks, or a chunk whose CRC fails."""


class OffloadedDataCorruptError(OffloadError):
    """Offloaded bytes (index object or block data) do not validate: never served."""


class OffloadNotFoundError(OffloadError):
    """The objects of an offload (segment, attempt uuid) do not exist (deleted, or never
    completed)."""


class AttemptExistsError(OffloadError):
    """An offload attempt with this uuid is already recorded for the segment."""


class OffloadRunningError(OffloadError):
    """An offload requested by an operator is still running (the admin API answers 409)."""
