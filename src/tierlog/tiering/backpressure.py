"""Back-pressure: the one rule deciding when a stream's publishers must wait.

A stream is over its limits when more committed bytes than ``max_lag_bytes`` are not
yet durable in the remote tier, or when free disk under the stream directory falls
below ``min_free_disk_bytes``. Appending on would only fill the disk, so the caller
reacts: the server throttles publishers (it never fails them), a library user of the
tierer gets ``BackPressureError`` from the log's append gate. Either way the decision
and the alarm (``active``, counted in ``events``) come from here.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from tierlog.logs import get_logger

log = get_logger(__name__)


def free_disk_below(path: str, floor: int) -> int | None:
    """The free bytes of the file system holding ``path`` when below ``floor``, else None
    (a floor of 0 turns the check off without a system call)."""
    if floor <= 0:
        return None
    free = shutil.disk_usage(path).free
    return free if free < floor else None


@dataclass
class BackPressure:
    """The limits of one stream and its alarm state."""

    stream: str
    path: str
    max_lag_bytes: int | None = None
    min_free_disk_bytes: int = 0
    active: bool = False
    events: int = 0

    def reason(self, lag_bytes: int) -> str | None:
        """Why publishers must wait now (None when they need not)."""
        if self.max_lag_bytes is not None and lag_bytes > self.max_lag_bytes:
            return f"{lag_bytes} bytes not yet tiered (limit {self.max_lag_bytes})"
        free = free_disk_below(self.path, self.min_free_disk_bytes)
        if free is not None:
            return f"free disk {free} below floor {self.min_free_disk_bytes}"
        return None

    def check(self, lag_bytes: int) -> str | None:
        """Evaluate the rule and update the alarm; returns the reason when over limits.

        Every evaluation that finds the stream over its limits counts one event (each
        refused append, or each throttling poll); the first one logs a warning.
        """
        reason = self.reason(lag_bytes)
        if reason is None:
            self.active = False
            return None
        if not self.active:
            log.warning("tiering_backpressure", stream=self.stream, reason=reason)
        self.active = True
        self.events += 1
        return reason
