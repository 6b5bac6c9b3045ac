"""The SeaweedFS test server stops promptly: ``weed server`` never finishes its own
graceful shutdown, so the harness must not wait it out (it cost every test session ten
seconds)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.plugins.seaweed import STOP_GRACE_S, _s3_client, start_seaweed, stop_seaweed

pytestmark = pytest.mark.s3


def test_a_started_server_stops_within_its_grace_and_leaves_no_process(tmp_path: Path) -> None:
    server = start_seaweed(tmp_path / "seaweed")
    client = _s3_client(server.endpoint)
    client.put_object(Bucket=server.bucket, Key="k", Body=b"x" * 1000)
    started = time.monotonic()
    stop_seaweed(server)
    took = time.monotonic() - started
    assert took < STOP_GRACE_S + 3, f"stopping SeaweedFS took {took:.1f} s"
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # the whole process group is gone
