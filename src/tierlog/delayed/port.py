"""What a scheduler needs of its streams (``StreamPort``, the server provides it) and its
settings (``SchedulerConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class StreamPort(Protocol):
    """What the scheduler needs of its stream and system stream (the server provides it)."""

    def read_system(self, from_offset: int) -> tuple[list[tuple[int, bytes]], int]:
        """Committed system-stream records from ``from_offset`` (blocking): (offset, record)
        pairs and the next offset to read."""
        ...

    def first_system_offset(self) -> int:
        """The system stream's first offset across its tiers (retention moves it)."""
        ...

    def read_system_at(self, offset: int) -> bytes:
        """The system-stream record at ``offset`` (blocking)."""
        ...

    async def append_system(self, records: list[bytes]) -> bool:
        """Append records (no producer) and wait for their commit; False on failure."""
        ...

    async def append_target(self, first_pid: int, messages: list[bytes]) -> int:
        """Append messages with the dispatcher's publishing ids ``first_pid..``; returns
        the dispatcher's producer sequence in the stream once the append is settled
        (success or not)."""
        ...

    def producer_sequence(self) -> int:
        """The dispatcher's producer sequence in the stream (0: none yet)."""
        ...


@dataclass(frozen=True)
class SchedulerConfig:
    horizon_ms: int = 3_600_000
    batch_limit: int = 500
    tick_seconds: float = 0.05
    park_interval_seconds: float = 1.0
    housekeeping_seconds: float = 5.0
    checkpoint_records: int = 100_000
    """A checkpoint is written once this many system-stream records (and at least as many
    as are pending) were appended since the last one (``SchedulerState.should_checkpoint``)."""
    checkpoint_retry_seconds: float = 5.0
