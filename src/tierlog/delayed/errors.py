"""Typed errors of delayed delivery (``tierlog.delayed``)."""

from tierlog.errors import TierlogError


class DelayedError(TierlogError):
    """Base class of delayed-delivery errors."""


class DelayPropertyError(DelayedError):
    """``x-delay`` / ``x-deliver-at`` is present but not a usable time (not an integer,
    negative ``x-deliver-at``, beyond the longest delay); the message is refused."""


class ScheduledInSubBatchError(DelayedError):
    """A message inside a compressed sub-batch carries a delay property: the server does
    not open sub-batches on the publish path, so it refuses the whole entry."""


class SystemRecordError(DelayedError):
    """A record of the system stream, a working-set record or a timer object does not
    decode (wrong magic, truncated, CRC mismatch)."""


class ForeignRecordError(SystemRecordError):
    """A record offered to (or found in) a system stream is not one a system stream holds
    (SCHEDULE, DISPATCH or CANCEL): refused at intake; one found anyway (a restored or
    damaged file) is skipped, logged and counted by the scheduler, never a stall."""


class TimerManifestError(DelayedError):
    """The timer manifest in the MetaStore does not decode."""


class NotScheduledError(DelayedError, KeyError):
    """Cancel named a message that is not scheduled (never accepted, already delivered or
    already cancelled)."""


class SchedulerStoppedError(DelayedError):
    """The scheduler of the stream is not running (stream closing, or not this node's)."""
