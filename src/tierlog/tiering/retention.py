"""Retention decisions: which remote fragments and which local segments may go.

Both are pure functions over what the caller already holds (the cached manifest root,
the local segment list), so they can be evaluated often and tested exhaustively.

* Remote retention (the stream's ``max_bytes`` / ``max_age``) trims whole fragments from
  the front of the manifest; ``max_age`` compares a fragment's *max* timestamp with the
  cut-off, so a fragment goes only when all of its data is too old.
* A retention *floor* (``floor_trim_offset``; the system streams of delayed streams set it
  at their last checkpoint) trims every fragment wholly below it, whatever the policy.
* Local retention (``local_max_bytes`` / ``local_max_age``) frees the oldest sealed local
  segments, but only those whose data is safe elsewhere: every offset in the segment is below the
  durably committed manifest's next offset, or below the remote first offset (already
  trimmed by remote retention). Never earlier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tierlog.remote.manifest_tree import Loader, ManifestTree


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    max_bytes: int | None = None
    max_age_seconds: float | None = None

    @property
    def active(self) -> bool:
        return self.max_bytes is not None or self.max_age_seconds is not None


def remote_trim_offset(
    tree: ManifestTree, load: Loader, policy: RetentionPolicy, now_ms: int
) -> int | None:
    """The offset to trim the remote tier to (a fragment boundary), or None."""
    if not policy.active or tree.is_empty:
        return None
    total = tree.header().total_bytes
    cutoff = None
    if policy.max_age_seconds is not None:
        cutoff = now_ms - int(policy.max_age_seconds * 1000)
    removed = 0
    trim_to: int | None = None
    for loc in tree.iter_fragments(load):
        too_big = policy.max_bytes is not None and total - removed > policy.max_bytes
        too_old = cutoff is not None and loc.entry.max_timestamp < cutoff
        if not (too_big or too_old):
            break
        removed += loc.entry.data_size
        trim_to = loc.next_offset
    return trim_to


def floor_trim_offset(tree: ManifestTree, load: Loader, floor: int) -> int | None:
    """The offset to trim the remote tier to so that nothing at or above ``floor`` goes:
    the end of the last whole fragment below it, never the stream's last fragment (None:
    nothing to trim). A delayed stream's system stream sets its floor at its last
    checkpoint. The last fragment stays because a node that lost its disk resumes from the
    remote tail: its last chunk (and tracking) must stay readable."""
    if tree.is_empty:
        return None
    trim_to: int | None = None
    for loc in tree.iter_fragments(load):
        if loc.next_offset > floor or loc.next_offset >= tree.next_offset:
            break
        trim_to = loc.next_offset
    return trim_to


@dataclass(frozen=True, slots=True)
class LocalSegment:
    first_offset: int
    next_offset: int
    size: int
    sealed: bool
    max_timestamp: int  # ms; newest chunk in the segment


def local_segments_to_free(
    segments: Sequence[LocalSegment],
    durable_next: int,
    remote_first: int,
    max_bytes: int | None,
    max_age_seconds: float | None,
    now_ms: int,
) -> list[int]:
    """First offsets of the oldest segments to delete, oldest first.

    A segment wholly below ``remote_first`` always goes (remote retention removed it
    from the stream); otherwise it goes only when it is sealed, wholly durable remotely
    (``next_offset <= durable_next``) and over a local limit."""
    total = sum(s.size for s in segments)
    cutoff = None if max_age_seconds is None else now_ms - int(max_age_seconds * 1000)
    out: list[int] = []
    for seg in segments:
        if not seg.sealed:
            break
        expired = seg.next_offset <= remote_first
        durable = seg.next_offset <= durable_next
        over = (max_bytes is not None and total > max_bytes) or (
            cutoff is not None and seg.max_timestamp < cutoff
        )
        if not (expired or (durable and over)):
            break
        out.append(seg.first_offset)
        total -= seg.size
    return out


def describe_segments(
    infos: Sequence[tuple[int, int, int, bool]], max_timestamp: Callable[[int], int]
) -> list[LocalSegment]:
    """(first, next, size, sealed) tuples plus a timestamp lookup → LocalSegment list."""
    return [
        LocalSegment(first, nxt, size, sealed, max_timestamp(first) if sealed else 0)
        for first, nxt, size, sealed in infos
    ]
