"""Typed errors of the Spark data source (``tierlog.spark``)."""

from __future__ import annotations

from tierlog.errors import TierlogError


class SparkSourceError(TierlogError):
    """Base class of the Spark data source's errors."""


class OffsetExpiredError(SparkSourceError):
    """A streaming query's position is below the stream's first offset (retention)."""

    def __init__(self, stream: str, position: int, first_available: int) -> None:
        super().__init__(
            f"stream {stream!r}: offset {position} was removed by retention; the first "
            f"available offset is {first_available} (read with onExpired=skip to go on there)"
        )
        self.stream = stream
        self.position = position
        self.first_available = first_available


class StreamUnavailableError(SparkSourceError):
    """A stream named in the options does not exist (or was deleted while reading)."""
