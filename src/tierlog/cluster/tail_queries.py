"""Committed-tail queries between nodes, on the replication links: a node that serves a
stream it does not lead asks the leader where the stream's committed part ends (and a
producer's last publishing id), so ``next`` / ``last`` and QueryPublisherSequence answer
as on the leader. One ``TAIL_QUERY`` frame, one ``TAIL`` answer; an asker that gets no
answer within its timeout (leader unreachable, or not leading the stream any more)
falls back to what it knows itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tierlog.cluster.link import Link
from tierlog.cluster.link_requests import PendingAnswers, SendFn, answer_in_background
from tierlog.formats import replication as wire

TailAnswerer = Callable[[str, str], Awaitable[wire.Tail | None]]
"""``(stream, reference)`` → this node's answer as the stream's leader (None: it does
not lead it); the request id is filled in here."""


class TailQueries:
    """The asking and the answering side of one node."""

    def __init__(self, send: SendFn) -> None:
        self._pending: PendingAnswers[wire.Tail] = PendingAnswers(send)
        self.answerer: TailAnswerer | None = None
        self.answered = 0

    async def ask(
        self, stream: str, leader: str, reference: str = "", timeout: float = 1.0
    ) -> wire.Tail | None:
        """``leader``'s committed tail of ``stream``; None when no answer came within
        ``timeout`` or the node does not lead the stream."""
        return await self._pending.request(
            leader, lambda i: wire.TailQuery(stream, 0, i, reference), timeout
        )

    @property
    def unanswered(self) -> int:
        """Queries of ours that timed out."""
        return self._pending.unanswered

    def on_frame(self, link: Link, frame: wire.TailQuery | wire.Tail) -> None:
        if isinstance(frame, wire.Tail):
            self._pending.resolve(frame)
            return
        answer_in_background(self._answer(link, frame), "tail")

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
