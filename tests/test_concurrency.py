"""The shared pools and timer: per-lane order, no two tasks of a lane at once, round-robin
fairness between lanes, a bounded number of threads, and timers in deadline order."""

from __future__ import annotations

import threading
import time

import pytest

from tierlog.concurrency import SerialPool, SharedTimer


def test_lane_tasks_run_in_order_and_never_at_once() -> None:
    pool = SerialPool(4, "t")
    lanes = [pool.lane(f"l{i}") for i in range(20)]
    seen: dict[int, list[int]] = {i: [] for i in range(20)}
    running = [0] * 20
    overlap = []

    def task(lane: int, n: int) -> int:
        running[lane] += 1
        if running[lane] > 1:
            overlap.append(lane)
        time.sleep(0.0005)
        seen[lane].append(n)
        running[lane] -= 1
        return n

    futures = [lanes[i].submit(task, i, n) for n in range(25) for i in range(20)]
    assert [f.result(10) for f in futures] == [n for n in range(25) for _ in range(20)]
    assert all(seen[i] == list(range(25)) for i in range(20))
    assert not overlap
    assert pool.threads <= 4
    pool.shutdown()


def test_a_busy_lane_does_not_starve_others() -> None:
    pool = SerialPool(1, "t")
    busy, quiet = pool.lane("busy"), pool.lane("quiet")
    order: list[str] = []
    gate = threading.Event()
    busy.submit(gate.wait, 5)  # holds the only thread while the queues fill
    for _ in range(100):
        busy.submit(order.append, "busy")
    done = quiet.submit(order.append, "quiet")
    gate.set()
    done.result(5)
    # the quiet lane ran after at most one more task of the busy lane, not after 100
    assert order.index("quiet") <= 1
    pool.shutdown()


def test_exceptions_reach_the_future_and_the_lane_goes_on() -> None:
    pool = SerialPool(2, "t")
    lane = pool.lane()
    failed = lane.submit(lambda: 1 / 0)
    ok = lane.submit(lambda: 42)
    with pytest.raises(ZeroDivisionError):
        failed.result(5)
    assert ok.result(5) == 42
    lane.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        lane.submit(lambda: None)
    pool.shutdown()


def test_timer_fires_in_deadline_order_and_skips_cancelled() -> None:
    errors: list[BaseException] = []
    timer = SharedTimer("t", errors.append)
    fired: list[str] = []
    done = threading.Event()
    timer.call_later(0.06, lambda: (fired.append("c"), done.set()))
    timer.call_later(0.02, lambda: fired.append("a"))
    cancelled = timer.call_later(0.03, lambda: fired.append("x"))
    timer.call_later(0.04, lambda: 1 / 0)  # reported, the timer goes on
    timer.call_later(0.05, lambda: fired.append("b"))
    cancelled.cancel()
    assert done.wait(5)
    assert fired == ["a", "b", "c"]
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    timer.shutdown()
