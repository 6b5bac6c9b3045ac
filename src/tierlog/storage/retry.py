"""The one retry policy of every object-store call: which failures are retried, how long to
wait, and who hears about each retry.

- Transient failures (5xx, 429/503 SlowDown, connection reset or refused, timeouts, a body cut
  short) are retried; everything else surfaces at once. Each transient error carries a
  ``kind`` so operators see *what* fails, not just that something did.
- Backoff is exponential with full jitter (sleep uniformly in ``[0, min(cap, base * 2**n)]``):
  many clients hitting one throttled server do not come back in lock-step.
- A call ends after ``max_attempts`` tries or when the next pause would pass its
  ``deadline_s``, whichever comes first; the last error is re-raised unchanged.
- Every retried failure is reported to a ``RetryObserver``: by default one that logs a
  rate-limited structured warning and counts retries by (operation, kind) for the metrics.

The random source and sleep are injectable so tests are deterministic.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from tierlog.logs import get_logger
from tierlog.storage.errors import TransientError

T = TypeVar("T")

log = get_logger("tierlog.storage.retry")

# Kinds of transient failure (the ``kind`` label of the retry metric and warning).
KIND_THROTTLED = "throttled"  # 429, 503 SlowDown: refused, not applied
KIND_SERVER_ERROR = "server_error"  # 500, 502, 504 and other retryable statuses
KIND_CONNECTION = "connection"  # reset, refused, closed before an answer
KIND_TIMEOUT = "timeout"
KIND_INCOMPLETE_BODY = "incomplete_body"
KIND_IO = "io"  # local disk: ENOSPC, EIO, ...
KIND_OTHER = "other"


def error_kind(exc: BaseException) -> str:
    """The kind of a transient error: its ``kind`` attribute, else guessed from its text."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str) and kind:
        return kind
    return kind_from_text(str(exc))


def kind_from_text(text: str) -> str:
    """Best-effort kind of a client error message without an HTTP status."""
    lower = text.lower()
    if "timed out" in lower or "timeout" in lower or "deadline" in lower:
        return KIND_TIMEOUT
    if (
        "incomplete" in lower
        or "unexpected eof" in lower
        or "end of file before message length" in lower
        or "body" in lower
    ):
        return KIND_INCOMPLETE_BODY
    if (
        "connect" in lower
        or "reset" in lower
        or "refused" in lower
        or "broken pipe" in lower
        or "closed" in lower
        or "sending request" in lower
    ):
        return KIND_CONNECTION
    return KIND_OTHER


class RetryObserver(Protocol):
    """Hears about every failure that is about to be retried."""

    def on_retry(self, op: str, key: str, attempt: int, kind: str, error: BaseException) -> None:
        """``attempt`` is the number of the try that failed (1 = the first try)."""


class RetryLog:
    """The default observer: counts retries by (operation, kind) and logs a structured warning
    per retried failure, at most ``burst`` per ``interval_s`` for each (operation, kind); the
    next warning after a quiet spell says how many were suppressed.

    Thread-safe: object-store calls run on thread pools."""

    def __init__(self, interval_s: float = 10.0, burst: int = 5) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._window: dict[tuple[str, str], tuple[float, int, int]] = {}  # start, logged, dropped
        self.listeners: list[RetryObserver] = []

    def configure(self, interval_s: float, burst: int) -> None:
        """New limits; the rate-limit windows start afresh (counts are kept)."""
        with self._lock:
            self.interval_s = interval_s
            self.burst = burst
            self._window.clear()

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)

    def on_retry(self, op: str, key: str, attempt: int, kind: str, error: BaseException) -> None:
        label = (op, kind)
        now = time.monotonic()
        with self._lock:
            self.counts[label] += 1
            start, logged, dropped = self._window.get(label, (now, 0, 0))
            if now - start >= self.interval_s:
                start, logged = now, 0
            emit = logged < self.burst
            suppressed = dropped if emit else 0
            if emit:
                self._window[label] = (start, logged + 1, 0)
            else:
                self._window[label] = (start, logged, dropped + 1)
        if emit:
            log.warning(
                "object_store_retry",
                op=op,
                key=key,
                attempt=attempt,
                kind=kind,
                suppressed=suppressed,
                error=_one_line(error),
            )
        for listener in list(self.listeners):
            listener.on_retry(op, key, attempt, kind, error)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= 300 else line[:300] + "..."


RETRY_LOG = RetryLog()
"""The process-wide observer of object-store retries (the metrics read its counts)."""


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TransientError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a failed operation."""

    max_attempts: int = 6  # including the first try
    base_delay_s: float = 0.05
    max_delay_s: float = 5.0
    deadline_s: float = 60.0  # no new attempt starts after this much time
    observer: RetryObserver | None = field(default=RETRY_LOG, compare=False, repr=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    def delay(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (1 = the first retry), with full jitter."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return self.rng.uniform(0.0, cap)

    def with_deadline(self, deadline_s: float, max_attempts: int | None = None) -> RetryPolicy:
        """The same policy with another per-call deadline (start-up rides out longer faults)."""
        return replace(
            self,
            deadline_s=deadline_s,
            max_attempts=self.max_attempts if max_attempts is None else max_attempts,
        )

    def call(
        self,
        operation: Callable[[], T],
        retryable: Callable[[BaseException], bool] = _is_transient,
        *,
        op: str = "",
        key: str = "",
        kind_of: Callable[[BaseException], str] = error_kind,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> T:
        """Run ``operation``; on a retryable error back off and try again, up to the limits.

        ``on_failure`` sees every failed try (retried or not) before the decision, so callers
        can remember that an earlier try's outcome is unknown. The last error is re-raised
        unchanged when attempts or time run out."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return operation()
            except Exception as exc:
                attempt += 1
                if on_failure is not None:
                    on_failure(exc)
                if not retryable(exc) or attempt >= self.max_attempts:
                    raise
                pause = self.delay(attempt)
                if time.monotonic() - started + pause > self.deadline_s:
                    raise
                if self.observer is not None:
                    self.observer.on_retry(op, key, attempt, kind_of(exc), exc)
                self.sleep(pause)


NO_RETRY = RetryPolicy(max_attempts=1)


def retry_until(
    deadline_s: float,
    operation: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy | None = None,
    retryable: Callable[[BaseException], bool] = _is_transient,
) -> T:
    """Run a start-up step until it succeeds or ``deadline_s`` passes: transient failures
    (including calls that ran out of their own retries) are retried with the policy's
    backoff, reported as ``op=what``."""
    policy = policy or RetryPolicy()
    unbounded = replace(policy, max_attempts=1 << 30, deadline_s=deadline_s, max_delay_s=2.0)
    return unbounded.call(operation, retryable, op=what)
