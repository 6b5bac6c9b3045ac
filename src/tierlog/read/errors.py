"""Typed errors of the cross-tier reader (``tierlog.read``)."""

from __future__ import annotations

from tierlog.errors import TierlogError


class ReadError(TierlogError):
    """Base class of cross-tier reader errors."""


class FragmentExpiredError(ReadError):
    """A fragment (or branch) the manifest named is gone (404): retention removed it after
    the reader looked it up. The reader re-checks the manifest; when its position is then
    below the first offset it raises ``OffsetOvertakenError`` instead. The Spark source
    raises it too (with ``message`` saying how to go on) for a fragment its plan named."""

    def __init__(self, key: str, message: str = "") -> None:
        super().__init__(
            message or f"remote object {key!r} expired (404 after the manifest named it)"
        )
        self.key = key


class RemoteDataCorruptError(ReadError):
    """Remote bytes do not validate (CRC, sizes, ids): they are never served."""


class OffsetUnavailableError(ReadError):
    """Neither tier holds an offset inside the stream's range (a broken invariant)."""


class ReadStrategyError(ReadError):
    """The stream's read strategy forbids serving an offset."""


class NotHeldLocallyError(ReadStrategyError):
    """Strategy ``DISABLE``: the offset is not held by the local tier."""

    def __init__(self, offset: int, local_first: int | None) -> None:
        where = "no local log" if local_first is None else f"local tier starts at {local_first}"
        super().__init__(f"offset {offset} is not held locally ({where}) and remote reads are off")
        self.offset = offset
        self.local_first = local_first
