"""The one back-pressure rule: tiering lag over the limit or free disk under the floor."""

from __future__ import annotations

from pathlib import Path

from tierlog.tiering.backpressure import BackPressure, free_disk_below


def test_lag_over_the_limit_raises_the_alarm_until_it_drops(tmp_path: Path) -> None:
    rule = BackPressure("s", str(tmp_path), max_lag_bytes=100)
    assert rule.check(100) is None and not rule.active
    reason = rule.check(101)
    assert reason is not None and "101" in reason
    assert rule.active and rule.events == 1
    assert rule.check(5_000) is not None and rule.events == 2
    assert rule.check(0) is None and not rule.active and rule.events == 2


def test_free_disk_under_the_floor_counts_whatever_the_lag(tmp_path: Path) -> None:
    huge = 1 << 62  # more than any disk has free
    assert free_disk_below(str(tmp_path), 0) is None
    assert free_disk_below(str(tmp_path), 1) is None
    assert free_disk_below(str(tmp_path), huge) is not None
    rule = BackPressure("s", str(tmp_path), max_lag_bytes=None, min_free_disk_bytes=huge)
    reason = rule.check(0)
    assert reason is not None and "free disk" in reason and rule.active
