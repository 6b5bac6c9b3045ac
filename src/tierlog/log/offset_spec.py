"""Where a reader attaches: first, last, next, an absolute offset, or a timestamp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tierlog.errors import ConfigError

OffsetSpecKind = Literal["first", "last", "next", "offset", "timestamp"]


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """A reader's starting point, as in the stream protocol.

    * ``first``: the oldest chunk; ``last``: the last user chunk (``next`` if none);
    * ``next``: the next chunk to be written;
    * ``offset``: the chunk containing ``value`` (records before it are skipped);
    * ``timestamp``: the first chunk whose timestamp (ms) is >= ``value``.
    """

    kind: OffsetSpecKind
    value: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("first", "last", "next", "offset", "timestamp"):
            raise ConfigError(f"unknown offset spec {self.kind!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise ConfigError("offset spec value must be an int")
        if self.kind == "offset" and self.value < 0:
            raise ConfigError("offset must be >= 0")

    @classmethod
    def first(cls) -> OffsetSpec:
        return cls("first")

    @classmethod
    def last(cls) -> OffsetSpec:
        return cls("last")

    @classmethod
    def next(cls) -> OffsetSpec:
        return cls("next")

    @classmethod
    def offset(cls, offset: int) -> OffsetSpec:
        return cls("offset", offset)

    @classmethod
    def timestamp(cls, timestamp_ms: int) -> OffsetSpec:
        return cls("timestamp", timestamp_ms)

    @classmethod
    def parse(cls, text: str) -> OffsetSpec:
        """Parse ``first``, ``last``, ``next``, ``<offset>`` or ``ts:<milliseconds>``."""
        text = text.strip()
        if text in ("first", "last", "next"):
            return cls(text)  # type: ignore[arg-type]
        try:
            if text.startswith("ts:"):
                return cls("timestamp", int(text[3:]))
            return cls("offset", int(text))
        except ValueError:
            raise ConfigError(f"cannot parse offset spec {text!r}") from None
