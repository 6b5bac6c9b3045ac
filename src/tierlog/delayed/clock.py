"""Wall clock of the node and the reference it is checked against before dispatching.

Due times are wall-clock milliseconds. A node whose clock is off would deliver early (clock
ahead) or late (behind); late is recoverable, early is not. So before every dispatch batch
the scheduler compares its clock with the reference and does not dispatch while they differ
by more than ``MAX_SKEW_MS``.

The reference is the MetaStore's clock. A MetaStore backend that can tell its time offers
``server_time_ms()``; the SQLite MetaStore lives on this host, so its clock is the host's
kernel clock, read here with the ``clock_gettime`` system call itself: a process whose time
is shifted in user space (an ``LD_PRELOAD`` time faker, a mis-set ``TZ`` does not matter) is
then seen as skewed, as a node with a wrong clock would be.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from typing import Protocol

MAX_SKEW_MS = 500

_SYS_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _raw_clock() -> Callable[[], int] | None:
    number = _SYS_CLOCK_GETTIME.get(os.uname().machine)
    if number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    ts = _Timespec()

    def read() -> int:
        if syscall(number, 0, ctypes.byref(ts)) != 0:  # CLOCK_REALTIME
            return time.time_ns() // 1_000_000
        return ts.tv_sec * 1000 + ts.tv_nsec // 1_000_000

    return read


_HOST = _raw_clock()


def host_clock_ms() -> int:
    """The host kernel's wall clock in ms (bypassing user-space time shifting)."""
    return _HOST() if _HOST is not None else time.time_ns() // 1_000_000


def wall_clock_ms() -> int:
    """This process's wall clock in ms (what due times are compared with)."""
    return time.time_ns() // 1_000_000


class Clock(Protocol):
    def now_ms(self) -> int: ...


class ReferenceClock(Protocol):
    def reference_ms(self) -> int: ...


class WallClock:
    def now_ms(self) -> int:
        return wall_clock_ms()


class MetaStoreClock:
    """The MetaStore's time: ``server_time_ms()`` when the backend has it, else the host
    clock (the SQLite MetaStore's own)."""

    def __init__(self, meta: object) -> None:
        self._server_time: Callable[[], int] | None = getattr(meta, "server_time_ms", None)

    def reference_ms(self) -> int:
        if self._server_time is not None:
            return int(self._server_time())
        return host_clock_ms()


def skew_ms(clock: Clock, reference: ReferenceClock) -> int:
    """Node clock minus reference (positive: the node is ahead)."""
    return clock.now_ms() - reference.reference_ms()


class ReferencedClock:
    """The reference's time read through this process's clock: ``now + offset``, the offset
    measured again every ``refresh_ms``. Acceptance uses it, so a scheduled message's due
    time (``x-delay`` after acceptance) is on the reference's time line even when the node's
    clock is off (it would otherwise come due early once the clock is corrected)."""

    def __init__(self, reference: ReferenceClock, refresh_ms: int = 1000) -> None:
        self.reference = reference
        self.refresh_ms = refresh_ms
        self._offset = 0
        self._measured_at: int | None = None

    def now_ms(self) -> int:
        local = wall_clock_ms()
        if self._measured_at is None or abs(local - self._measured_at) >= self.refresh_ms:
            self._offset = self.reference.reference_ms() - wall_clock_ms()
            self._measured_at = local
        return local + self._offset
