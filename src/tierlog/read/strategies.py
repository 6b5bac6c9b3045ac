"""Read strategies (RocketMQ's tiered-storage read policies) and the tier decision.

``choose_tier`` is pure: given where each tier's data lies, it says which tier serves the
chunk at ``offset`` and, for the remote tier, up to which offset the remote cursor may run
before the decision must be taken again. ``docs/reading.md`` explains the strategies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from tierlog.errors import ConfigError
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.reader import LogSource
from tierlog.log.segment_files import IndexView
from tierlog.read.errors import NotHeldLocallyError, OffsetUnavailableError

HOT_MEMORY_RATIO = 0.4  # RocketMQ's accessMessageInMemoryMaxRatio default


class ReadStrategy(Enum):
    """Where a stream's consumers read from (per stream; ``NOT_IN_DISK`` is the default).

    * ``DISABLE``: never the remote tier; offsets not held locally raise.
    * ``NOT_IN_DISK``: the local tier when it holds the offset, else the remote tier.
    * ``NOT_IN_MEM``: the local tier only within its hot tail (likely in the page cache),
      else the remote tier (when it holds the offset).
    * ``FORCE``: the remote tier for every tiered offset; the local tier only past it.
    """

    DISABLE = "disable"
    NOT_IN_DISK = "not_in_disk"
    NOT_IN_MEM = "not_in_mem"
    FORCE = "force"

    @classmethod
    def parse(cls, text: str) -> ReadStrategy:
        """``disable``, ``not_in_disk``, ``not_in_mem`` or ``force`` (any case, - or _)."""
        key = text.strip().lower().replace("-", "_")
        for strategy in cls:
            if strategy.value == key:
                return strategy
        raise ConfigError(f"unknown read strategy {text!r}")


def default_hot_bytes() -> int:
    """40% of physical memory, like RocketMQ's in-memory ratio (64 MiB if unknown)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 * 1024 * 1024
    return int(total * HOT_MEMORY_RATIO)


@dataclass(frozen=True, slots=True)
class TierView:
    """Where the data is when a decision is taken.

    ``local_first`` is None without a local log; ``local_next`` is the local commit's next
    offset; ``remote_first`` / ``remote_next`` the committed manifest's range (equal when
    empty); ``hot_from`` the first offset of the local hot tail (``NOT_IN_MEM``).
    """

    local_first: int | None
    local_next: int
    remote_first: int
    remote_next: int
    hot_from: int = 0


@dataclass(frozen=True, slots=True)
class TierChoice:
    """``tier`` serves ``offset``; a remote cursor may run until ``remote_until``."""

    tier: Literal["local", "remote", "end"]
    remote_until: int = 0


def choose_tier(strategy: ReadStrategy, offset: int, view: TierView) -> TierChoice:
    """Which tier serves the chunk at ``offset`` ("end": nothing committed there yet)."""
    local_held = view.local_first is not None and view.local_first <= offset < view.local_next
    remote_held = view.remote_first <= offset < view.remote_next
    end = view.local_next if view.local_first is not None else view.remote_next
    if strategy is ReadStrategy.DISABLE:
        if local_held:
            return TierChoice("local")
        if offset >= end:
            return TierChoice("end")
        raise NotHeldLocallyError(offset, view.local_first)
    if not local_held and not remote_held:
        if offset >= max(end, view.remote_next):
            return TierChoice("end")
        raise OffsetUnavailableError(
            f"offset {offset} is in neither tier (local from {view.local_first} to "
            f"{view.local_next}, remote [{view.remote_first}, {view.remote_next}))"
        )
    until = view.remote_next
    if strategy is ReadStrategy.NOT_IN_DISK:
        if local_held:
            return TierChoice("local")
        if view.local_first is not None and view.local_first > offset:
            until = min(until, view.local_first)
        return TierChoice("remote", until)
    if strategy is ReadStrategy.NOT_IN_MEM:
        if local_held and offset >= view.hot_from:
            return TierChoice("local")
        if not remote_held:
            return TierChoice("local")
        if view.local_first is not None and view.hot_from > offset:
            until = min(until, max(view.hot_from, view.local_first))
        return TierChoice("remote", until)
    # FORCE
    if remote_held:
        return TierChoice("remote", until)
    return TierChoice("local")


def hot_tail_start(source: LogSource, hot_bytes: int) -> int:
    """The first chunk id of the last ``hot_bytes`` bytes of the committed local log.

    Chunks from there on were written (or read) most recently and are the ones the page
    cache most likely still holds: ``NOT_IN_MEM``'s notion of "in memory".
    """
    refs = source.segment_refs()
    commit = source.commit_point()
    remaining = hot_bytes
    for n in range(len(refs) - 1, -1, -1):
        ref = refs[n]
        if ref.first_offset == commit.segment_first_offset:
            size = commit.end_position
        elif ref.first_offset > commit.segment_first_offset:
            continue  # nothing committed there yet
        else:
            try:
                size = os.path.getsize(ref.segment_path)
            except FileNotFoundError:
                return refs[n + 1].first_offset if n + 1 < len(refs) else commit.next_offset
        body = size - FILE_HEADER_SIZE
        if body <= remaining:
            remaining -= body
            continue
        boundary = size - remaining
        try:
            index = IndexView.load(ref.index_path)
        except FileNotFoundError:
            return refs[n + 1].first_offset if n + 1 < len(refs) else commit.next_offset
        count = index.limit_to(commit.chunk_id)
        lo, hi = 0, count
        while lo < hi:  # first chunk starting at or after the boundary
            mid = (lo + hi) // 2
            if index.record(mid).position < boundary:
                lo = mid + 1
            else:
                hi = mid
        if lo < count:
            return index.record(lo).chunk_id
        return refs[n + 1].first_offset if n + 1 < len(refs) else commit.next_offset
    return refs[0].first_offset if refs else commit.next_offset
