"""Typed errors of the local tier (``tierlog.log``)."""

from tierlog.errors import ConfigError, TierlogError


class LogError(TierlogError):
    """Base class of local-log errors."""


class InvalidStreamNameError(ConfigError):
    """A vhost, stream name or stream directory name could escape or is unusable."""


class NotAStreamError(LogError):
    """A path is not a stream directory (no segment/index files, or not a directory)."""


class StreamExistsError(LogError):
    """``create`` found the stream directory already present."""


class RecordTooLargeError(LogError, ValueError):
    """An entry exceeds the configured maximum; nothing of the batch was written."""


class InvalidAppendError(LogError, ValueError):
    """An append call is malformed (e.g. publishing ids do not match the entries)."""


class StaleEpochError(LogError):
    """The writer's epoch is lower than an epoch already on disk (a deposed writer)."""


class OffsetReuseError(LogError):
    """A restart would hand out offsets that are already used."""


class SegmentNotSealedError(LogError):
    """The operation needs a sealed segment but the segment is the active one."""


class CorruptChunkError(LogError):
    """A reader met a chunk whose bytes do not validate; it is never served."""


class ShortReadError(LogError, OSError):
    """A segment file held fewer bytes than the log's index promised (changed under us)."""


class LogClosedError(LogError):
    """The log or reader was closed."""


class BackPressureError(LogError):
    """Appends are refused for now: too much committed data is not yet tiered, or the
    disk is nearly full. Retryable: nothing was written; try again after
    ``retry_after`` seconds (the server throttles publishers instead of failing them)."""

    def __init__(self, message: str, retry_after: float = 0.1) -> None:
        super().__init__(message)
        self.retry_after = retry_after
