"""A byte budget shared by every stream's uploads: bounds fragment-building memory.

Each upload holds a whole fragment in memory while it is built and PUT. Per stream
that is bounded by ``max_uploads``, but during an upload backlog across many streams
it is ``streams * max_uploads * fragment size``. Uploads acquire their fragment's
size here first and wait while the budget is used up; a fragment larger than the whole
budget proceeds alone (when nothing else is held), so no upload waits forever.
"""

from __future__ import annotations

import threading


class ByteBudget:
    """Blocking byte counting semaphore for upload threads."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a byte budget needs a positive capacity")
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.waits = 0
        self._cond = threading.Condition()

    def acquire(self, size: int, timeout: float | None = None) -> bool:
        """Reserve ``size`` bytes; False when ``timeout`` passed first."""
        with self._cond:
            if not self._fits(size):
                self.waits += 1
                if not self._cond.wait_for(lambda: self._fits(size), timeout):
                    return False
            self.used += size
            self.peak = max(self.peak, self.used)
            return True

    def release(self, size: int) -> None:
        with self._cond:
            self.used -= size
            self._cond.notify_all()

    def _fits(self, size: int) -> bool:
        return self.used == 0 or self.used + size <= self.capacity
