"""The kill -9 campaign: ``tierlog serve`` (a real subprocess) is killed at random moments
while a named producer publishes to a tiered stream (small fragments, small segments, a
tiny local limit so reading crosses tiers). After each restart the producer asks the
server for its last stored publishing id and resends everything after it that was not
confirmed. Oracle: every confirmed message is read back exactly once, in order (and no
message is stored twice).

Used by ``tests/faults/test_kill.py`` (a few cycles in CI) and ``scripts/kill_campaign.py``
(100 cycles for the record).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.registry import CrashPoint, register_crash_point
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_inprocess import AsyncRawClient
from tests.support.streams import TIERED_AWAY
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish

STREAM = "killed"
PRODUCER = "campaign-producer"
STREAM_ARGS = dict(TIERED_AWAY)
CONFIG = """
[tier]
retention_interval_seconds = 0.2
local_retention_interval_seconds = 0.2
delete_grace_seconds = 0.0
"""

register_crash_point(
    CrashPoint(
        "serve-random",
        "tierlog serve killed with SIGKILL at a random moment of publish + tiering + local "
        "retention (fragment upload, manifest commit, segment roll, fsync all in flight)",
    )
)


@dataclass
class CampaignResult:
    cycles: int = 0
    confirmed: int = 0
    resent: int = 0
    read_back: int = 0
    refused_publishes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def body(seq: int) -> bytes:
    return b"msg-%08d-" % seq + bytes([seq % 251]) * 300


async def _publish_until_killed(
    server: TierlogServerProcess,
    state: dict[str, object],
    result: CampaignResult,
    rng: random.Random,
    first_cycle: bool,
) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    if first_cycle:
        response = await client.request(c.CreateRequest(client.next_corr(), STREAM, STREAM_ARGS))
        assert response.response_code == ResponseCode.OK, response
    response = await client.request(
        c.DeclarePublisherRequest(client.next_corr(), 1, PRODUCER, STREAM)
    )
    assert response.response_code == ResponseCode.OK, response
    stored = await client.request(
        c.QueryPublisherSequenceRequest(client.next_corr(), PRODUCER, STREAM),
        c.QueryPublisherSequenceResponse,
    )
    last_stored = int(stored.sequence)
    confirmed: set[int] = state["confirmed"]  # type: ignore[assignment]
    next_seq = int(state["next_seq"])  # type: ignore[arg-type]
    # resend the tail: everything sent after the last stored id (unconfirmed by definition)
    resend_from = last_stored + 1
    result.resent += max(0, next_seq - resend_from)
    seq = resend_from
    kill_at = time.monotonic() + rng.uniform(0.3, 1.5)
    while time.monotonic() < kill_at:
        batch = [(s, body(s)) for s in range(seq, seq + 20)]
        client.send(encode_publish(1, batch))
        seq += 20
        state["next_seq"] = max(int(state["next_seq"]), seq)  # type: ignore[arg-type]
        try:
            while True:
                frame = await client.frame(timeout=0.02)
                if isinstance(frame, PublishConfirm):
                    confirmed.update(frame.publishing_ids)
                elif isinstance(frame, PublishError):
                    result.refused_publishes += len(frame.errors)
        except TimeoutError:
            pass
    server.kill()  # SIGKILL mid-flight
    client.close()


async def _read_all(server: TierlogServerProcess) -> list[tuple[int, bytes]]:
    from rstream import ConsumerOffsetSpecification, OffsetType
    from rstream.consumer import Consumer, MessageContext

    got: list[tuple[int, bytes]] = []
    last = [time.monotonic()]

    async def on_message(msg: object, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))  # type: ignore[call-overload]
        last[0] = time.monotonic()

    consumer = Consumer("127.0.0.1", port=server.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(
            STREAM, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
        )
        while time.monotonic() - last[0] < 3.0:
            await asyncio.sleep(0.2)
    finally:
        await consumer.close()
    return got


async def run_campaign(workdir: Path, cycles: int, seed: int = 0) -> CampaignResult:
    rng = random.Random(seed)
    result = CampaignResult()
    started = time.monotonic()
    server = TierlogServerProcess(workdir / "data", config_text=CONFIG)
    state: dict[str, object] = {"confirmed": set(), "next_seq": 1}
    try:
        for cycle in range(cycles):
            server.start()
            await _publish_until_killed(server, state, result, rng, first_cycle=cycle == 0)
            result.cycles += 1
        server.start()
        got = await _read_all(server)
        server.stop()
    finally:
        server.kill()
    confirmed: set[int] = state["confirmed"]  # type: ignore[assignment]
    result.confirmed = len(confirmed)
    result.read_back = len(got)
    seqs = []
    for offset, payload in got:
        seq = int(payload[4:12])
        if payload != body(seq):
            result.problems.append(f"offset {offset}: payload of {seq} altered")
        seqs.append(seq)
    offsets = [o for o, _ in got]
    if offsets != sorted(set(offsets)):
        result.problems.append("offsets served twice or out of order")
    if len(seqs) != len(set(seqs)):
        result.problems.append(f"{len(seqs) - len(set(seqs))} messages stored twice")
    if seqs != sorted(seqs):
        result.problems.append("messages out of publish order")
    lost = confirmed - set(seqs)
    if lost:
        result.problems.append(f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}")
    result.seconds = time.monotonic() - started
    return result
