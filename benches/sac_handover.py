"""Benchmark: single-active-consumer hand-over time — the active consumer's process is
killed, how long until the waiting one receives.

Per round: a new stream, a publisher sending one message every 5 ms, consumer A (rstream,
``single-active-consumer`` group, its own process: this script with ``--consumer``)
active and storing each offset, consumer B of the same group waiting in this process. A is
SIGKILLed at t0; B's first delivered message at t1 (B answers its ConsumerUpdate with the
group's stored offset + 1, one QueryOffset). ``sac_handover_ms`` is the median of
(t1 - t0) over the rounds. protocol.py reports it on its last line.

    .venv/bin/python benches/sac_handover.py <host> <port> [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time

from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetNotFound,
    OffsetSpecification,
    OffsetType,
    Producer,
)
from rstream.consumer import EventContext

GROUP = "sac-bench"


async def _sac_consumer(host: str, port: int, stream: str, on_offset: object) -> Consumer:
    consumer = Consumer(host=host, port=port, username="guest", password="guest")
    await consumer.start()

    async def on_message(_message: AMQPMessage, context: MessageContext) -> None:
        await context.consumer.store_offset(stream, GROUP, context.offset)
        on_offset(context.offset)  # type: ignore[operator]

    async def on_update(active: bool, context: EventContext) -> OffsetSpecification:
        if not active:
            return OffsetSpecification(OffsetType.NEXT, 0)
        try:
            stored = await context.consumer.query_offset(stream, GROUP)
        except OffsetNotFound:
            return OffsetSpecification(OffsetType.FIRST, 0)
        return OffsetSpecification(OffsetType.OFFSET, stored + 1)

    await consumer.subscribe(
        stream,
        on_message,
        offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        properties={"single-active-consumer": "true", "name": GROUP},
        consumer_update_listener=on_update,
    )
    return consumer


async def _consumer_process(host: str, port: int, stream: str) -> None:
    """Consumer A: prints each offset it handled (after storing it) until killed."""
    await _sac_consumer(host, port, stream, lambda o: print(o, flush=True))
    await asyncio.Event().wait()


async def _round(host: str, port: int, stream: str) -> float:
    producer = Producer(host=host, port=port, username="guest", password="guest")
    await producer.start()
    await producer.create_stream(stream, exists_ok=True)
    stop = asyncio.Event()

    async def publish() -> None:
        i = 0
        while not stop.is_set():
            await producer.send(stream, b"m%d" % i)
            i += 1
            await asyncio.sleep(0.005)

    publisher = asyncio.create_task(publish())
    a = subprocess.Popen(
        [sys.executable, __file__, host, str(port), "--consumer", stream],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    received_b: list[float] = []
    b: Consumer | None = None
    try:
        assert a.stdout is not None
        loop = asyncio.get_running_loop()
        for _ in range(20):  # A is active and delivering
            line = await loop.run_in_executor(None, a.stdout.readline)
            if not line:
                raise RuntimeError("consumer process ended")
        b = await _sac_consumer(host, port, stream, lambda _o: received_b.append(time.monotonic()))
        await asyncio.sleep(0.5)
        if received_b:
            raise RuntimeError("the waiting consumer received while another was active")
        t0 = time.monotonic()
        a.send_signal(signal.SIGKILL)
        deadline = t0 + 30
        while not received_b:
            if time.monotonic() > deadline:
                raise RuntimeError("no hand-over within 30 s")
            await asyncio.sleep(0.001)
        return (received_b[0] - t0) * 1000
    finally:
        stop.set()
        await publisher
        if a.poll() is None:
            a.kill()
        a.wait(10)
        if b is not None:
            await b.close()
        await producer.delete_stream(stream)
        await producer.close()


def measure_handover(host: str, port: int, rounds: int) -> list[float]:
    """Hand-over times in ms, one per round."""
    return [asyncio.run(_round(host, port, f"sac-bench-{i}")) for i in range(rounds)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--consumer", metavar="STREAM", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consumer:
        asyncio.run(_consumer_process(args.host, args.port, args.consumer))
        return 0
    times = measure_handover(args.host, args.port, args.rounds)
    print(f"hand-over ms per round: {[round(t, 1) for t in times]}")
    print(f"sac_handover_ms={statistics.median(times):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
