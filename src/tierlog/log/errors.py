"""Typed errors of the local tier (``tierlog.log``)."""

from tierlog.errors import ConfigError, TierlogError


class LogError(TierlogError):
    """Base class of local-log errors."""


class InvalidStreamNameError(ConfigError):
    """A vhost, stream name or stream directory name could escape or is unusable."""


class ReservedNameError(InvalidStreamNameError):
    """A client named something with the server's internal prefix (``RESERVED_PREFIX`` in
    ``log/names.py``): a stream, super stream, partition, producer reference or consumer
    name. Such names belong to the server's own streams and producers; no permission grants
    them to a client."""

    def __init__(self, kind: str, name: str, prefix: str) -> None:
        super().__init__(f"{kind} {name!r} starts with the reserved prefix {prefix!r}")
        self.kind = kind
        self.name = name


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


class DamagedSegmentError(LogError):
    """Recovery found damage it may not cut: a sealed segment, or chunks inside the last
    segment followed by trustworthy ones. The stream is refused until the range is
    repaired from a healthy copy (remote tier) or an operator deals with the file, which
    is moved aside (never deleted). Offsets ``[first_offset, end_offset)`` of
    ``segment_path`` are affected (``end_offset`` None: up to the segment's end)."""

    def __init__(
        self,
        message: str,
        *,
        segment_path: str,
        segment_first_offset: int,
        position: int,
        first_offset: int,
        end_offset: int | None,
    ) -> None:
        super().__init__(message)
        self.segment_path = segment_path
        self.segment_first_offset = segment_first_offset
        self.position = position
        self.first_offset = first_offset
        self.end_offset = end_offset


class DamagedRangeError(LogError):
    """Offsets from ``first_offset`` on were lost: a chunk's own data was damaged on disk
    and no healthy copy existed, so opening cut the log before it (the damaged part is
    kept aside as ``*.damaged``). Reads positioned there and every append are refused:
    handing those offsets out again would show a consumer different messages at an
    offset it may already have seen. ``end_offset`` is where trustworthy chunks resumed
    in the damaged file, when known."""

    def __init__(self, message: str, *, first_offset: int, end_offset: int | None) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.end_offset = end_offset


class CorruptChunkError(LogError):
    """A reader met a chunk whose bytes do not validate; it is never served."""


class ShortReadError(LogError, OSError):
    """A segment file held fewer bytes than the log's index promised (changed under us)."""


class OffsetGapError(CorruptChunkError):
    """The local log jumps forward: offsets ``[missing_from, missing_to)`` are not in the
    local segment files (the log was restarted past the remote tail, or local retention
    freed them). A local reader never skips them: the cross-tier reader serves the gap
    from the remote tier; anyone else gets this error."""

    def __init__(self, message: str, missing_from: int, missing_to: int) -> None:
        super().__init__(message)
        self.missing_from = missing_from
        self.missing_to = missing_to


class SyncFailedError(LogError):
    """An fdatasync of the log failed: nothing after the last successful one is known to
    be durable, so the log accepts nothing more until it is reopened (recovery)."""


class LogClosedError(LogError):
    """The log or reader was closed."""


class BackPressureError(LogError):
    """Appends are refused for now: too much committed data is not yet tiered, or the
    disk is nearly full. Retryable: nothing was written; try again after
    ``retry_after`` seconds (the server throttles publishers instead of failing them)."""

    def __init__(self, message: str, retry_after: float = 0.1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AcceptError(LogError):
    """Replicated chunks (``StreamLog.accept_chunks``) were refused; nothing of the
    refused chunk or any chunk after it was written (chunks before it in the same call
    were, and ``next_offset`` says how far the log got)."""

    def __init__(self, message: str, next_offset: int) -> None:
        super().__init__(message)
        self.next_offset = next_offset


class ChunkGapError(AcceptError):
    """The first chunk starts after the log's next offset: chunks are missing."""


class ChunkOverlapError(AcceptError):
    """The first chunk starts before the log's next offset: the log already holds it."""


class BadChunkError(AcceptError):
    """A chunk's bytes do not validate (CRC, structure, header fields, cut short)."""


class OlderEpochChunkError(AcceptError):
    """A chunk's epoch is below the epoch of the log's last chunk: a deposed leader's."""


class LateJoinError(AcceptError):
    """An empty log was offered a first chunk past its next offset that is not a
    tracking snapshot: a late joiner starts only at a snapshot (tracking would be lost)."""


class TruncateBelowTieredError(LogError):
    """A truncation would cut chunks the remote tier already holds as durably
    committed: the cluster may never ask for that, so it is refused."""


class MemberEpochCorruptError(LogError):
    """The stream's persisted highest-seen epoch file does not decode; the member may not
    answer for the stream (it could accept a deposed leader) until an operator fixes it."""


class TruncationIntentError(LogError):
    """A pending truncation intent does not decode: the log cannot tell which suffix
    was being cut, so it is refused until an operator looks at it."""


class ChunkNotLocalError(LogError):
    """A fetch asked for a chunk id that is not a chunk of the local log (below its
    first offset, or not a chunk boundary)."""
