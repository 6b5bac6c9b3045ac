"""Client workloads against a ``tierlog serve`` started from a chosen source tree.

The client side (this script, ``benches/lean_client.py``, rstream) always comes from the tree
this script lives in; only the server subprocess runs the code under ``--server-src``
(its ``PYTHONPATH``). So two trees whose bench files differ (the bench was rewritten, or it
reaches into internals that moved) can still be compared on one workload: run this script
twice, once per ``--server-src``. ``scripts/compare_mains.py`` does that, alternating.

Only what both servers understand is used: the ``TIERLOG_*`` settings, the stream arguments
``x-tierlog-read-strategy`` / ``x-tierlog-max-fragment-age`` /
``stream-max-segment-size-bytes``, and the admin metrics ``tierlog_tier_lag_bytes`` and
``tierlog_object_store_requests_total``.

Workloads (each prints ``key=value`` pairs on its last line):

- ``protocol``: rstream publishes ``--messages`` of ``--size`` bytes in ``send_batch`` of
  ``--batch`` (every confirm awaited) into a new stream, then a consumer reads them all from
  ``first`` (the code of ``benches/protocol.py``; fsync per group commit, the default of
  both servers). Keys: ``publish_msg_s``, ``consume_msg_s`` and the server's CPU (user +
  system, /proc) per message for each phase, ``publish_cpu_us``, ``consume_cpu_us`` — the
  CPU figures are less sensitive than wall-clock rates to other processes on the machine.
  Then the same through ``benches/lean_client.py`` (pre-encoded frames, 16 in flight), where
  rstream's per-message Python work no longer bounds the rate: ``lean_publish_msg_s``,
  ``lean_consume_msg_s``, ``lean_publish_cpu_us``, ``lean_consume_cpu_us``.
- ``lean``: only the lean-client phase of ``protocol`` (default 3,000,000 messages, so the
  server's CPU, counted in 10 ms ticks, is resolved to about 1 %); ``--profile PATH``
  records the server with py-spy during it.
- ``catchup``: SeaweedFS started here, the server tiers to it. ``--mib`` of 1 KiB messages
  (lean publisher, frames of 1,000) into a stream with 64 MiB segments, a 2 s fragment age
  and read strategy ``FORCE``; waits until its tiering lag is 0; GETs and milliseconds from
  subscribing a fresh consumer at a third of the stream to its first chunk (cold caches);
  a lean consumer reads the stream from ``first`` (every tiered chunk from SeaweedFS); raw
  ranged GETs of the same objects (4 MiB, 8 at a time, client side: the baseline measured in
  the same run); the same data into a ``DISABLE`` (local only) stream, once it is tiered
  too (no upload during the read), read by the lean consumer. Keys: ``cold_mb_s``,
  ``raw_mb_s``, ``remote_raw_ratio``, ``local_mb_s``, ``remote_local_ratio``,
  ``seek_gets``, ``seek_ms``, ``cold_cpu_ms_per_mib`` and ``local_cpu_ms_per_mib`` (server
  CPU per MiB read), ``cold_sys_ms_per_mib`` (its kernel share), ``cold_gets`` (GET
  requests of the cold read), ``cold_faults_per_mib`` (minor page faults) and
  ``cold_switches_per_mib`` (context switches of the server's threads),
  ``raw_server_cpu_ms`` (the server's CPU while the raw GETs run), ``load_mb_s``.

    .venv/bin/python scripts/server_workloads.py --server-src /old/tree/src protocol
    .venv/bin/python scripts/server_workloads.py --server-src src catchup --mib 128
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from catchup import (  # noqa: E402 - the workload setup's one home
    COLD_ARGS,
    RECORD,
    MiB,
    Server,
    gets,
    lean_read,
    load,
    raw_gets,
    s3_server_environment,
    seaweed_and_store,
    seek,
    tierlog_server,
)


@contextmanager
def profiled(server: Server, path: str | None) -> Iterator[None]:
    """py-spy recording the server (raw collapsed stacks to ``path``) around the block;
    with ``PY_SPY_GIL=1`` only the thread holding the GIL is sampled (Python CPU)."""
    if not path:
        yield
        return
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            *("record", "-p", str(server.proc.pid), "-o", path),
            *("-r", "200", "--nonblocking", "-f", "raw"),
            *(["--gil"] if os.environ.get("PY_SPY_GIL") == "1" else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)


def server_module_path(server_src: str) -> str:
    """Where ``tierlog`` is imported from under ``server_src`` (printed, so a run shows
    which tree served it)."""
    out = subprocess.run(
        [sys.executable, "-c", "import tierlog; print(tierlog.__file__)"],
        env=dict(os.environ, PYTHONPATH=server_src),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def key_values(values: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in values.items())


# -- protocol --------------------------------------------------------------------------


def protocol(server_src: str, args: argparse.Namespace) -> dict[str, float]:
    from protocol import consume, publish

    workdir = Path(tempfile.mkdtemp(prefix="tierlog-serverbench-", dir=args.data_root))
    try:
        with tierlog_server(workdir, {}, server_src) as server:
            cpu0 = server.cpu_seconds()
            pub = asyncio.run(
                publish("127.0.0.1", server.port, args.messages, args.size, args.batch)
            )
            cpu1 = server.cpu_seconds()
            con = asyncio.run(consume("127.0.0.1", server.port, args.messages))
            cpu2 = server.cpu_seconds()
            lean_pub, lean_con, cpu3, cpu4 = lean_phase(server, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    n = args.messages
    values = {
        "publish_msg_s": pub,
        "consume_msg_s": con,
        "publish_cpu_us": 1e6 * (cpu1 - cpu0) / n,
        "consume_cpu_us": 1e6 * (cpu2 - cpu1) / n,
        "lean_publish_msg_s": lean_pub,
        "lean_consume_msg_s": lean_con,
        "lean_publish_cpu_us": 1e6 * cpu3 / n,
        "lean_consume_cpu_us": 1e6 * cpu4 / n,
    }
    print(
        f"rstream: publish {pub:,.0f} msg/s ({values['publish_cpu_us']:.2f} µs server "
        f"CPU/msg), consume {con:,.0f} msg/s ({values['consume_cpu_us']:.2f} µs/msg); lean: "
        f"publish {lean_pub:,.0f} msg/s ({values['lean_publish_cpu_us']:.2f} µs/msg), "
        f"consume {lean_con:,.0f} msg/s ({values['lean_consume_cpu_us']:.2f} µs/msg)",
        flush=True,
    )
    return values


def lean_phase(server: Server, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """The same messages through the lean client (pre-encoded frames, 16 in flight; per-chunk
    consumer), so the client is not the bottleneck: (publish msg/s, consume msg/s, server
    CPU seconds of each)."""
    from lean_client import LeanConnection, LeanConsumer, LeanPublisher

    setup = LeanConnection("127.0.0.1", server.port)
    setup.create("lean", {})
    setup.close()
    publisher = LeanPublisher("127.0.0.1", server.port, "lean")
    frames = args.messages // args.batch
    cpu0 = server.cpu_seconds()
    seconds = publisher.publish([b"x" * args.size] * args.batch, frames, window=16)
    cpu1 = server.cpu_seconds()
    publisher.close()
    consumer = LeanConsumer("127.0.0.1", server.port, "lean", credit=16)
    started = time.perf_counter()
    consumer.read_until(frames * args.batch)
    read_seconds = time.perf_counter() - started
    cpu2 = server.cpu_seconds()
    consumer.close()
    n = frames * args.batch
    return n / seconds, n / read_seconds, cpu1 - cpu0, cpu2 - cpu1


def lean(server_src: str, args: argparse.Namespace) -> dict[str, float]:
    """Only the lean-client phase (the server's publish path with the least client work),
    optionally with py-spy recording the server during it."""
    workdir = Path(tempfile.mkdtemp(prefix="tierlog-serverbench-", dir=args.data_root))
    try:
        with (
            tierlog_server(workdir, {}, server_src) as server,
            profiled(server, args.profile),
        ):
            lean_pub, lean_con, cpu_pub, cpu_con = lean_phase(server, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    n = args.messages // args.batch * args.batch
    values = {
        "lean_publish_msg_s": lean_pub,
        "lean_consume_msg_s": lean_con,
        "lean_publish_cpu_us": 1e6 * cpu_pub / n,
        "lean_consume_cpu_us": 1e6 * cpu_con / n,
    }
    print(f"lean: {key_values(values)}", flush=True)
    return values


# -- catchup ---------------------------------------------------------------------------


def wait_tiered(server: Server, stream: str, timeout: float = 600) -> None:
    """Until the stream's tiering lag metric reads 0 (every committed byte tiered)."""
    deadline = time.monotonic() + timeout
    while True:
        lag = server.metric_values("tierlog_tier_lag_bytes", f'"[^"]*{stream}')
        if lag and sum(lag) == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stream}: tiering lag still {sum(lag)} bytes")
        time.sleep(0.5)


