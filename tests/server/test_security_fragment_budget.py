"""The global fragment-memory budget: uploads across streams never hold more than it
(one fragment at a time when it is tiny), and tiering still completes."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import STREAM_ARGS, config, publish, status, wait_for
from tierlog.formats.protocol import commands as c
from tierlog.server.app import Server
from tierlog.server.config import LimitsSection
from tierlog.tiering.memory_budget import ByteBudget


def test_byte_budget_bounds_concurrent_holders() -> None:
    budget = ByteBudget(100)
    held = 0
    peak = 0
    lock = threading.Lock()

    def worker(size: int) -> None:
        nonlocal held, peak
        for _ in range(50):
            budget.acquire(size)
            with lock:
                held += size
                peak = max(peak, held)
            time.sleep(0.0005)
            with lock:
                held -= size
            budget.release(size)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (30, 40, 60, 70, 150)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak <= 150  # the oversized holder only ever runs alone
    assert budget.used == 0 and budget.waits > 0
    budget.acquire(100)
    assert not budget.acquire(1, timeout=0.01)  # full: a timed wait gives up
    budget.release(100)


async def test_uploads_across_streams_share_one_budget(tmp_path: Path) -> None:
    cfg = replace(config(tmp_path), limits=replace(LimitsSection(), fragment_memory_bytes=1))
    server = Server(cfg)
    await server.start()
    try:
        assert server.tiering is not None
        budget = server.tiering.fragment_memory
        client = await AsyncRawClient.connect(server.stream_port)
        for name in ("a", "b", "c"):
            await client.request(c.CreateRequest(client.next_corr(), name, STREAM_ARGS))
            assert server.tiering.tierers  # every stream's tierer got the shared budget
        for tierer in server.tiering.tierers.values():
            assert tierer._memory_budget is budget
        for name in ("a", "b", "c"):
            await publish(client, name, 20)

        async def tiered() -> bool:
            for name in ("a", "b", "c"):
                s = await status(server, name)
                if s["remote"]["tiered_offset"] != s["local"]["next_offset"]:
                    return False
            return True

        await wait_for(tiered)
        # budget of 1 byte: fragments were built strictly one at a time, across streams
        assert 0 < budget.peak < 2 * 65536 + 4096
        assert budget.used == 0
        client.close()
    finally:
        await server.stop()
