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
* **Its own tail**: a member far behind learns a commit past its own tail; the segment
  holding its last chunk is never freed whatever the leader holds, since the member's
  fetch position and epoch history (what it proves to a leader) are read from it.
* **Its consumers** read freed offsets from the remote tier through their own view of
  the manifest (polled while they read), which may lag the leader's by a poll
  interval. While the member has consumers, nothing past what that view holds is
  freed, so a reader never finds an offset in neither tier. Consumers never hold a
  segment back otherwise (a stalled consumer must not fill the disk): one positioned in
  a freed segment reads on from the remote tier; one below the stream's first offset
  (retention) gets ``OffsetOvertakenError`` as on the leader.

Local bytes then stay within the local limit plus the open segment, as on the leader,
as long as tiering keeps up (the leader's back-pressure sees to that).

**Segment mode** (``tier_mode = segments``, ``offload.service``): the leader's rule is
not a local limit but the deletion lag: a local segment goes once its offload was
committed and ``offload_deletion_lag_seconds`` passed since (at once when free disk is
under the floor), and when retention removed it. The member applies the same rule to
whole segments of its own that the bucket holds as offloaded segments (every offset of
the segment below the leader's offloaded position), counting the lag from when it first
saw the segment durable (``durable_since``: at least as late as the leader's commit, so
a member never frees earlier than its leader; after a restart the lag starts over).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    tail_chunk_id: int
    """The id of the last chunk in the member's log (-1: empty)."""
    readers_remote_next: int | None = None
    """None without consumers here; else the remote tail their manifest view holds."""
    offload: OffloadLag | None = None
    """Segment mode: the deletion lag stands in for the local limits (None: fragments)."""


@dataclass(frozen=True, slots=True)
class OffloadLag:
    """What a member of a segment-mode stream knows in place of the local limits."""

    lag_seconds: float
    """The stream's ``offload_deletion_lag_seconds``."""
    durable_since_ms: Mapping[int, int] = field(default_factory=dict)
    """Segment first offset → when this member first saw the whole segment durable
    (``stamp_durable``)."""
    disk_low: bool = False
    """Free disk is under ``tier.min_free_disk_bytes``: the lag is waived, as on the
    leader."""


def durable_next(known: MemberRetentionInput) -> int:
    """Every offset below it is durable remotely, committed by the leader, below the
    member's tail chunk and in its consumers' manifest view (a segment whose next offset
    is at most the commit or tail chunk's id ends before that chunk)."""
    durable = min(known.tiered_offset, max(0, known.commit_chunk_id), max(0, known.tail_chunk_id))
    if known.readers_remote_next is not None:
        durable = min(durable, known.readers_remote_next)
    return durable


def stamp_durable(
    segments: Sequence[LocalSegment], durable: int, since: Mapping[int, int], now_ms: int
) -> dict[int, int]:
    """``since`` for the segments listed now: a segment wholly below ``durable`` keeps
    its first stamp or gets ``now_ms``; segments gone (freed) drop out."""
    out: dict[int, int] = {}
    for seg in segments:
        if seg.sealed and seg.next_offset <= durable:
            out[seg.first_offset] = since.get(seg.first_offset, now_ms)
    return out


def member_segments_to_free(
    segments: Sequence[LocalSegment], known: MemberRetentionInput, now_ms: int
) -> list[int]:
    """First offsets of the oldest segments the member may delete now, oldest first."""
    durable = durable_next(known)
    expired = min(known.remote_first, durable)
    if known.offload is not None:
        return _offloaded_to_free(segments, durable, expired, known.offload, now_ms)
    return local_segments_to_free(
        segments,
        durable,
        expired,
        known.local_max_bytes,
        known.local_max_age_seconds,
        now_ms,
    )


def _offloaded_to_free(
    segments: Sequence[LocalSegment], durable: int, expired: int, lag: OffloadLag, now_ms: int
) -> list[int]:
    """Segment mode: the oldest sealed segments removed by retention, or offloaded and
    durable for the deletion lag (waived when the disk is low)."""
    out: list[int] = []
    wait_ms = int(lag.lag_seconds * 1000)
    for seg in segments:
        if not seg.sealed:
            break
        if seg.next_offset > expired:
            if seg.next_offset > durable:
                break
            since = lag.durable_since_ms.get(seg.first_offset)
            if not lag.disk_low and (since is None or since + wait_ms > now_ms):
                break
        out.append(seg.first_offset)
    return out
