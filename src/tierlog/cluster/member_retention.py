"""Which local segments a cluster member may free: the leader's rule, fed with what the
member knows.

A stream's leader frees its sealed local segments once the remote tier durably holds
them and a local limit (``local_max_bytes`` / ``local_max_age_seconds``) is passed, and
at once when retention removed them from the stream (``tiering.retention``'s
``local_segments_to_free``). A member runs the very same function; it only has to be
careful about what "durable" means from where it stands:

* **The remote tier** is the leader's committed manifest, which the member learns on
  the replication link (``TIERED``: the stream's first offset and the tiered offset).
  The member never reads the manifest pointer for this: one writer decides, members
  follow.
* **Its own commit**: a member's log may hold a suffix no leader committed (it cuts it
  when it follows a new leader); only chunks below the commit it learned are known to
  be the leader's, so nothing at or past that commit chunk is freed.
* **Its consumers** read freed offsets from the remote tier through their own view of
  the manifest (polled while they read), which may lag the leader's by a poll
  interval. While the member has consumers, nothing past what that view holds is
  freed, so a reader never finds an offset in neither tier. Consumers never hold a
  segment back otherwise (a stalled consumer must not fill the disk): one positioned in
  a freed segment reads on from the remote tier; one below the stream's first offset
  (retention) gets ``OffsetOvertakenError`` as on the leader.

Local bytes then stay within the local limit plus the open segment, as on the leader,
as long as tiering keeps up (the leader's back-pressure sees to that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierlog.tiering.retention import LocalSegment, local_segments_to_free


@dataclass(frozen=True, slots=True)
class MemberRetentionInput:
    """What one member knows about one stream when it decides."""

    local_max_bytes: int | None
    local_max_age_seconds: float | None
    remote_first: int
    """The stream's first offset (the leader's retention trimmed below it)."""
    tiered_offset: int
    """The remote tier durably holds every offset below it (the leader's manifest)."""
    commit_chunk_id: int
    """The cluster commit this member learned (-1: none yet)."""
    readers_remote_next: int | None = None
    """None without consumers here; else the remote tail their manifest view holds."""


def member_segments_to_free(
    segments: Sequence[LocalSegment], known: MemberRetentionInput, now_ms: int
) -> list[int]:
    """First offsets of the oldest segments the member may delete now, oldest first."""
    # a segment whose next offset is at most the commit chunk's id ends before it
    durable = min(known.tiered_offset, max(0, known.commit_chunk_id))
    if known.readers_remote_next is not None:
        durable = min(durable, known.readers_remote_next)
    expired = min(known.remote_first, durable)
    return local_segments_to_free(
        segments,
        durable,
        expired,
        known.local_max_bytes,
        known.local_max_age_seconds,
        now_ms,
    )
