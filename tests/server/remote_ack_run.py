"""Publishing with confirms to a running ``tierlog serve`` and reading everything back:
the parts shared by the ``ack = remote`` tests and ``benches/cluster.py``.

``publish_for`` sends frames of a named producer for a while, keeping a bounded number
of messages in flight, and returns the confirmed publishing ids with each one's confirm
latency; ``read_all`` reads a stream from its first offset with rstream until it has
been quiet for a moment; ``check_oracle`` says what is wrong (lost, duplicated, out of
order, altered), if anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.server.test_inprocess import AsyncRawClient
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish


def body(seq: int) -> bytes:
    return b"msg-%08d-" % seq + bytes([seq % 251]) * 200


@dataclass
class Published:
    confirmed: set[int] = field(default_factory=set)
    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    next_seq: int = 1

    def p99_ms(self) -> float:
        if not self.latencies:
            raise ValueError("nothing confirmed")
        ordered = sorted(self.latencies)
        return 1000.0 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def create(port: int, stream: str, arguments: dict[str, str]) -> None:
    client = await AsyncRawClient.connect(port)
    try:
        response = await client.request(c.CreateRequest(client.next_corr(), stream, arguments))
        assert response.response_code == ResponseCode.OK, response
    finally:
        client.close()


async def publish_for(
    port: int,
    stream: str,
    seconds: float,
    *,
    producer: str = "remote-ack-producer",
    batch: int = 10,
    in_flight: int = 200,
    state: Published | None = None,
) -> Published:
    """Publish batches of ``batch`` messages for ``seconds`` with at most ``in_flight``
    unconfirmed, then wait (bounded) for the last confirms."""
    out = state or Published()
    client = await AsyncRawClient.connect(port)
    try:
        response = await client.request(
            c.DeclarePublisherRequest(client.next_corr(), 1, producer, stream)
        )
        assert response.response_code == ResponseCode.OK, response
        sent_at: dict[int, float] = {}
        stop = time.monotonic() + seconds

        def take(frame: object) -> None:
            now = time.monotonic()
            if isinstance(frame, PublishConfirm):
                for pid in frame.publishing_ids:
                    out.confirmed.add(pid)
                    started = sent_at.pop(pid, None)
                    if started is not None:
                        out.latencies.append(now - started)
            elif isinstance(frame, PublishError):
                out.refused += len(frame.errors)
                for pid, _code in frame.errors:
                    sent_at.pop(pid, None)

        # the server may go away (a kill): what was confirmed is in ``out``
        with contextlib.suppress(ConnectionError, OSError):
            await _publish_loop(client, out, sent_at, stop, batch, in_flight, take)
    finally:
        client.close()
    return out


async def _publish_loop(
    client: AsyncRawClient,
    out: Published,
    sent_at: dict[int, float],
    stop: float,
    batch: int,
    in_flight: int,
    take: Callable[[object], None],
) -> None:
    while time.monotonic() < stop:
        if len(sent_at) + batch <= in_flight:
            ids = range(out.next_seq, out.next_seq + batch)
            now = time.monotonic()
            for pid in ids:
                sent_at[pid] = now
            client.send(encode_publish(1, [(pid, body(pid)) for pid in ids]))
            out.next_seq += batch
        with contextlib.suppress(TimeoutError):
            take(await client.frame(timeout=0.005 if len(sent_at) < in_flight else 1.0))
    deadline = time.monotonic() + 10.0
    while sent_at and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            take(await client.frame(timeout=1.0))


async def read_all(
    port: int, stream: str, quiet: float = 3.0, limit: float = 60.0
) -> list[tuple[int, bytes]]:
    """Every message of ``stream`` from its first offset (rstream), until no message
    came for ``quiet`` seconds."""
    from rstream import ConsumerOffsetSpecification, OffsetType
    from rstream.consumer import Consumer, MessageContext

    got: list[tuple[int, bytes]] = []
    last = [time.monotonic()]

    async def on_message(msg: object, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))  # type: ignore[call-overload]
        last[0] = time.monotonic()

    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await consumer.start()
    started = time.monotonic()
    try:
        await consumer.subscribe(
            stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
        )
        while time.monotonic() - last[0] < quiet and time.monotonic() - started < limit:
            await asyncio.sleep(0.1)
    finally:
        await consumer.close()
    return got


def check_oracle(confirmed: set[int], got: list[tuple[int, bytes]]) -> list[str]:
    """Problems with what was read back: every confirmed message exactly once, in order,
    unaltered (unconfirmed ones may or may not be there, once at most)."""
    problems = []
    seqs = []
    for offset, payload in got:
        seq = int(payload[4:12])
        if payload != body(seq):
            problems.append(f"offset {offset}: payload of {seq} altered")
        seqs.append(seq)
    offsets = [o for o, _ in got]
    if offsets != sorted(set(offsets)):
        problems.append("offsets served twice or out of order")
    if len(seqs) != len(set(seqs)):
        problems.append(f"{len(seqs) - len(set(seqs))} messages stored twice")
    if seqs != sorted(seqs):
        problems.append("messages out of publish order")
    lost = confirmed - set(seqs)
    if lost:
        problems.append(f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}")
    return problems
