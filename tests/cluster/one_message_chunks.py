"""Publishing one chunk per message, fast: the shape of a log that publishers waiting for
each confirm write (the server writes every Publish run of one producer as one chunk,
so a producer with one message in flight makes one chunk per message).

``publish_one_per_chunk`` runs ``producers`` named producers on one connection, each
with exactly one message in flight: the server's write groups then hold one chunk per
producer, and the log grows by one chunk per message at the rate the leader confirms
them. Shared by the catch-up tests (``test_nodes_catch_up.py``) and the catch-up part
of ``benches/cluster.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tests.server.test_inprocess import AsyncRawClient
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish


def message(producer: int, seq: int) -> bytes:
    """``m``, the producer (3 digits), the sequence (8 digits: ``nodes.id_of`` reads
    it), padding: about the size of a small event."""
    return b"m%03d%08d-" % (producer, seq) + b"x" * 100


@dataclass
class OnePerChunk:
    """What a run confirmed: messages (each its own chunk) and the seconds it took."""

    confirmed: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.confirmed / self.seconds if self.seconds > 0 else 0.0


async def publish_one_per_chunk(
    port: int, stream: str, count: int, *, producers: int = 16, name: str = "one"
) -> OnePerChunk:
    """Publish ``count`` messages to ``stream`` through the node at ``port`` (its
    leader), one message in flight per producer, until all are confirmed. Raises on a
    refusal: the tests and the bench want exactly ``count`` one-message chunks."""
    client = await AsyncRawClient.connect(port)
    try:
        for pid in range(producers):
            answer = await client.request(
                c.DeclarePublisherRequest(client.next_corr(), pid, f"{name}-{pid}", stream)
            )
            if answer.response_code != ResponseCode.OK:
                raise RuntimeError(f"declare publisher {pid}: {answer}")
        sent = 0
        confirmed = 0
        seq = [0] * producers
        started = time.monotonic()

        def send(pid: int) -> None:
            nonlocal sent
            seq[pid] += 1
            sent += 1
            client.send(encode_publish(pid, [(seq[pid], message(pid, seq[pid]))]))

        for pid in range(min(producers, count)):
            send(pid)
        while confirmed < count:
            frame = await client.frame(timeout=30.0)
            if isinstance(frame, PublishError):
                raise RuntimeError(f"publish refused: {frame.errors}")
            if not isinstance(frame, PublishConfirm):
                continue
            confirmed += len(frame.publishing_ids)
            if sent < count:
                send(frame.publisher_id)
        return OnePerChunk(confirmed, time.monotonic() - started)
    finally:
        client.close()
