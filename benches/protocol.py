"""Benchmark: the stream protocol front door, tierlog against RabbitMQ, same client, same run.

With ``rstream``: publish 500,000 messages of 100 bytes (``send_batch`` of 1,000, waiting
for every confirm) into a new stream, then consume them all from ``first``. The same code
runs against a tierlog server (``python -m tierlog serve``, uvloop, fsync per group
commit) and against a private RabbitMQ node with the stream plugin
(scripts/rabbitmq_node.py; Debian ``rabbitmq-server``, installed when missing). The two
servers run one after the other, never together, so they do not share the 2 cores.

Last line: ``publish_ratio=<tierlog ÷ RabbitMQ msg/s> consume_ratio=<…>`` (or
``rabbitmq=absent reason=… tierlog_publish=… tierlog_consume=…`` when RabbitMQ could not
be started).

    .venv/bin/python benches/protocol.py [--messages 500000] [--size 100] [--batch 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from rstream import ConsumerOffsetSpecification, OffsetType, Producer  # noqa: E402
from rstream.consumer import Consumer, MessageContext  # noqa: E402
from rstream.producer import ConfirmationStatus  # noqa: E402

STREAM = "bench"


@contextlib.contextmanager
def tierlog_server() -> Iterator[tuple[str, int]]:
    """A tierlog server in a subprocess on a free port, data in a temp dir."""
    base = Path(tempfile.mkdtemp(prefix="tierlog-bench-"))
    ready = base / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    env.update(
        TIERLOG_SERVER_PORT="0",
        TIERLOG_SERVER_ADMIN_PORT="0",
        TIERLOG_SERVER_READY_FILE=str(ready),
        TIERLOG_STORAGE_DATA_DIR=str(base / "data"),
        TIERLOG_SERVER_LOG_LEVEL="WARNING",
    )
    proc = subprocess.Popen([sys.executable, "-m", "tierlog", "serve"], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tierlog serve did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        yield "127.0.0.1", int(info["stream_port"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


async def publish(host: str, port: int, messages: int, size: int, batch: int) -> float:
    """msg/s from the first send to the last confirm."""
    payload = b"x" * size
    batches = [[payload] * batch for _ in range(messages // batch)]
    confirmed = 0
    done = asyncio.Event()

    async def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed
        confirmed += 1
        if confirmed >= messages:
            done.set()

    async with Producer(host, port=port, username="guest", password="guest") as producer:
        await producer.create_stream(STREAM, exists_ok=True)
        start = time.perf_counter()
        for items in batches:
            await producer.send_batch(STREAM, items, on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - start
    return messages / elapsed


async def consume(host: str, port: int, messages: int) -> float:
    """msg/s from subscribing at ``first`` to the last message."""
    received = 0
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        nonlocal received
        received += 1
        if received >= messages:
            done.set()

    consumer = Consumer(host, port=port, username="guest", password="guest")
    await consumer.start()
    try:
        start = time.perf_counter()
        await consumer.subscribe(
            STREAM, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
        )
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - start
    finally:
        await consumer.close()
    return messages / elapsed


def run(host: str, port: int, args: argparse.Namespace, label: str) -> tuple[float, float]:
    pub = asyncio.run(publish(host, port, args.messages, args.size, args.batch))
    con = asyncio.run(consume(host, port, args.messages))
    print(f"{label}: publish {pub:,.0f} msg/s, consume {con:,.0f} msg/s", flush=True)
    return pub, con


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1_000)
    args = parser.parse_args()

    with tierlog_server() as (host, port):
        t_pub, t_con = run(host, port, args, "tierlog")
    try:
        from rabbitmq_node import rabbitmq_node

        with rabbitmq_node() as node:
            r_pub, r_con = run(node.host, node.stream_port, args, "rabbitmq")
    except Exception as exc:  # installing or starting RabbitMQ failed
        reason = str(exc).replace("\n", " ")[:200]
        print(
            f"rabbitmq=absent reason={reason!r} "
            f"tierlog_publish={t_pub:.0f} tierlog_consume={t_con:.0f}"
        )
        return 0
    print(f"publish_ratio={t_pub / r_pub:.2f} consume_ratio={t_con / r_con:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
