"""File kinds and crash points of a replica's log (the acceptor path), registered for
the fault campaigns. Their campaign is a replica stream directory
(``tests/log/test_acceptor_faults.py``), not the tiered single-node stream of the
corruption matrix."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tests.faults.registry import (
    CrashPoint,
    FileKind,
    Target,
    register_crash_point,
    register_file_kind,
)
from tierlog.log.member_epoch import MEMBER_EPOCH_FILE
from tierlog.log.truncation import INTENT_FILE

REPLICA_CAMPAIGN = "replica-log"


@dataclass
class ReplicaStream:
    """A replica's stream directory, as the replica campaign builds it."""

    stream_dir: str


def _whole(stream: ReplicaStream, name: str) -> list[Target]:
    path = os.path.join(stream.stream_dir, name)
    if not os.path.exists(path):
        return []
    return [Target(path, 0, os.path.getsize(path), True)]


MEMBER_EPOCH = register_file_kind(
    FileKind(
        "member epoch file",
        lambda s: _whole(s, MEMBER_EPOCH_FILE),  # type: ignore[arg-type]
        False,
        REPLICA_CAMPAIGN,
    )
)
TRUNCATION_INTENT = register_file_kind(
    FileKind(
        "truncation intent",
        lambda s: _whole(s, INTENT_FILE),  # type: ignore[arg-type]
        False,
        REPLICA_CAMPAIGN,
    )
)

ACCEPT_STEPS = register_crash_point(
    CrashPoint(
        "replica-accept-step",
        "a replica killed (SIGKILL) at each file-system step of accepting chunks across a "
        "segment roll, the step's write torn in half: the log reopens holding its old "
        "chunks plus a whole-chunk prefix of the accepted ones, byte-identical to the leader",
    )
)
TRUNCATE_STEPS = register_crash_point(
    CrashPoint(
        "replica-truncate-step",
        "a replica killed at each file-system step of cutting its divergent suffix across "
        "segments: the log reopens as the old log or the cut one, never in between",
    )
)
MEMBER_EPOCH_STEPS = register_crash_point(
    CrashPoint(
        "replica-member-epoch-step",
        "a member killed at each step of persisting its highest seen epoch: the old or "
        "the new value, never a torn file",
    )
)
