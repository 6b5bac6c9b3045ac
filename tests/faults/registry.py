"""The fault campaigns' registries: every mechanism that holds data registers its file kinds
(for the corruption matrix) and its crash points (for the kill campaign) here, and is then
tested by the same oracle: every confirmed record is read back exactly once, in order, or the
stream / read is refused with a typed error; never a silent skip, a renumbering or a deleted
healthy file.

A file kind says how to find its files in a built stream (local directory, object store and
MetaStore of a ``CampaignStream``) and, optionally, the byte range inside a file that is
"this kind" (a chunk header, an index record): damage is aimed there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tests.faults.stream import CampaignStream


@dataclass(frozen=True)
class Target:
    """One file and the byte range ``[start, end)`` of it that belongs to the kind."""

    path: str
    start: int
    end: int
    local: bool  # in the local stream directory (refusals must name it)


Locate = Callable[["CampaignStream"], list[Target]]


@dataclass(frozen=True)
class FileKind:
    name: str
    locate: Locate
    repairable: bool  # a healthy copy exists (the other tier), so refusing is not allowed
    campaign: str = "tiered-stream"  # which campaign builds files of this kind


Damage = Literal["bitflip", "truncate", "zero_page", "delete"]
DAMAGES: tuple[Damage, ...] = ("bitflip", "truncate", "zero_page", "delete")

FILE_KINDS: dict[str, FileKind] = {}


def register_file_kind(kind: FileKind) -> FileKind:
    if kind.name in FILE_KINDS:
        raise ValueError(f"file kind {kind.name!r} registered twice")
    FILE_KINDS[kind.name] = kind
    return kind


@dataclass(frozen=True)
class CrashPoint:
    """A moment the kill campaign aims at: ``arm`` makes the server die there (or None:
    random moments during the workload)."""

    name: str
    description: str


CRASH_POINTS: dict[str, CrashPoint] = {}


def register_crash_point(point: CrashPoint) -> CrashPoint:
    if point.name in CRASH_POINTS:
        raise ValueError(f"crash point {point.name!r} registered twice")
    CRASH_POINTS[point.name] = point
    return point
