"""Exactly once and never early across hours of stepped time, timer objects and crashes at
every registered crash point (``tests/delayed/campaign.py``; ``scripts/delayed_campaign.py``
runs it with 100,000 messages)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.delayed import campaign


async def test_stepped_campaign_exactly_once_never_early(tmp_path: Path) -> None:
    messages = int(os.environ.get("DELAYED_CAMPAIGN_MESSAGES", "3000"))
    result = await campaign.run(str(tmp_path), messages, seed=11)
    print(result)
    assert result.published == messages
    assert result.missing == 0 and result.duplicates == 0, result
    assert result.appended == messages
    assert result.early == 0
    assert result.crashes >= 5 and len(result.crash_points) >= 4, result
    assert result.timer_objects > 0  # long delays went through the remote tier
    # checkpoints were written and retention dropped the records below them, with crashes
    # at every point in between (a checkpoint's carries are appended like any record)
    assert result.checkpoints >= 3 and result.freed_segments > 0, result
    # the clock steps by up to 60 s: a message is late by at most one step, two when a
    # crash or a failed append took the round it was due in
    assert max(result.lateness_ms) <= 120_000