def catchup(server_src: str, args: argparse.Namespace) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="tierlog-serverbench-", dir=args.data_root))
    seaweed, store, prefix = seaweed_and_store(workdir)
    env = s3_server_environment(seaweed, prefix)
    try:
        (workdir / "server").mkdir()
        with tierlog_server(workdir / "server", env, server_src) as server:
            started = time.perf_counter()
            messages = load(server, "coldread", COLD_ARGS, args.mib)
            load_mbs = messages * RECORD / (time.perf_counter() - started) / 1e6
            wait_tiered(server, "coldread")
            objects = [(o.key, o.size) for o in store.list("") if o.size >= MiB]
            print(f"  tiered: {len(objects)} objects ≥ 1 MiB", flush=True)

            seek_gets, seek_ms = seek(server, "coldread", messages)

            with profiled(server, args.profile):
                user0, sys0 = server.cpu_times()
                gets0 = gets(server)
                faults0, switches0 = server.faults_and_switches()
                cold_s, cold_bytes = lean_read(server, "coldread", messages)
                faults1, switches1 = server.faults_and_switches()
                cold_gets = gets(server) - gets0
                user1, sys1 = server.cpu_times()
                cold_cpu = user1 - user0 + sys1 - sys0
            cpu0 = server.cpu_seconds()
            raw_s, raw_bytes = raw_gets(store, objects)
            raw_server_cpu = server.cpu_seconds() - cpu0  # should be ~0: the server is idle

            local_args = {"x-tierlog-read-strategy": "DISABLE", "x-tierlog-max-fragment-age": "2s"}
            load(server, "localread", local_args, args.mib)
            wait_tiered(server, "localread")  # no upload while the read is measured
            cpu0 = server.cpu_seconds()
            local_s, local_bytes = lean_read(server, "localread", messages)
            local_cpu = server.cpu_seconds() - cpu0
    finally:
        store.close()
        seaweed.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    cold_mbs = cold_bytes / cold_s / 1e6
    raw_mbs = raw_bytes / raw_s / 1e6
    local_mbs = local_bytes / local_s / 1e6
    print(
        f"  cold {cold_mbs:.0f} MB/s, raw GETs {raw_mbs:.0f} MB/s, local {local_mbs:.0f} MB/s, "
        f"seek {seek_gets:.0f} GETs / {seek_ms:.0f} ms",
        flush=True,
    )
    return {
        "cold_mb_s": cold_mbs,
        "raw_mb_s": raw_mbs,
        "remote_raw_ratio": cold_mbs / raw_mbs,
        "local_mb_s": local_mbs,
        "remote_local_ratio": cold_mbs / local_mbs,
        "seek_gets": seek_gets,
        "seek_ms": seek_ms,
        "cold_cpu_ms_per_mib": 1000 * cold_cpu / (cold_bytes / MiB),
        "cold_sys_ms_per_mib": 1000 * (sys1 - sys0) / (cold_bytes / MiB),
        "cold_gets": cold_gets,
        "raw_server_cpu_ms": 1000 * raw_server_cpu,
        "cold_faults_per_mib": (faults1 - faults0) / (cold_bytes / MiB),
        "cold_switches_per_mib": (switches1 - switches0) / (cold_bytes / MiB),
        "local_cpu_ms_per_mib": 1000 * local_cpu / (local_bytes / MiB),
        "load_mb_s": load_mbs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server-src", default=str(ROOT / "src"), help="PYTHONPATH of the server process"
    )
    parser.add_argument(
        "--data-root",
        default=None,
        help="where the server's data (and SeaweedFS) go, e.g. /dev/shm to take the shared "
        "disk's fsync latency out of a code comparison (default: the temp dir)",
    )
    sub = parser.add_subparsers(dest="workload", required=True)
    p = sub.add_parser("protocol")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=1_000)
    lp = sub.add_parser("lean")
    lp.add_argument("--messages", type=int, default=3_000_000)
    lp.add_argument("--size", type=int, default=100)
    lp.add_argument("--batch", type=int, default=1_000)
    lp.add_argument("--profile", help="py-spy raw (collapsed) stacks of the server, to PATH")
    c = sub.add_parser("catchup")
    c.add_argument("--mib", type=int, default=128)
    c.add_argument("--profile", help="py-spy raw stacks of the server's cold read, to PATH")
    args = parser.parse_args()
    server_src = os.path.abspath(args.server_src)
    print(f"server: {server_module_path(server_src)}", flush=True)
    run = {"protocol": protocol, "lean": lean, "catchup": catchup}[args.workload]
    print(key_values(run(server_src, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
