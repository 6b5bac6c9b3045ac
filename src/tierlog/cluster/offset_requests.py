"""Consumer offsets forwarded between nodes, on the replication links: a node that serves
consumers of a stream it does not lead sends their StoreOffset and QueryOffset to the
leader, so the leader's log stays the one place that holds them while the stream has a
reachable leader. One ``OFFSET_STORE`` or ``OFFSET_QUERY`` frame, one ``OFFSET`` answer
(sent by the leader once a store is written). An asker that gets no answer within its
timeout (leader unreachable, or not leading the stream any more) gets None and falls
back to what it can do itself (the MetaStore offsets).

A store is sent only over an open link: frames for a peer being dialed wait and go out
once it answers, and a store delivered after its asker gave up (and kept the offset in the
MetaStore) could overwrite a newer one stored since. Without a link a query for the same
consumer goes out first, which dials (a late query changes nothing); the store follows
once it is answered, within the same timeout. On one link frames arrive in order, so the
leader writes one node's stores in the order its consumers sent them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tierlog.cluster.link import Link
from tierlog.cluster.link_requests import PendingAnswers, SendFn, answer_in_background
from tierlog.formats import replication as wire

NOT_LEADING = object()
OffsetAnswerer = Callable[[str, str, int | None], Awaitable[object]]
"""``(stream, reference, offset to store or None to query)`` → the consumer's offset on
this node as the stream's leader (after storing it; None: none stored), or
``NOT_LEADING`` when it does not lead the stream."""


class OffsetRequests:
    """The asking and the answering side of one node."""

    def __init__(self, send: SendFn, link_open: Callable[[str], bool]) -> None:
        self._pending: PendingAnswers[wire.Offset] = PendingAnswers(send)
        self._link_open = link_open
        self.answerer: OffsetAnswerer | None = None
        self.answered = 0

    @property
    def unanswered(self) -> int:
        """Requests of ours that timed out."""
        return self._pending.unanswered

    async def ask(
        self, stream: str, leader: str, reference: str, store: int | None, timeout: float
    ) -> wire.Offset | None:
        """Send a store (``store`` is the offset) or a query (None) to ``leader``; its
        answer, or None when none came within ``timeout`` or it does not lead the stream."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if store is not None and not self._link_open(leader):
            opened = await self._pending.request(
                leader, lambda i: wire.OffsetQuery(stream, 0, i, reference), timeout
            )
            if opened is None or not self._link_open(leader):
                return None
        if store is None:
            return await self._pending.request(
                leader, lambda i: wire.OffsetQuery(stream, 0, i, reference), timeout
            )
        return await self._pending.request(
            leader,
            lambda i: wire.OffsetStore(stream, 0, i, reference, store),
            max(0.0, deadline - loop.time()),
        )

    def on_frame(self, link: Link, frame: wire.OffsetFrame) -> None:
        if isinstance(frame, wire.Offset):
            self._pending.resolve(frame)
            return
        answer_in_background(self._answer(link, frame), "offset")

    async def _answer(self, link: Link, request: wire.OffsetStore | wire.OffsetQuery) -> None:
        store = request.offset if isinstance(request, wire.OffsetStore) else None
        found: object = NOT_LEADING
        if self.answerer is not None:
            found = await self.answerer(request.stream, request.reference, store)
        if found is NOT_LEADING:
            answer = wire.Offset(request.stream, 0, request.request_id, False)
        else:
            self.answered += 1
            offset = found if isinstance(found, int) else wire.NO_CHUNK
            answer = wire.Offset(request.stream, 0, request.request_id, True, offset)
        if not link.closed:
            link.send(answer)
