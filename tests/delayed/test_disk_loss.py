"""A delayed stream loses its node's disk (``tierlog serve`` SIGKILLed, its data directory
deleted, SeaweedFS and etcd kept): every confirmed scheduled message is still appended
exactly once, never early — for an ``ack = remote`` stream, and for an ordinary tiered one
once its system stream was tiered. The scheduler reads its system stream across tiers: the
local log restarts at the remote tail, and before, the rebuild read that (empty) local log
only and every scheduled message was lost (40 of 40)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.delayed.disk_loss import run_disk_loss, s3_env, server_config
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess

pytestmark = [pytest.mark.s3, pytest.mark.etcd]


@pytest.fixture
def node(
    tmp_path: Path, seaweed: SeaweedServer, etcd_server: str
) -> Iterator[TierlogServerProcess]:
    prefix = f"delayed-disk-{uuid.uuid4().hex}"
    server = TierlogServerProcess(
        tmp_path / "node-data",
        config_text=server_config(seaweed, etcd_server, prefix, checkpoint_records=40),
        env=s3_env(seaweed),
    )
    try:
        yield server.start()
    finally:
        try:
            server.stop()
        finally:
            server.kill()


@pytest.mark.parametrize("kind", ["ack-remote", "tiered"])
async def test_scheduled_messages_survive_losing_the_disk(
    node: TierlogServerProcess, kind: str
) -> None:
    result = await run_disk_loss(node, kind, wipes=1, seed=3)
    print(result)
    assert not result.problems, result.problems
    assert result.checkpoints_before_wipe[0] > 0  # checkpoints and retention came first
    assert result.missing == 0, f"{result.missing} of {result.confirmed} lost"
    assert result.duplicates == 0
    assert result.early == 0
    assert result.appended == result.confirmed == 100
