"""Benchmark: server CPU under a steady small-frame publish load, tiering on.

Publishes 5,000 msg/s of 100 B messages as one 10-message ``send_batch`` every 2 ms (on
an absolute clock: a late send is made up at once, never dropped) for 120 s with rstream
against ``tierlog serve`` (embedded defaults: filesystem object store, tiering on, 64 MiB
fragments cut by size or after 60 s). Every 10 s it reports the server's CPU (user +
system from /proc/<pid>/stat, % of one core), the messages sent and the confirm latency
p50/p99 of the frames sent in the window (send to confirm of the frame's last message).
With ``--no-tiering`` the same run with ``tier.enabled = false``, the baseline: the CPU
per window must stay flat when the cost per chunk does not grow with pending data.

Last line: ``steady_cpu_growth=<CPU in the last window ÷ the second> confirm_p99_ms=<whole
run>`` (target ≤ 1.2). The first window is left out (stream creation, warm-up).

    .venv/bin/python benches/steady_publish.py [--seconds 120] [--rate 5000] [--frame 10]
        [--no-tiering] [--profile out.svg]   # py-spy record of the server (all threads)
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

from rstream import Producer
from rstream.producer import ConfirmationStatus

STREAM = "steady"
WINDOW = 10.0
TICKS = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def tierlog_server(tiering: bool) -> Iterator[tuple[int, int]]:
    """A tierlog server in a subprocess on a free port; yields (stream port, pid)."""
    base = Path(tempfile.mkdtemp(prefix="tierlog-steady-"))
    ready = base / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    env.update(
        TIERLOG_SERVER_PORT="0",
        TIERLOG_SERVER_ADMIN_PORT="0",
        TIERLOG_SERVER_READY_FILE=str(ready),
        TIERLOG_STORAGE_DATA_DIR=str(base / "data"),
        TIERLOG_SERVER_LOG_LEVEL="WARNING",
        TIERLOG_TIER_ENABLED="true" if tiering else "false",
    )
    proc = subprocess.Popen([sys.executable, "-m", "tierlog", "serve"], env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tierlog serve did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        yield int(info["stream_port"]), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU of a process (all threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def publish(
    port: int, pid: int, args: argparse.Namespace, after_first: list[float]
) -> list[dict[str, float]]:
    """Publish on the clock; returns the windows, puts latencies after the first window
    into ``after_first``."""
    payload = b"x" * args.size
    frame = [payload] * args.frame
    interval = args.frame / args.rate
    sent_at: dict[int, float] = {}  # last publishing id of a frame -> send time
    latencies: list[float] = []

    async def on_confirm(status: ConfirmationStatus) -> None:
        sent = sent_at.pop(status.message_id, None)
        if sent is not None:
            latencies.append(time.perf_counter() - sent)

    windows: list[dict[str, float]] = []
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
        await producer.create_stream(STREAM, exists_ok=True)
        start = time.perf_counter()
        window_start, window_cpu, window_sent = start, cpu_seconds(pid), 0
        due = start
        sent = 0
        while True:
            now = time.perf_counter()
            if now - window_start >= WINDOW:
                cpu = cpu_seconds(pid)
                span = now - window_start
                lat, latencies = latencies, []
                if windows:
                    after_first.extend(lat)
                windows.append(
                    {
                        "t": now - start,
                        "cpu_pct": 100 * (sum(cpu) - sum(window_cpu)) / span,
                        "user_pct": 100 * (cpu[0] - window_cpu[0]) / span,
                        "msg_s": (sent - window_sent) / span,
                        "p50_ms": 1000 * percentile(lat, 0.50),
                        "p99_ms": 1000 * percentile(lat, 0.99),
                        "confirms": len(lat),
                    }
                )
                w = windows[-1]
                print(
                    f"  {w['t']:6.1f} s  server CPU {w['cpu_pct']:5.1f} % "
                    f"(user {w['user_pct']:4.1f} %)  "
                    f"{w['msg_s']:7,.0f} msg/s  confirm p50 {w['p50_ms']:.2f} ms  "
                    f"p99 {w['p99_ms']:.2f} ms",
                    flush=True,
                )
                window_start, window_cpu, window_sent = now, cpu, sent
                if now - start >= args.seconds:
                    break
            if now < due:
                await asyncio.sleep(due - now)
                continue
            ids = await producer.send_batch(STREAM, frame, on_publish_confirm=on_confirm)
            sent_at[max(ids)] = time.perf_counter()
            sent += len(frame)
            due += interval
    return windows


def profile_format(path: str) -> str:
    """py-spy's output format by file name: speedscope JSON, collapsed stacks, or SVG."""
    if path.endswith(".json"):
        return "speedscope"
    return "raw" if path.endswith(".txt") else "flamegraph"


def run(
    args: argparse.Namespace, tiering: bool, after_first: list[float]
) -> list[dict[str, float]]:
    label = "tiering on" if tiering else "tiering off"
    print(f"tierlog, {label}: {args.rate:,} msg/s in {args.frame}-message frames", flush=True)
    with tierlog_server(tiering) as (port, pid):
        spy = None
        if args.profile:
            spy = subprocess.Popen(
                [
                    shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
                    *("record", "-p", str(pid), "-o", args.profile, "-r", "50", "--nonblocking"),
                    *("-f", profile_format(args.profile)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        try:
            return asyncio.run(publish(port, pid, args, after_first))
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=int, default=5_000)
    parser.add_argument("--frame", type=int, default=10)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--no-tiering", action="store_true")
    parser.add_argument(
        "--profile", help="py-spy output file (.svg, .json speedscope, .txt collapsed stacks)"
    )
    args = parser.parse_args()
    latencies: list[float] = []
    windows = run(args, not args.no_tiering, latencies)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    cpus = [w["cpu_pct"] for w in windows]
    p99 = 1000 * percentile(latencies, 0.99)
    print(f"windows: {len(windows)}, server CPU % per window: {[round(c, 1) for c in cpus]}")
    print(f"load average at the end: {' '.join(load)}")
    print(f"steady_cpu_growth={cpus[-1] / cpus[1]:.2f} confirm_p99_ms={p99:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
