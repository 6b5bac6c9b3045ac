"""Polling a condition until it holds, in a test (sync and async)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def until(
    check: Callable[[], bool | Awaitable[bool]],
    timeout: float = 20.0,
    what: str = "",
    interval: float = 0.05,
) -> None:
    """Poll ``check`` (a plain or an async predicate) until it is true;
    ``AssertionError`` once ``timeout`` seconds have passed without it."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} s: {what or check}")
        await asyncio.sleep(interval)


def wait_until(
    check: Callable[[], bool], timeout: float = 20.0, what: str = "", interval: float = 0.1
) -> None:
    """``until`` for a test without an event loop."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} s: {what or check}")
        time.sleep(interval)
