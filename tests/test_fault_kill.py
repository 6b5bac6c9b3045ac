"""The kill -9 campaign in CI: a few cycles (``KILL_CYCLES``, default 5); the long run is
``scripts/kill_campaign.py``."""

from __future__ import annotations

import os
from pathlib import Path

from tests.faults.kill import run_campaign


async def test_kill_9_during_publish_and_tiering_loses_nothing(tmp_path: Path) -> None:
    cycles = int(os.environ.get("KILL_CYCLES", "5"))
    result = await run_campaign(tmp_path, cycles, seed=int(os.environ.get("KILL_SEED", "1")))
    print(result)
    assert not result.problems, result
    assert result.cycles == cycles and result.confirmed > 0
    assert result.read_back >= result.confirmed
