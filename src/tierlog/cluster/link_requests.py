"""Requests between nodes on the replication links that wait for one answer frame (a
committed tail, a consumer offset): the request ids, the futures waiting for their
answers, the time-outs, and the task that computes an answer for a peer.

An asker that gets no answer within its timeout, or an answer saying the peer does not
lead the stream, gets None and falls back to what it can do itself; a late answer finds
no waiter and is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from tierlog.formats import replication as wire
from tierlog.logs import get_logger

log = get_logger(__name__)

SendFn = Callable[[str, wire.Frame], None]


class AnswerFrame(Protocol):
    @property
    def request_id(self) -> int: ...

    @property
    def leads(self) -> bool: ...


A = TypeVar("A", bound=AnswerFrame)


class PendingAnswers(Generic[A]):
    """This node's requests waiting for answers of type ``A``."""

    def __init__(self, send: SendFn) -> None:
        self._send = send
        self._waiters: dict[int, asyncio.Future[A]] = {}
        self._ids = 0
        self.unanswered = 0  # requests of ours that timed out

    async def request(
        self, peer: str, frame: Callable[[int], wire.Frame], timeout: float
    ) -> A | None:
        """Send ``frame(request id)`` to ``peer``; its answer when the peer leads the
        stream, else None (also when none came within ``timeout``)."""
        self._ids = (self._ids + 1) & 0xFFFFFFFF
        request_id = self._ids
        waiter: asyncio.Future[A] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        try:
            self._send(peer, frame(request_id))
            answer = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            self.unanswered += 1
            return None
        finally:
            self._waiters.pop(request_id, None)
        return answer if answer.leads else None

    def resolve(self, answer: A) -> None:
        """An answer arrived: wake its request (a late one finds nobody)."""
        waiter = self._waiters.get(answer.request_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)


def answer_in_background(work: Coroutine[Any, Any, None], kind: str) -> None:
    """Compute and send an answer of ``kind`` off the frame handler; a failure is logged
    (the asker times out and falls back)."""

    def done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("replication_answer_failed", kind=kind, error=repr(task.exception()))

    asyncio.get_running_loop().create_task(work).add_done_callback(done)
