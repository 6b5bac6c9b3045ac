"""The decisions of ``ack = remote`` streams, pure: when to cut and commit, which
confirms a manifest commit releases, and how far consumers may read.

A stream created with ``x-tierlog-ack=remote`` confirms a publish only once the chunk
holding it is in a committed manifest (fragment PUT, root PUT, conditional pointer put):
its only durable copy may then be the object store's, so losing the node's disk loses
nothing confirmed. To keep that at object-store latency, such a stream cuts a fragment
every ``interval`` whatever its size and commits as soon as it is uploaded (no debounce).
Consumers of the stream read only below the remote-committed offset, so nothing a
consumer saw can vanish with the disk.

Nothing here does I/O or reads a clock; ``server.remote_ack`` is the shell.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tierlog.errors import ConfigError
from tierlog.log.commit_point import CommitPoint
from tierlog.remote.settings import StreamSettings

T = TypeVar("T")

MIN_INTERVAL_SECONDS = 0.01
MAX_INTERVAL_SECONDS = 60.0


def check_interval(seconds: float) -> float:
    """``tier.remote_ack_interval_seconds``: positive, and short enough to be a latency."""
    if not MIN_INTERVAL_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
        raise ConfigError(
            f"tier.remote_ack_interval_seconds must be {MIN_INTERVAL_SECONDS}.."
            f"{MAX_INTERVAL_SECONDS} seconds, got {seconds!r}"
        )
    return seconds


def is_remote_ack(settings: StreamSettings) -> bool:
    return settings.ack == "remote"


def tiering_overrides(settings: StreamSettings, interval: float) -> dict[str, Any]:
    """``TieringConfig`` changes for an ``ack = remote`` stream (none for the others): a
    fragment is cut at most ``interval`` after its first chunk was committed locally
    (by size earlier), and committed as soon as it is uploaded; commits stay one at a
    time, so fragments uploaded while one is in flight go in the next commit."""
    if not is_remote_ack(settings):
        return {}
    return {
        "max_fragment_age": min(settings.max_fragment_age_seconds, interval),
        "debounce_count": 1,
        "debounce_seconds": 0.0,
    }


@dataclass(slots=True)
class _Held(Generic[T]):
    end: int
    items: list[T]


class ConfirmLedger(Generic[T]):
    """Confirms waiting for the remote tier, in write order.

    ``hold(end, items)``: the items become due once the remote-committed next offset
    reaches ``end`` (the log's committed next offset after the write that carried them:
    every chunk they name is below it). ``release(durable_next)`` returns the due items,
    oldest first; ``drain()`` returns every item left (the stream closes)."""

    def __init__(self) -> None:
        self._held: deque[_Held[T]] = deque()
        self.count = 0

    def hold(self, end: int, items: list[T]) -> None:
        if not items:
            return
        if self._held and self._held[-1].end >= end:
            self._held[-1].items.extend(items)  # same (or an earlier) bound: one entry
        else:
            self._held.append(_Held(end, items))
        self.count += len(items)

    def release(self, durable_next: int) -> list[T]:
        out: list[T] = []
        held = self._held
        while held and held[0].end <= durable_next:
            out.extend(held.popleft().items)
        self.count -= len(out)
        return out

    def drain(self) -> list[T]:
        out = [item for entry in self._held for item in entry.items]
        self._held.clear()
        self.count = 0
        return out

    @property
    def oldest_end(self) -> int | None:
        return self._held[0].end if self._held else None


class VisibleTail:
    """How far consumers of an ``ack = remote`` stream may read: the newest commit
    point of the local log whose next offset the remote tier has committed.

    The shell notes the log's commit point after every write group (``note``); when the
    remote tier advances, the newest noted point at or below it becomes visible.
    When the remote tier ends between noted points (a write that did not come from a
    group), ``advance`` says so and the shell computes the point from the log itself.
    """

    def __init__(self, start: CommitPoint) -> None:
        self.visible = start
        self._noted: deque[CommitPoint] = deque()

    def note(self, point: CommitPoint) -> None:
        if point.next_offset <= self.visible.next_offset:
            return
        if self._noted and self._noted[-1].next_offset >= point.next_offset:
            return
        self._noted.append(point)

    def advance(self, durable_next: int) -> bool | None:
        """Move to the newest noted point at or below ``durable_next``. True if it moved
        exactly there, None if nothing changed, False if the remote tier is past the
        chosen point but short of the next noted one (the shell may look closer)."""
        if durable_next <= self.visible.next_offset:
            return None
        moved = False
        noted = self._noted
        while noted and noted[0].next_offset <= durable_next:
            self.visible = noted.popleft()
            moved = True
        if self.visible.next_offset == durable_next:
            return True
        return False if moved or durable_next > self.visible.next_offset else None

    def set(self, point: CommitPoint) -> None:
        """The shell found the exact point (it only ever moves forward)."""
        if point.next_offset > self.visible.next_offset:
            self.visible = point
            while self._noted and self._noted[0].next_offset <= point.next_offset:
                self._noted.popleft()
