"""Committed-tail queries between nodes, on the replication links: a node that serves a
stream it does not lead asks the leader where the stream's committed part ends (and a
producer's last publishing id), so ``next`` / ``last`` and QueryPublisherSequence answer
as on the leader. One ``TAIL_QUERY`` frame, one ``TAIL`` answer; an asker that gets no
answer within its timeout (leader unreachable, or not leading the stream any more)
falls back to what it knows itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tierlog.cluster.link import Link
from tierlog.formats import replication as wire
from tierlog.logs import get_logger

log = get_logger(__name__)

TailAnswerer = Callable[[str, str], Awaitable[wire.Tail | None]]
"""``(stream, reference)`` → this node's answer as the stream's leader (None: it does
not lead it); the request id is filled in here."""

SendFn = Callable[[str, wire.Frame], None]


class TailQueries:
    """The asking and the answering side of one node."""

    def __init__(self, send: SendFn) -> None:
        self._send = send
        self.answerer: TailAnswerer | None = None
        self._waiters: dict[int, asyncio.Future[wire.Tail]] = {}
        self._ids = 0
        self.answered = 0
        self.unanswered = 0  # queries of ours that timed out

    async def ask(
        self, stream: str, leader: str, reference: str = "", timeout: float = 1.0
    ) -> wire.Tail | None:
        """``leader``'s committed tail of ``stream``; None when no answer came within
        ``timeout`` or the node does not lead the stream."""
        self._ids = (self._ids + 1) & 0xFFFFFFFF
        request_id = self._ids
        waiter: asyncio.Future[wire.Tail] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        try:
            self._send(leader, wire.TailQuery(stream, 0, request_id, reference))
            answer = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            self.unanswered += 1
            return None
        finally:
            self._waiters.pop(request_id, None)
        return answer if answer.leads else None

    def on_frame(self, link: Link, frame: wire.TailQuery | wire.Tail) -> None:
        if isinstance(frame, wire.Tail):
            waiter = self._waiters.get(frame.request_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(frame)
            return
        task = asyncio.get_running_loop().create_task(self._answer(link, frame))
        task.add_done_callback(_log_failure)

    async def _answer(self, link: Link, query: wire.TailQuery) -> None:
        answer = None
        if self.answerer is not None:
            answer = await self.answerer(query.stream, query.reference)
        if answer is None:
            answer = wire.Tail(query.stream, 0, query.request_id, False)
        else:
            self.answered += 1
            answer = wire.Tail(
                query.stream,
                answer.epoch,
                query.request_id,
                True,
                answer.commit_chunk_id,
                answer.next_offset,
                answer.last_user_chunk_id,
                answer.sequence,
            )
        if not link.closed:
            link.send(answer)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("replication_tail_answer_failed", error=repr(task.exception()))
