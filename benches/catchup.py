"""Benchmark: catching up through the server, from the remote and the local tier, against
raw GETs of the same objects, plus memory and hot-publisher latency under 100 cold readers.

One run, one SeaweedFS (started here) and one ``tierlog serve`` (uvloop, S3 object store,
tiering on, default prefetch: 4 MiB requests, AIMD window, 256 MiB hard budget):

1. ``cold``: ``--mib`` of 1 KiB messages (frames of 1,000) into a stream with 64 MiB
   fragments, a 2 s fragment age and read strategy ``FORCE`` (every tiered chunk is read
   from the remote tier); waits until all of it is tiered. ``local``: the same data in
   a stream with strategy ``DISABLE`` (local only).
2. ``seek_gets``: GET requests (the server's object-store counter, every kind) between
   subscribing a fresh connection at an old offset of ``cold`` and its first chunk,
   before anything else read the stream (branch and fragment-index caches cold).
3. Remote read: a lean consumer (``benches/lean_client.py``: our codec, per-chunk work
   only) reads ``cold`` from ``first``; then raw ranged GETs of the same fragment objects
   with the server's request size and concurrency (``S3ObjectStore.get_view``, 8 at a
   time, 4 MiB). ``--rounds`` (3) pairs, the side that goes first alternating; the ratio
   is the median of the pairs' ratios. Local read: the lean consumer reads ``local``
   (page cache warm).
4. 100 cold consumers (``--readers``) each read ``--reader-mib`` from ``first`` of
   ``cold`` at once, while a publisher sends 10 x 100 B frames every 5 ms to a third
   stream and times each confirm; the same publisher ran alone before (idle). The
   publisher runs in a process of its own: in this process the readers' 100 threads
   would hold its GIL, and its latency would measure the bench client. The
   server's RSS (/proc/<pid>/status) is sampled every 50 ms; the baseline is taken
   right before the readers start, ``after`` 10 s after they all closed.

Last line: ``remote_raw_ratio=<lean cold read ÷ raw GETs, MB/s> remote_local_ratio=<cold
read ÷ local read> seek_gets=<n> cold100_rss_mib=<peak RSS above baseline>
cold100_after_mib=<RSS above baseline 10 s after close> hot_p99_ratio=<publisher
confirm p99 with the readers ÷ idle>``.

    .venv/bin/python benches/catchup.py [--mib 512] [--readers 100] [--reader-mib 32]
        [--quick]   # 128 MiB, 100 readers of 8 MiB, 3 s after-close wait
        [--profile remote.txt]   # py-spy (collapsed stacks) of the server's remote read
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from lean_client import LeanConnection, LeanConsumer, LeanPublisher  # noqa: E402
from tests.plugins.seaweed import SeaweedServer, start_seaweed  # noqa: E402

from tierlog.storage.s3_config import S3Config  # noqa: E402
from tierlog.storage.s3_object_store import S3ObjectStore  # noqa: E402

MiB = 1 << 20
RECORD = 1024
FRAME = 1000
REQUEST = 4 * MiB
CONCURRENCY = 8


COLD_ARGS = {
    "x-tierlog-max-fragment-age": "2s",
    "x-tierlog-read-strategy": "FORCE",
    "stream-max-segment-size-bytes": str(64 * MiB),
}
"""The cold stream: 64 MiB segments, a 2 s fragment age, every tiered chunk read from the
remote tier."""


class Server:
    """A running ``tierlog serve`` subprocess: ports, CPU time, memory, admin metrics."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, admin: int) -> None:
        self.proc, self.port, self.admin = proc, port, admin

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_times(self) -> tuple[float, float]:
        """(user, system) CPU seconds of the server process (all threads) so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process (all threads) so far."""
        return sum(self.cpu_times())

    def faults_and_switches(self) -> tuple[int, int]:
        """(minor page faults of the process, context switches of its live threads)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            minflt = int(f.read().rsplit(")", 1)[1].split()[7])
        switches = 0
        for task in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{task}/status") as f:
                    for line in f:
                        if "ctxt_switches:" in line:
                            switches += int(line.split()[1])
            except FileNotFoundError:  # the thread ended
                continue
        return minflt, switches

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def metric_values(self, name: str, pattern: str = "") -> list[float]:
        """The samples of ``name`` whose line matches ``pattern`` (none before the
        server first reports the metric)."""
        return [
            float(line.rsplit(" ", 1)[1])
            for line in self.metrics().splitlines()
            if line.startswith(name) and re.search(pattern, line)
        ]

    def metric_sum(self, name: str, pattern: str = "") -> float:
        return sum(self.metric_values(name, pattern))


def s3_server_environment(seaweed: SeaweedServer, prefix: str) -> dict[str, str]:
    """The settings of a server tiering to ``prefix`` in the SeaweedFS bucket."""
    return {
        "TIERLOG_STORAGE_OBJECT_STORE": (
            f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}&region={seaweed.region}"
        ),
        "AWS_ACCESS_KEY_ID": seaweed.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
    }


def seaweed_and_store(workdir: Path) -> tuple[SeaweedServer, S3ObjectStore, str]:
    """SeaweedFS started under ``workdir/seaweed``, a client store on its bucket and the
    prefix (fresh per process) the server tiers to; the caller closes both."""
    seaweed = start_seaweed(str(workdir / "seaweed"))
    prefix = f"catchup-{os.getpid()}"
    store = S3ObjectStore(
        S3Config(
            bucket=seaweed.bucket,
            prefix=prefix,
            endpoint=seaweed.endpoint,
            region=seaweed.region,
            access_key_id=seaweed.access_key,
            secret_access_key=seaweed.secret_key,
        )
    )
    return seaweed, store, prefix


@contextmanager
def tierlog_server(
    workdir: Path, env_extra: Mapping[str, str], server_src: str = str(ROOT / "src")
) -> Iterator[Server]:
    """``python -m tierlog serve`` with ``PYTHONPATH=server_src``, data in ``workdir``
    (also its working directory), warnings only; SIGTERM on exit."""
    ready = workdir / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    env.update(
        TIERLOG_SERVER_PORT="0",
        TIERLOG_SERVER_ADMIN_PORT="0",
        TIERLOG_SERVER_READY_FILE=str(ready),
        TIERLOG_STORAGE_DATA_DIR=str(workdir / "data"),
        TIERLOG_SERVER_LOG_LEVEL="WARNING",
        PYTHONPATH=server_src,
    )
    env.update(env_extra)
    proc = subprocess.Popen([sys.executable, "-m", "tierlog", "serve"], env=env, cwd=workdir)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tierlog serve did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        yield Server(proc, int(info["stream_port"]), int(info["admin_port"]))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load(server: Server, stream: str, arguments: dict[str, str], mib: int) -> int:
    """Create ``stream`` and publish ``mib`` MiB of 1 KiB messages; returns messages."""
    setup = LeanConnection("127.0.0.1", server.port)
    setup.create(stream, arguments)
    setup.close()
    publisher = LeanPublisher("127.0.0.1", server.port, stream)
    payload = os.urandom(RECORD)
    frames = mib * MiB // (RECORD * FRAME)
    seconds = publisher.publish([payload] * FRAME, frames, window=16)
    publisher.close()
    print(f"  loaded {stream}: {frames * FRAME:,} messages in {seconds:.1f} s", flush=True)
    return frames * FRAME


def wait_tiered(server: Server, stream: str, messages: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        tiered = server.metric_sum("tierlog_remote_next_offset", f'stream="{stream}"')
        if tiered >= messages:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stream}: only {tiered:.0f} of {messages} tiered")
        time.sleep(0.5)


def gets(server: Server) -> float:
    return server.metric_sum("tierlog_object_store_requests_total", r'op="get')


def seek(server: Server, stream: str, messages: int) -> tuple[int, float]:
    """(GET requests, milliseconds) from subscribing a fresh consumer at a third of
    ``stream`` to its first chunk."""
    before = gets(server)
    seeker = LeanConsumer("127.0.0.1", server.port, stream, offset=messages // 3, credit=1)
    t0 = time.perf_counter()
    seeker.read_until(messages // 3 + 1)
    seek_ms = 1000 * (time.perf_counter() - t0)
    seek_gets = int(gets(server) - before)
    seeker.close()
    return seek_gets, seek_ms


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


CPU_PIDS: dict[str, int] = {}
"""Processes whose CPU time each read pass reports (server, SeaweedFS)."""


def cpu_report(before: dict[str, float], size: int) -> str:
    parts = [
        f"{name} {(cpu_seconds(pid) - before[name]) / (size / 2**30):.2f}"
        for name, pid in CPU_PIDS.items()
    ]
    return "CPU-s per GiB: " + ", ".join(parts)


def cpu_snapshot() -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in CPU_PIDS.items()}


def lean_read(server: Server, stream: str, messages: int) -> tuple[float, int]:
    """(seconds, chunk bytes) for one lean consumer reading ``stream`` from first."""
    consumer = LeanConsumer("127.0.0.1", server.port, stream, credit=16)
    before = cpu_snapshot()
    started = time.perf_counter()
    records, size = consumer.read_until(messages)
    seconds = time.perf_counter() - started
    print(f"    lean read of {stream}: {cpu_report(before, size)}", flush=True)
    consumer.close()
    assert records >= messages, (records, messages)
    return seconds, size


def raw_gets(store: S3ObjectStore, objects: list[tuple[str, int]]) -> tuple[float, int]:
    """(seconds, bytes) of ranged GETs of every object, REQUEST each, CONCURRENCY at a time."""
    ranges = [
        (key, start, min(size, start + REQUEST))
        for key, size in objects
        for start in range(0, size, REQUEST)
    ]
    before = cpu_snapshot()
    started = time.perf_counter()
    total = 0
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for view in pool.map(lambda r: store.get_view(*r), ranges):
            total += len(view)
            del view
    seconds = time.perf_counter() - started
    print(f"    raw GETs: {cpu_report(before, total)}", flush=True)
    return seconds, total


def hot_publisher(
    server: Server, stream: str, seconds: float, stop: threading.Event
) -> list[float]:
    """Frames of 10 x 100 B every 5 ms, each timed to its last confirm."""
    publisher = LeanPublisher("127.0.0.1", server.port, stream, publisher_id=2)
    frame = [b"h" * 100] * 10
    latencies: list[float] = []
    due = time.perf_counter()
    end = due + seconds
    while time.perf_counter() < end and not stop.is_set():
        latencies.append(publisher.publish_one(frame))
        due += 0.005
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    publisher.close()
    return latencies


class HotPublisherProcess:
    """``hot_publisher`` in a process of its own: the 100 reader threads of this process
    would otherwise hold its GIL (a thread waiting for the GIL waits up to the 5 ms
    switch interval), and the confirm latency would measure this client, not the server."""

    def __init__(self, server: Server, stream: str, seconds: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--hot-publisher", str(server.port), stream, str(seconds)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )

    def latencies(self, stop: bool = False) -> list[float]:
        if stop:
            self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=3600)
        return [float(x) for x in json.loads(out)]


def hot_publisher_main(port: int, stream: str, seconds: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = Server(None, port, 0)  # type: ignore[arg-type]
    latencies = hot_publisher(server, stream, seconds, stop)
    print(json.dumps(latencies), flush=True)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def cold_readers(server: Server, args: argparse.Namespace) -> tuple[float, float, list[float]]:
    """(peak RSS above baseline, RSS above baseline after close, hot confirm latencies)."""
    per_reader = args.reader_mib * MiB // RECORD
    baseline = server.rss_mib()
    peak = baseline
    done = threading.Event()
    errors: list[BaseException] = []
    consumers: list[LeanConsumer] = []

    def read(_: int) -> None:
        try:
            consumer = LeanConsumer("127.0.0.1", server.port, "cold", credit=4)
            consumers.append(consumer)
            consumer.read_until(per_reader)
            consumer.close()
        except BaseException as exc:
            errors.append(exc)

    hot = HotPublisherProcess(server, "hot", 3600)
    time.sleep(1.0)  # connected and publishing before the readers start
    started = time.perf_counter()
    threads = [threading.Thread(target=read, args=(i,)) for i in range(args.readers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, server.rss_mib())
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    done.set()
    latencies = hot.latencies(stop=True)
    assert not errors, errors[:3]
    print(
        f"  {args.readers} readers x {args.reader_mib} MiB in {elapsed:.1f} s "
        f"({args.readers * args.reader_mib * MiB / elapsed / 1e6:.0f} MB/s); "
        f"buffers at the end: prefetch "
        f"{server.metric_sum('tierlog_prefetch_memory_bytes') / MiB:.0f} MiB",
        flush=True,
    )
    time.sleep(args.after)
    after = server.rss_mib()
    print(
        f"  RSS baseline {baseline:.0f} MiB, peak {peak:.0f}, {args.after:.0f} s after {after:.0f}"
    )
    return peak - baseline, after - baseline, latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--readers", type=int, default=100)
    parser.add_argument("--reader-mib", type=int, default=32)
    parser.add_argument("--after", type=float, default=10.0)
    parser.add_argument("--hot-seconds", type=float, default=15.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--rounds", type=int, default=3, help="remote/raw pairs, alternating order (median)"
    )
    parser.add_argument("--hot-publisher", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--profile", help="py-spy collapsed stacks of the server's remote read")
    args = parser.parse_args()
    if args.hot_publisher:  # the child process of HotPublisherProcess
        port, stream, seconds = args.hot_publisher
        hot_publisher_main(int(port), stream, float(seconds))
        return 0
    if args.quick:
        args.mib, args.reader_mib, args.after, args.hot_seconds = 128, 8, 3.0, 5.0
    workdir = Path(tempfile.mkdtemp(prefix="tierlog-bench-catchup-"))
    seaweed, store, prefix = seaweed_and_store(workdir)
    try:
        (workdir / "server").mkdir()
        with tierlog_server(workdir / "server", s3_server_environment(seaweed, prefix)) as server:
            CPU_PIDS.update(server=server.proc.pid, seaweed=seaweed.pid, bench=os.getpid())
            run(server, store, args)
    finally:
        store.close()
        seaweed.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def run(server: Server, store: S3ObjectStore, args: argparse.Namespace) -> None:
    with open("/proc/loadavg") as f:
        print(f"load average at the start: {' '.join(f.read().split()[:3])}")
    messages = load(server, "cold", COLD_ARGS, args.mib)
    wait_tiered(server, "cold", messages)
    objects = [(o.key, o.size) for o in store.list("") if o.size >= MiB]
    print(f"  tiered: {len(objects)} fragment objects, {sum(s for _, s in objects) / MiB:.0f} MiB")

    seek_gets, seek_ms = seek(server, "cold", messages)
    print(f"  seek to offset {messages // 3}: {seek_gets} GETs, first chunk in {seek_ms:.0f} ms")

    spy = None
    if args.profile:  # py-spy on the server during the remote read only
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                *("record", "-p", str(server.proc.pid), "-o", args.profile, "-r", "100"),
                *("--nonblocking", "-f", "raw"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
    cold_s, cold_bytes = lean_read(server, "cold", messages)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    cold_mbs = cold_bytes / cold_s / 1e6
    raw_s, raw_bytes = raw_gets(store, objects)
    raw_mbs = raw_bytes / raw_s / 1e6
    print(f"  remote read (lean client): {cold_bytes / MiB:.0f} MiB at {cold_mbs:.0f} MB/s")
    print(f"  raw GETs ({CONCURRENCY} x {REQUEST // MiB} MiB): {raw_mbs:.0f} MB/s")
    ratios = [cold_mbs / raw_mbs]
    pairs = [(cold_mbs, raw_mbs)]
    for i in range(1, args.rounds):  # alternate which side goes first
        if i % 2:
            raw_s, raw_bytes = raw_gets(store, objects)
            cold_s, cold_bytes = lean_read(server, "cold", messages)
        else:
            cold_s, cold_bytes = lean_read(server, "cold", messages)
            raw_s, raw_bytes = raw_gets(store, objects)
        pairs.append((cold_bytes / cold_s / 1e6, raw_bytes / raw_s / 1e6))
        ratios.append(pairs[-1][0] / pairs[-1][1])
    if args.rounds > 1:
        print(
            "  rounds (remote MB/s, raw MB/s): "
            + ", ".join(f"({a:.0f}, {b:.0f})" for a, b in pairs)
        )
        cold_mbs = statistics.median(a for a, _ in pairs)
    remote_raw = statistics.median(ratios)

    load(server, "local", {"x-tierlog-read-strategy": "DISABLE"}, args.mib)
    local_s, local_bytes = lean_read(server, "local", messages)
    local_mbs = local_bytes / local_s / 1e6
    print(f"  local read (lean client): {local_mbs:.0f} MB/s")

    setup = LeanConnection("127.0.0.1", server.port)
    setup.create("hot", {})
    setup.close()
    idle = HotPublisherProcess(server, "hot", args.hot_seconds).latencies()
    print(f"  hot publisher idle: p99 {1000 * p99(idle):.2f} ms over {len(idle)} frames")
    rss_peak, rss_after, busy = cold_readers(server, args)
    print(f"  hot publisher with readers: p99 {1000 * p99(busy):.2f} ms over {len(busy)} frames")
    with open("/proc/loadavg") as f:
        print(f"load average at the end: {' '.join(f.read().split()[:3])}")
    print(
        f"remote_raw_ratio={remote_raw:.2f} remote_local_ratio={cold_mbs / local_mbs:.2f} "
        f"seek_gets={seek_gets} cold100_rss_mib={rss_peak:.0f} "
        f"cold100_after_mib={rss_after:.0f} hot_p99_ratio={p99(busy) / p99(idle):.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
