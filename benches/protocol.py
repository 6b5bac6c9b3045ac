"""Benchmark: the stream protocol front door, tierlog against RabbitMQ, same client, same run.

With ``rstream``: publish 500,000 messages of 100 bytes (``send_batch`` of 1,000, waiting
for every confirm) into a new stream, then consume them all from ``first``. The same code
runs against a tierlog server (``python -m tierlog serve``, uvloop, fsync per group
commit) and against a private RabbitMQ node with the stream plugin
(scripts/rabbitmq_node.py; Debian ``rabbitmq-server``, installed when missing). The two
servers run one after the other, never together, so they do not share the 2 cores.

Then, at a fixed offered rate (``--rate`` 20,000 msg/s of 100 B as ``send_batch`` of 20
every 1 ms on an absolute clock, ``--rate-seconds`` 60, the code of
benches/steady_publish.py): tierlog with ``log.sync = "os"``, tierlog with the default
(fdatasync before confirm), RabbitMQ, in ``--rounds`` (3) rounds whose order alternates
(os, fsync, RabbitMQ; then RabbitMQ, fsync, os; ...), each side's figures the medians
over its rounds; each reports the server's CPU per message (user +
system of the server process, /proc, over the windows after the first) and the confirm
p99 (send to the confirm of the frame's last message, windows after the first). The
fdatasync p99 of this disk is measured in the same run (2,000 appends of 2 KiB, each
fdatasynced, in the data directory's file system). Last, benches/steady_publish.py's
120 s at 5,000 msg/s in 10-message frames (tiering on).

Last line: ``publish_ratio=<tierlog ÷ RabbitMQ msg/s> consume_ratio=<…>
publish_cpu_ratio=<RabbitMQ CPU per message ÷ tierlog's (default mode)>
confirm_p99_ratio=<tierlog (os mode) p99 ÷ RabbitMQ p99> confirm_p99_excess_ms=<tierlog
(default) p99 - RabbitMQ p99 - fdatasync p99> steady_cpu_growth=<last 10 s window ÷
second> publish_cpu_ratio_os=<RabbitMQ CPU per message ÷ tierlog's in os mode, the same
durability contract as RabbitMQ streams, which never fsync>
filtered_fraction_read=<bytes fetched from the remote tier ÷ bytes of the stream, for a
consumer of 1 % of the stream by filter value: benches/filtered_consume.py, 5,000 chunks,
1,000 with --quick> sac_handover_ms=<median ms from the active single-active consumer's
process killed to the waiting one receiving, benches/sac_handover.py, 5 rounds (3 with
--quick), tierlog only>`` (or ``rabbitmq=absent reason=… …`` when RabbitMQ could not be
started, filtered_fraction_read and sac_handover_ms included).

    .venv/bin/python benches/protocol.py [--messages 500000] [--size 100] [--batch 1000]
        [--rate 20000] [--rate-seconds 60] [--steady-seconds 120]
        [--quick]   # 100,000 messages, 15 s rate phases, 40 s steady phase
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benches"))

from filtered_consume import run as filtered_run  # noqa: E402
from rstream import ConsumerOffsetSpecification, OffsetType, Producer  # noqa: E402
from rstream.consumer import Consumer, MessageContext  # noqa: E402
from rstream.producer import ConfirmationStatus  # noqa: E402
from sac_handover import measure_handover  # noqa: E402
from steady_publish import percentile  # noqa: E402
from steady_publish import publish as publish_on_clock  # noqa: E402
from steady_publish import run as steady_run  # noqa: E402

STREAM = "bench"


@contextlib.contextmanager
def tierlog_server(sync: str = "fsync") -> Iterator[tuple[str, int, int]]:
    """A tierlog server in a subprocess on a free port, data in a temp dir; yields
    (host, stream port, pid)."""
    base = Path(tempfile.mkdtemp(prefix="tierlog-bench-"))
    ready = base / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    env.update(
        TIERLOG_SERVER_PORT="0",
        TIERLOG_SERVER_ADMIN_PORT="0",
        TIERLOG_SERVER_READY_FILE=str(ready),
        TIERLOG_STORAGE_DATA_DIR=str(base / "data"),
        TIERLOG_SERVER_LOG_LEVEL="WARNING",
        TIERLOG_LOG_SYNC=sync,
    )
    proc = subprocess.Popen([sys.executable, "-m", "tierlog", "serve"], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tierlog serve did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        yield "127.0.0.1", int(info["stream_port"]), proc.pid
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


def at_rate(port: int, pid: int, args: argparse.Namespace, label: str) -> tuple[float, float]:
    """(server CPU µs per message, confirm p99 ms) at ``args.rate`` for ``args.rate_seconds``."""
    rate_args = argparse.Namespace(
        rate=args.rate, frame=20, size=args.size, seconds=args.rate_seconds
    )
    latencies: list[float] = []
    print(f"{label}: {args.rate:,} msg/s in 20-message frames", flush=True)
    windows = asyncio.run(publish_on_clock(port, pid, rate_args, latencies))[1:]
    cpu = sum(w["cpu_pct"] for w in windows) / len(windows) / 100
    rate = sum(w["msg_s"] for w in windows) / len(windows)
    us = 1e6 * cpu / rate
    p99 = 1000 * percentile(latencies, 0.99)
    print(
        f"{label}: {rate:,.0f} msg/s offered kept, server CPU {100 * cpu:.1f} % = "
        f"{us:.2f} µs/msg, confirm p50 {1000 * percentile(latencies, 0.5):.2f} ms "
        f"p99 {p99:.2f} ms",
        flush=True,
    )
    return us, p99


def fdatasync_p99_ms(directory: str, samples: int = 2000) -> float:
    """p99 of append-2-KiB-then-fdatasync on ``directory``'s file system."""
    path = os.path.join(directory, "fdatasync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = os.urandom(2048)
    times = []
    try:
        for _ in range(samples):
            os.write(fd, block)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    return 1000 * percentile(times, 0.99)


def beam_pid(data_dir: Path) -> int:
    """The Erlang VM process of a private RabbitMQ node (its ``-home`` is the node's
    temp dir, two levels above its data dir); the server's CPU is counted there."""
    home = str(data_dir.parent.parent).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if cmdline.split(b"\0", 1)[0].endswith(b"beam.smp") and home in cmdline:
            return int(entry)
    raise RuntimeError(f"no beam.smp process with home {home!r}")


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--rate-seconds", type=float, default=60.0)
    parser.add_argument("--steady-seconds", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rate-phase rounds")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rate_seconds, args.steady_seconds = 100_000, 15.0, 40.0
    print(f"load average at the start: {load_average()}", flush=True)

    with tierlog_server() as (host, port, _pid):
        t_pub, t_con = run(host, port, args, "tierlog")
        handovers = measure_handover(host, port, 3 if args.quick else 5)
    sac_ms = statistics.median(handovers)
    print(f"single active consumer hand-over ms per round: {[round(t) for t in handovers]}")
    fraction, delivered, expected = filtered_run(1_000 if args.quick else 5_000, 20, 200)
    print(f"filtered consume: {delivered} of {expected} chunks, {fraction:.4f} read", flush=True)
    probe_dir = tempfile.mkdtemp(prefix="tierlog-bench-")  # where the servers keep data
    try:
        sync_p99 = fdatasync_p99_ms(probe_dir)
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    print(f"fdatasync p99 {sync_p99:.2f} ms", flush=True)
    try:
        from rabbitmq_node import rabbitmq_node

        with rabbitmq_node() as node:
            r_pub, r_con = run(node.host, node.stream_port, args, "rabbitmq")
            rabbit_pid = beam_pid(node.data_dir)
            # Rate phases: tierlog (os), tierlog (fsync) and RabbitMQ, in alternating order
            # per round (the machine is shared: one fixed order would measure its load);
            # each side's figure is the median over the rounds.
            results: dict[str, list[tuple[float, float]]] = {"os": [], "fsync": [], "rmq": []}
            for i in range(args.rounds):
                order = ["os", "fsync", "rmq"] if i % 2 == 0 else ["rmq", "fsync", "os"]
                print(f"round {i + 1}: {', '.join(order)} (load {load_average()})", flush=True)
                for side in order:
                    if side == "rmq":
                        results[side].append(
                            at_rate(node.stream_port, rabbit_pid, args, "rabbitmq")
                        )
                        continue
                    with tierlog_server(side) as (_host, port, pid):
                        results[side].append(at_rate(port, pid, args, f"tierlog sync={side}"))
    except Exception as exc:  # installing or starting RabbitMQ failed
        reason = str(exc).replace("\n", " ")[:200]
        print(
            f"rabbitmq=absent reason={reason!r} "
            f"tierlog_publish={t_pub:.0f} tierlog_consume={t_con:.0f} "
            f"filtered_fraction_read={fraction:.4f} sac_handover_ms={sac_ms:.0f}"
        )
        return 0
    os_us, os_p99 = (statistics.median(x) for x in zip(*results["os"], strict=True))
    fs_us, fs_p99 = (statistics.median(x) for x in zip(*results["fsync"], strict=True))
    r_us, r_p99 = (statistics.median(x) for x in zip(*results["rmq"], strict=True))
    for side, label in (
        ("os", "tierlog sync=os"),
        ("fsync", "tierlog sync=fsync"),
        ("rmq", "rabbitmq"),
    ):
        runs = ", ".join(f"{us:.2f} µs/msg p99 {p:.2f} ms" for us, p in results[side])
        print(f"{label} per round: {runs}")
    steady_args = argparse.Namespace(
        seconds=args.steady_seconds, rate=5_000, frame=10, size=100, profile=None
    )
    windows = steady_run(steady_args, True, [])
    cpus = [w["cpu_pct"] for w in windows]
    print(f"steady 5,000 msg/s: server CPU % per 10 s window {[round(c, 1) for c in cpus]}")
    print(f"tierlog sync=os CPU {os_us:.2f} µs/msg (RabbitMQ ÷ os: {r_us / os_us:.2f})")
    print(f"load average at the end: {load_average()}")
    print(
        f"publish_ratio={t_pub / r_pub:.2f} consume_ratio={t_con / r_con:.2f} "
        f"publish_cpu_ratio={r_us / fs_us:.2f} confirm_p99_ratio={os_p99 / r_p99:.2f} "
        f"confirm_p99_excess_ms={fs_p99 - r_p99 - sync_p99:.2f} "
        f"steady_cpu_growth={cpus[-1] / cpus[1]:.2f} publish_cpu_ratio_os={r_us / os_us:.2f} "
        f"filtered_fraction_read={fraction:.4f} sac_handover_ms={sac_ms:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
