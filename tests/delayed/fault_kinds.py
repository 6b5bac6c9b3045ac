"""Delayed delivery's file kinds in the durability fault registry: the working set (message
store segments), timer objects and the timer manifest. Each has a healthy copy (the system
stream), so a fault must be repaired, never refused, and never lose or double a message."""

from __future__ import annotations

import glob
import os
from typing import Any

from tests.faults.registry import FileKind, Target, register_file_kind

TIMER_MANIFEST = "meta:delayed-timer-manifest"


def working_set(world: Any) -> list[Target]:
    out = []
    for path in sorted(glob.glob(os.path.join(world.working_dir, "*.sqs"))):
        size = os.path.getsize(path)
        if size > 64:
            out.append(Target(path, 64, size, True))
    return out


def timer_objects(world: Any) -> list[Target]:
    paths = glob.glob(os.path.join(world.root, "objects", "**", "*.timer*"), recursive=True)
    return [Target(p, 0, os.path.getsize(p), False) for p in sorted(paths)]


def timer_manifest(world: Any) -> list[Target]:
    return [Target(TIMER_MANIFEST, 0, 1 << 20, False)]


KINDS = [
    register_file_kind(FileKind("delayed:working_set", working_set, True, "delayed")),
    register_file_kind(FileKind("delayed:timer_object", timer_objects, True, "delayed")),
    register_file_kind(FileKind("delayed:timer_manifest", timer_manifest, True, "delayed")),
]
