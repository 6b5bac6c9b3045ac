"""A lane can be entered inline by the caller's thread when it is idle: never while one of
its tasks runs or waits, and tasks submitted meanwhile run after it leaves, in order."""

from __future__ import annotations

import threading
import time

from tierlog.concurrency import SerialPool


def test_inline_entry_excludes_the_lanes_own_tasks() -> None:
    pool = SerialPool(2, "t")
    lane = pool.lane("s")
    try:
        assert lane.try_enter()
        assert not lane.try_enter()  # one inline user at a time
        order: list[str] = []
        future = lane.submit(order.append, "task")
        time.sleep(0.05)
        assert order == []  # queued behind the inline user, not run beside it
        order.append("inline")
        lane.leave()
        future.result(timeout=5)
        assert order == ["inline", "task"]

        started = threading.Event()
        release = threading.Event()

        def busy() -> None:
            started.set()
            release.wait(5)

        running = lane.submit(busy)
        started.wait(5)
        assert not lane.try_enter()  # a task is running
        release.set()
        running.result(timeout=5)
        deadline = time.monotonic() + 5
        while not lane.try_enter():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        lane.leave()
        lane.shutdown(wait=True)
        assert not lane.try_enter()  # shut down
    finally:
        pool.shutdown()
