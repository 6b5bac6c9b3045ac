"""Health of one stream's tiering tasks: what is in flight, since when, and whether uploads
or commits keep failing.

Tiering failures are retried by the state machine with backoff, so a stream can be stuck
behind an object-store outage for a long time without anything "failing" for good. This
record makes that visible: the stream is *degraded* from its first failed task until the
next successful one (with the time it started and the last error), and a watchdog reports
any upload or commit in flight longer than ``stall_seconds`` (a hung request, a lost
thread) once per task, with an error log line and a counter.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from tierlog.logs import get_logger

log = get_logger("tierlog.tiering.health")


class TaskHealth:
    def __init__(
        self,
        stream: str,
        stall_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.stream = stream
        self.stall_seconds = stall_seconds
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._in_flight: dict[int, tuple[str, float]] = {}  # token -> (name, started)
        self._reported: set[int] = set()
        self.degraded_since: float | None = None  # wall-clock seconds
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self.failures: dict[str, int] = {"upload": 0, "commit": 0}
        self._failing: set[str] = set()  # task kinds whose latest outcome was a failure
        self.stalls = 0
        self._behind_since: float | None = None

    # -- tasks --------------------------------------------------------------------------
    def started(self, name: str) -> int:
        with self._lock:
            token = next(self._ids)
            self._in_flight[token] = (name, self._clock())
            return token

    def finished(self, token: int) -> None:
        with self._lock:
            self._in_flight.pop(token, None)
            self._reported.discard(token)

    def failed(self, what: str, text: str) -> None:
        """An upload or commit failed (it will be retried or the stream halts)."""
        with self._lock:
            self.failures[what] = self.failures.get(what, 0) + 1
            self._failing.add(what)
            self.consecutive_failures += 1
            self.last_error = text if len(text) <= 500 else text[:500] + "..."
            first = self.degraded_since is None
            if first:
                self.degraded_since = self._wall()
        if first:
            log.warning("tiering_degraded", stream=self.stream, task=what, error=self.last_error)

    def succeeded(self, what: str) -> None:
        """An upload or commit succeeded: the stream stays degraded while the other kind of
        task is still failing (uploads can succeed while every commit fails)."""
        with self._lock:
            self._failing.discard(what)
            was = self.degraded_since
            if self._failing or was is None:
                return
            self.degraded_since = None
            failures, self.consecutive_failures = self.consecutive_failures, 0
        if was is not None:
            log.info(
                "tiering_recovered",
                stream=self.stream,
                failures=failures,
                degraded_seconds=round(self._wall() - was, 1),
            )

    @property
    def degraded(self) -> bool:
        return self.degraded_since is not None

    # -- the watchdog -------------------------------------------------------------------
    def check_stalls(self) -> list[str]:
        """Report (once each) tasks in flight longer than ``stall_seconds``; returns them."""
        now = self._clock()
        stalled: list[tuple[int, str, float]] = []
        with self._lock:
            for token, (name, started) in self._in_flight.items():
                if now - started > self.stall_seconds and token not in self._reported:
                    self._reported.add(token)
                    stalled.append((token, name, now - started))
            self.stalls += len(stalled)
        for _token, name, age in stalled:
            log.error("tiering_task_stalled", stream=self.stream, task=name, seconds=round(age))
        return [name for _t, name, _a in stalled]

    def oldest_in_flight_seconds(self) -> float:
        now = self._clock()
        with self._lock:
            return max((now - started for _n, started in self._in_flight.values()), default=0.0)

    # -- lag in time --------------------------------------------------------------------
    def note_lag(self, lag_bytes: int) -> None:
        """Called as lag changes: remembers since when the remote tier is behind."""
        if lag_bytes <= 0:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = self._clock()

    def lag_seconds(self) -> float:
        """Seconds since the remote tier last held everything committed locally."""
        since = self._behind_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def status(self) -> dict[str, object]:
        with self._lock:
            return {
                "degraded": self.degraded_since is not None,
                "degraded_since": self.degraded_since,
                "last_error": self.last_error if self.degraded_since is not None else None,
                "consecutive_failures": self.consecutive_failures,
                "upload_failures": self.failures.get("upload", 0),
                "commit_failures": self.failures.get("commit", 0),
                "stalled_tasks": self.stalls,
                "tasks_in_flight": len(self._in_flight),
                "lag_seconds": round(self.lag_seconds(), 3),
            }
