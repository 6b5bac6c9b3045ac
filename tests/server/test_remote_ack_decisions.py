"""The pure decisions of ``ack = remote`` (``tiering.remote_ack``): which confirms a
manifest commit releases, how far consumers may read, the tiering settings."""

from __future__ import annotations

import pytest

from tierlog.errors import ConfigError
from tierlog.log.commit_point import CommitPoint
from tierlog.remote.settings import StreamSettings
from tierlog.tiering.config import tiering_config
from tierlog.tiering.remote_ack import (
    ConfirmLedger,
    VisibleTail,
    check_interval,
    tiering_overrides,
)


def test_ledger_releases_in_order_only_what_the_remote_tier_covers() -> None:
    ledger: ConfirmLedger[str] = ConfirmLedger()
    ledger.hold(10, ["a", "b"])
    ledger.hold(10, ["c"])  # same bound: merged
    ledger.hold(25, ["d"])
    ledger.hold(40, [])
    assert ledger.count == 4 and ledger.oldest_end == 10
    assert ledger.release(9) == []
    assert ledger.release(10) == ["a", "b", "c"]
    assert ledger.release(24) == []
    assert ledger.release(100) == ["d"]
    assert ledger.count == 0 and ledger.oldest_end is None
    ledger.hold(50, ["e"])
    assert ledger.drain() == ["e"] and ledger.count == 0


def test_ledger_never_releases_past_a_held_bound() -> None:
    """A later group with a lower bound than an earlier one (cannot happen, the commit
    point only grows) is merged into the earlier entry rather than released first."""
    ledger: ConfirmLedger[int] = ConfirmLedger()
    ledger.hold(30, [1])
    ledger.hold(20, [2])
    assert ledger.release(25) == []
    assert ledger.release(30) == [1, 2]


def point(next_offset: int, position: int = 0) -> CommitPoint:
    return CommitPoint(next_offset - 1, next_offset, 0, position or 8 + next_offset * 100)


def test_visible_tail_moves_to_the_newest_noted_point_below_the_remote_tier() -> None:
    tail = VisibleTail(point(0, 8))
    for n in (5, 10, 15):
        tail.note(point(n))
    tail.note(point(12))  # older than the last noted one: ignored
    assert tail.advance(0) is None
    assert tail.advance(10) is True and tail.visible == point(10)
    assert tail.advance(10) is None
    # the remote tier ends between noted points: the shell must look closer
    assert tail.advance(12) is False and tail.visible == point(10)
    tail.set(point(12, 1234))
    assert tail.visible == point(12, 1234)
    tail.set(point(11))  # never backwards
    assert tail.visible == point(12, 1234)
    assert tail.advance(15) is True and tail.visible == point(15)


def test_remote_ack_streams_cut_and_commit_every_interval() -> None:
    plain = StreamSettings()
    assert tiering_overrides(plain, 0.2) == {}
    remote = StreamSettings(ack="remote")
    cfg = tiering_config(remote, **tiering_overrides(remote, 0.2))
    assert cfg.max_fragment_age == 0.2
    assert cfg.debounce_count == 1 and cfg.debounce_seconds == 0.0
    assert cfg.fragment_bytes == remote.fragment_bytes  # still cut by size earlier
    # a stream asking for an even shorter age keeps it
    quick = StreamSettings(ack="remote", max_fragment_age_seconds=0.05)
    assert tiering_config(quick, **tiering_overrides(quick, 0.2)).max_fragment_age == 0.05


@pytest.mark.parametrize("bad", [0.0, -1.0, 0.001, 61.0])
def test_interval_bounds(bad: float) -> None:
    with pytest.raises(ConfigError):
        check_interval(bad)
    assert check_interval(0.2) == 0.2
