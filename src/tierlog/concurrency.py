"""Thread pools and timers shared by every stream of a process.

A node holds thousands of streams, most of them idle, so nothing here starts a thread
per stream: a ``SerialPool`` runs many *lanes* (one per stream) on a fixed number of
threads, each lane's tasks in submission order and never two at once, and a
``SharedTimer`` runs every stream's timers on one thread.

Fairness: a worker takes one task of the lane at the head of the ready queue and puts
the lane back at the tail if it has more, so a busy stream gets one task in turn
with every other stream that has work (round robin), never the whole pool.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Lane(Executor):
    """One serial queue of a ``SerialPool`` (an ``Executor``, so ``run_in_executor``
    takes it): tasks run in submission order, one at a time, on the pool's threads."""

    def __init__(self, pool: SerialPool, name: str) -> None:
        self._pool = pool
        self.name = name
        self._tasks: deque[_Task] = deque()
        self._queued = False  # in the pool's ready queue
        self._running = False
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._pool._submit(self, (future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new tasks; with ``wait`` block until the queued ones ran (never call it
        from a task of this lane)."""
        self._pool._close_lane(self, wait, cancel_futures)

    @property
    def idle(self) -> bool:
        return not self._tasks and not self._running

    def try_enter(self) -> bool:
        """Take the lane for the calling thread if nothing is queued or running on it:
        the caller then runs its task inline (in order with the lane's others, never two
        at once) and must call ``leave``. False when the lane is busy or shut down."""
        with self._pool._cond:
            if self._running or self._queued or self._tasks or self._closed:
                return False
            self._running = True
            return True

    def leave(self) -> None:
        """End an inline task taken with ``try_enter``; tasks submitted meanwhile run."""
        pool = self._pool
        with pool._cond:
            self._running = False
            if self._tasks:
                self._queued = True
                pool._ready.append(self)
                pool._wake()
            elif pool._idle_waiters:
                pool._cond.notify_all()  # lane shutdown(wait=True) waits for idle


class SerialPool:
    """``workers`` threads (started on demand, then kept) shared by any number of lanes."""

    def __init__(self, workers: int, name: str) -> None:
        if workers < 1:
            raise ValueError(f"{name}: workers must be >= 1, got {workers}")
        self.workers = workers
        self.name = name
        self._cond = threading.Condition()
        self._ready: deque[Lane] = deque()
        self._threads: list[threading.Thread] = []
        self._waiting = 0  # idle worker threads
        self._idle_waiters = 0  # callers of a lane's shutdown(wait=True) (woken per task)
        self._shutdown = False

    def lane(self, name: str = "") -> Lane:
        return Lane(self, name)

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _submit(self, lane: Lane, task: _Task) -> None:
        with self._cond:
            if lane._closed or self._shutdown:
                raise RuntimeError(f"{self.name}: lane {lane.name!r} is shut down")
            lane._tasks.append(task)
            if not lane._queued and not lane._running:
                lane._queued = True
                self._ready.append(lane)
                self._wake()

    def _wake(self) -> None:
        if self._waiting:
            if self._idle_waiters:  # notify() might wake a lane's shutdown waiter instead
                self._cond.notify_all()
            else:
                self._cond.notify()
        elif len(self._threads) < self.workers:
            thread = threading.Thread(
                target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._ready:
                    if self._shutdown:
                        return
                    self._waiting += 1
                    cond.wait()
                    self._waiting -= 1
                lane = self._ready.popleft()
                lane._queued = False
                if not lane._tasks:  # its tasks were cancelled by shutdown
                    cond.notify_all()
                    continue
                future, fn, args, kwargs = lane._tasks.popleft()
                lane._running = True
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs
            with cond:
                lane._running = False
                if lane._tasks:  # back of the queue: every other ready lane goes first
                    lane._queued = True
                    self._ready.append(lane)
                    self._wake()
                elif self._idle_waiters:
                    cond.notify_all()  # lane shutdown(wait=True) waits for idle

    def _close_lane(self, lane: Lane, wait: bool, cancel_futures: bool) -> None:
        with self._cond:
            lane._closed = True
            if cancel_futures:
                while lane._tasks:
                    lane._tasks.popleft()[0].cancel()
            if wait:
                self._idle_waiters += 1
                try:
                    while lane._tasks or lane._running:
                        if not self._threads:
                            break
                        self._cond.wait(0.5)
                finally:
                    self._idle_waiters -= 1

    def shutdown(self, wait: bool = True) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()


class TimerHandle:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SharedTimer:
    """Every stream's timers on one thread (a heap). Callbacks must be short: they post
    work to a pool, they never do it. A callback's exception goes to ``on_error`` (the
    owner logs it) and the timer thread goes on."""

    def __init__(
        self,
        name: str,
        on_error: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.on_error = on_error
        self.clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._shutdown = False

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(self.clock() + max(0.0, delay), callback)
        with self._cond:
            if self._shutdown:
                handle.cancelled = True
                return handle
            heapq.heappush(self._heap, (handle.when, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is handle:
                self._cond.notify()
        return handle

    @property
    def pending(self) -> int:
        return len(self._heap)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._shutdown:
                        return
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        cond.wait()
                        continue
                    delay = self._heap[0][0] - self.clock()
                    if delay <= 0:
                        handle = heapq.heappop(self._heap)[2]
                        break
                    cond.wait(delay)
            try:
                handle.callback()
            except Exception as exc:
                self.on_error(exc)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._heap.clear()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
