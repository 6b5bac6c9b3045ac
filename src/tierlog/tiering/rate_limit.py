"""A shared bytes-per-second limit for uploads (optional; None means unlimited)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """Callers reserve bytes and sleep until the reservation fits the rate.

    Reservations are serialised by a lock, so concurrent uploads together stay within
    ``bytes_per_second`` (averaged over one reservation), without a background thread.
    """

    def __init__(
        self,
        bytes_per_second: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be positive")
        self.rate = float(bytes_per_second)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._free_at = 0.0

    def acquire(self, nbytes: int) -> float:
        """Block until ``nbytes`` may be sent; returns the time waited."""
        with self._lock:
            now = self._clock()
            start = max(now, self._free_at)
            self._free_at = start + nbytes / self.rate
            wait = start - now
        if wait > 0:
            self._sleep(wait)
        return wait
