"""A member's local retention decision (``cluster.member_retention``): the leader's rule
(``tiering.retention.local_segments_to_free``) fed with what the member knows, never
freeing past the leader's remote tier, the commit the member learned, or what its
consumers' view of the manifest holds."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from tierlog.cluster.member_retention import (
    MemberRetentionInput,
    OffloadLag,
    member_segments_to_free,
    stamp_durable,
)
from tierlog.tiering.retention import LocalSegment, local_segments_to_free

NOW = 100_000


def segments(bounds: list[int], open_last: bool = True) -> list[LocalSegment]:
    """Segments [b0, b1), [b1, b2), ... of 100 bytes each, the last one open."""
    out = []
    for i, (first, nxt) in enumerate(itertools.pairwise(bounds)):
        sealed = not (open_last and i == len(bounds) - 2)
        out.append(LocalSegment(first, nxt, 100, sealed, max_timestamp=first))
    return out


def known(**changes: object) -> MemberRetentionInput:
    base: dict[str, object] = {
        "local_max_bytes": 150,
        "local_max_age_seconds": None,
        "remote_first": 0,
        "tiered_offset": 1000,
        "commit_chunk_id": 1000,
        "tail_chunk_id": 1000,
        "readers_remote_next": None,
    }
    base.update(changes)
    return MemberRetentionInput(**base)  # type: ignore[arg-type]


SEGS = segments([0, 10, 20, 30, 40, 50])  # five segments, 500 bytes, the last one open


def test_over_the_local_limit_frees_the_oldest_durable_segments() -> None:
    # 500 bytes -> 400 -> 300 -> 200 -> 100 (within 150: the open segment stays)
    assert member_segments_to_free(SEGS, known(), NOW) == [0, 10, 20, 30]


def test_never_past_the_leaders_tiered_offset() -> None:
    assert member_segments_to_free(SEGS, known(tiered_offset=25), NOW) == [0, 10]
    assert member_segments_to_free(SEGS, known(tiered_offset=9), NOW) == []


def test_never_past_the_commit_the_member_learned() -> None:
    # the segment [20, 30) holds the commit chunk 25: it is not wholly committed
    assert member_segments_to_free(SEGS, known(commit_chunk_id=25), NOW) == [0, 10]
    assert member_segments_to_free(SEGS, known(commit_chunk_id=-1), NOW) == []


def test_never_the_segment_holding_the_members_tail() -> None:
    # a member far behind learned a commit (1000) past its own tail (chunk 25, in the
    # sealed segment [20, 30) followed by an empty open one): that segment stays, also
    # when retention removed it from the stream
    behind = segments([0, 10, 20, 30, 30])
    assert member_segments_to_free(behind, known(tail_chunk_id=25), NOW) == [0, 10]
    gone = known(local_max_bytes=None, remote_first=1000, tail_chunk_id=25)
    assert member_segments_to_free(behind, gone, NOW) == [0, 10]
    assert member_segments_to_free(behind, known(tail_chunk_id=-1), NOW) == []


def offload(**changes: object) -> MemberRetentionInput:
    """Segment mode: no local limit, a 10 s deletion lag; segments seen durable at
    ``NOW - 20 s`` ([0, 10)), ``NOW - 5 s`` ([10, 20)) and ``NOW`` ([20, 30))."""
    since = {0: NOW - 20_000, 10: NOW - 5_000, 20: NOW}
    lag = OffloadLag(10.0, since, disk_low=bool(changes.pop("disk_low", False)))
    return known(**{"local_max_bytes": None, "offload": lag, **changes})


def test_segment_mode_frees_offloaded_segments_after_the_deletion_lag() -> None:
    assert member_segments_to_free(SEGS, offload(), NOW) == [0]
    assert member_segments_to_free(SEGS, offload(), NOW + 5_000) == [0, 10]
    # [30, 40) was never seen durable: it waits for a stamp whatever the time
    assert member_segments_to_free(SEGS, offload(), NOW + 60_000) == [0, 10, 20]


def test_segment_mode_never_past_what_the_bucket_holds_nor_the_commit_nor_the_tail() -> None:
    late = NOW + 60_000
    assert member_segments_to_free(SEGS, offload(tiered_offset=19), late) == [0]
    assert member_segments_to_free(SEGS, offload(commit_chunk_id=15), late) == [0]
    assert member_segments_to_free(SEGS, offload(tail_chunk_id=12), late) == [0]
    assert member_segments_to_free(SEGS, offload(readers_remote_next=20), late) == [0, 10]


def test_segment_mode_waives_the_lag_when_the_disk_is_low_and_frees_what_retention_removed() -> (
    None
):
    assert member_segments_to_free(SEGS, offload(disk_low=True), NOW) == [0, 10, 20, 30]
    # removed by retention: goes without the lag (below the stream's first offset)
    assert member_segments_to_free(SEGS, offload(remote_first=20), NOW) == [0, 10]
    # a local limit is not the segment mode's rule (the leader applies none)
    assert member_segments_to_free(SEGS, offload(local_max_bytes=1), NOW) == [0]


def test_stamps_keep_the_first_sight_and_drop_freed_segments() -> None:
    stamped = stamp_durable(SEGS, 20, {0: 5, 40: 7}, NOW)
    assert stamped == {0: 5, 10: NOW}  # [20, 30) not wholly durable; 40 no longer listed
    assert stamp_durable(SEGS, 1000, stamped, NOW + 1) == {0: 5, 10: NOW, 20: NOW + 1, 30: NOW + 1}


def test_consumers_hold_back_only_what_their_manifest_view_lacks() -> None:
    assert member_segments_to_free(SEGS, known(readers_remote_next=15), NOW) == [0]
    assert member_segments_to_free(SEGS, known(readers_remote_next=1000), NOW) == [0, 10, 20, 30]


def test_retention_frees_below_the_stream_first_offset_without_a_limit() -> None:
    expired = known(local_max_bytes=None, remote_first=20)
    assert member_segments_to_free(SEGS, expired, NOW) == [0, 10]
    # but not past what the member knows is committed
    assert member_segments_to_free(
        SEGS, known(local_max_bytes=None, remote_first=20, commit_chunk_id=12), NOW
    ) == [0]


def test_age_limit() -> None:
    aged = known(local_max_bytes=None, local_max_age_seconds=(NOW - 15) / 1000)
    assert member_segments_to_free(SEGS, aged, NOW) == [0, 10]  # newest chunks at 0, 10


@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=8),
    st.integers(0, 400),
    st.integers(0, 400),
    st.integers(-1, 400),
    st.one_of(st.none(), st.integers(0, 400)),
    st.one_of(st.none(), st.integers(1, 600)),
)
def test_frees_only_what_every_input_allows(
    sizes: list[int],
    tiered: int,
    first: int,
    commit: int,
    readers: int | None,
    limit: int | None,
) -> None:
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    segs = segments(bounds)
    first = min(first, tiered)
    given_in = known(
        local_max_bytes=limit,
        remote_first=first,
        tiered_offset=tiered,
        commit_chunk_id=commit,
        readers_remote_next=readers,
    )
    freed = member_segments_to_free(segs, given_in, NOW)
    assert freed == [s.first_offset for s in segs[: len(freed)]]  # oldest first, contiguous
    cap = min(tiered, max(0, commit), tiered if readers is None else readers)
    for seg in segs[: len(freed)]:
        assert seg.sealed
        assert seg.next_offset <= cap
    if readers is None and commit >= tiered:
        # with nothing more to respect, exactly the leader's decision
        assert freed == local_segments_to_free(segs, tiered, first, limit, None, NOW)
