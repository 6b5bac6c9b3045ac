"""Retry with capped exponential backoff and full jitter.

Full jitter (sleep uniformly in ``[0, min(cap, base * 2**attempt)]``) spreads retries of many
clients hitting one throttled server, so they do not come back in lock-step. The policy is a
plain value; ``call`` runs one operation under it. The random source is injectable so tests are
deterministic.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tierlog.storage.errors import TransientError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a failed idempotent operation."""

    max_attempts: int = 6  # including the first try
    base_delay_s: float = 0.05
    max_delay_s: float = 5.0
    deadline_s: float = 60.0  # no new attempt starts after this much time
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    def delay(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (1 = the first retry), with full jitter."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return self.rng.uniform(0.0, cap)

    def call(
        self,
        operation: Callable[[], T],
        retryable: Callable[[BaseException], bool] = lambda e: isinstance(e, TransientError),
    ) -> T:
        """Run ``operation``; on a retryable error back off and try again, up to the limits.

        The last error is re-raised unchanged when attempts or time run out.
        """
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return operation()
            except Exception as exc:
                attempt += 1
                if not retryable(exc) or attempt >= self.max_attempts:
                    raise
                pause = self.delay(attempt)
                if time.monotonic() - started + pause > self.deadline_s:
                    raise
                self.sleep(pause)


NO_RETRY = RetryPolicy(max_attempts=1)
