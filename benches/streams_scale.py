"""Benchmark: many streams per node, tierlog against RabbitMQ.

For tierlog (``tierlog serve`` in a subprocess, embedded defaults: tiering to the
filesystem object store) with 1,000 and 10,000 streams, and for a private RabbitMQ
node (``scripts/rabbitmq_node.py``, Debian ``rabbitmq-server``) with 1,000 streams:

* creation: wall time to create the streams (pipelined Create frames) and to publish
  100 messages to each (one Publish frame of 100 messages per stream, confirmed);
* the server's threads (``/proc/<pid>/status`` Threads) and RSS once all streams
  hold their messages (RSS per stream = growth over the empty server / streams);
* restart: stop the server cleanly, start it again on the same data and time
  *listening* (the stream port accepts connections) and *all streams available*
  (a consumer subscribed at the first offset of every stream got its first chunk).

The client is lean: raw protocol frames from ``tierlog.formats.protocol``, pipelined,
several connections, so it is not the bottleneck.

Usage::

    python benches/streams_scale.py [--counts 1000,10000] [--rabbitmq 1000|0]

The last line is ``threads_per_stream=<x> rss_kib_per_stream=<y> listen_s_10k=<z>
available_s_10k=<w> restart_ratio_1k=<tierlog / RabbitMQ time to all available, 1,000
streams>`` (threads and RSS of the largest tierlog run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.publish import (
    PublishConfirm,
    PublishError,
    encode_publish,
)

MESSAGES = 100
CONNECTIONS = 4
WINDOW = 200  # requests in flight per connection (publisher / subscription ids are u8)
PAYLOAD = b"x" * 100
FIRST = c.WireOffsetSpec(OffsetType.FIRST)


# --------------------------------------------------------------------------- client


class LeanClient:
    """A minimal pipelining stream-protocol client: responses matched by correlation id,
    confirms and delivers by publisher / subscription id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.corr = 0
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.on_confirm: dict[int, Callable[[int], None]] = {}
        self.on_deliver: dict[int, Callable[[], None]] = {}
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int) -> LeanClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        client = cls(reader, writer)
        client._task = asyncio.create_task(client._read())
        await client.request(lambda corr: c.PeerPropertiesRequest(corr, {}))
        await client.request(lambda corr: c.SaslHandshakeRequest(corr))
        data = c.plain_data("guest", "guest")
        tune = asyncio.get_running_loop().create_future()
        client.waiting[-1] = tune
        await client.request(lambda corr: c.SaslAuthenticateRequest(corr, "PLAIN", data))
        frame_max = (await tune).frame_max
        client.writer.write(c.Tune(frame_max, 0).encode())
        await client.request(lambda corr: c.OpenRequest(corr, "/"))
        return client

    async def _read(self) -> None:
        splitter = FrameSplitter()
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                for future in self.waiting.values():
                    if not future.done():
                        future.set_exception(ConnectionError("closed"))
                return
            for body in splitter.feed(data):
                frame = c.decode_server_frame(body)
                if isinstance(frame, PublishConfirm):
                    callback = self.on_confirm.get(frame.publisher_id)
                    if callback is not None:
                        callback(len(frame.publishing_ids))
                elif isinstance(frame, PublishError):
                    raise RuntimeError(f"publish error {frame.errors[:3]}")
                elif isinstance(frame, Deliver):
                    deliver = self.on_deliver.get(frame.subscription_id)
                    if deliver is not None:
                        deliver()
                elif isinstance(frame, c.Tune):
                    future = self.waiting.pop(-1, None)
                    if future is not None:
                        future.set_result(frame)
                else:
                    corr = getattr(frame, "correlation_id", None)
                    future = self.waiting.pop(corr, None) if corr is not None else None
                    if future is not None and not future.done():
                        future.set_result(frame)

    def request(self, make: Callable[[int], Any]) -> Awaitable[Any]:
        self.corr += 1
        future = asyncio.get_running_loop().create_future()
        self.waiting[self.corr] = future
        self.writer.write(make(self.corr).encode())
        return future

    async def close(self) -> None:
        self.writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await self._task


async def _in_waves(
    clients: list[LeanClient],
    names: list[str],
    work: Callable[[LeanClient, int, str], Awaitable[None]],
) -> None:
    """Run ``work`` for every name, ``WINDOW`` at once per connection, ids 1..WINDOW."""

    async def lane(client: LeanClient, share: list[str]) -> None:
        ids = asyncio.Queue[int]()
        for i in range(1, WINDOW + 1):
            ids.put_nowait(i)

        async def one(name: str) -> None:
            slot = await ids.get()
            try:
                await work(client, slot, name)
            finally:
                ids.put_nowait(slot)

        await asyncio.gather(*(one(n) for n in share))

    await asyncio.gather(*(lane(cl, names[i :: len(clients)]) for i, cl in enumerate(clients)))


async def create_streams(port: int, names: list[str]) -> None:
    clients = [await LeanClient.connect(port) for _ in range(CONNECTIONS)]

    async def create(client: LeanClient, _slot: int, name: str) -> None:
        response = await client.request(lambda corr: c.CreateRequest(corr, name, {}))
        if response.response_code != ResponseCode.OK:
            raise RuntimeError(f"create {name}: code {response.response_code}")

    try:
        await _in_waves(clients, names, create)
    finally:
        for client in clients:
            await client.close()


async def publish_all(port: int, names: list[str]) -> None:
    clients = [await LeanClient.connect(port) for _ in range(CONNECTIONS)]
    frame = [(i + 1, PAYLOAD) for i in range(MESSAGES)]

    async def publish(client: LeanClient, slot: int, name: str) -> None:
        declared = await client.request(
            lambda corr: c.DeclarePublisherRequest(corr, slot, "", name)
        )
        if declared.response_code != ResponseCode.OK:
            raise RuntimeError(f"declare publisher {name}: code {declared.response_code}")
        done = asyncio.get_running_loop().create_future()
        confirmed = [0]

        def on_confirm(n: int) -> None:
            confirmed[0] += n
            if confirmed[0] >= MESSAGES and not done.done():
                done.set_result(None)

        client.on_confirm[slot] = on_confirm
        client.writer.write(encode_publish(slot, frame))
        await done
        del client.on_confirm[slot]
        await client.request(lambda corr: c.DeletePublisherRequest(corr, slot))

    try:
        await _in_waves(clients, names, publish)
    finally:
        for client in clients:
            await client.close()


async def wait_all_available(port: int, names: list[str], deadline: float) -> None:
    """Every stream delivers its first chunk to a consumer at offset first (retrying
    while the server answers STREAM_NOT_AVAILABLE)."""
    clients: list[LeanClient] = []
    while not clients:
        try:
            clients = [await LeanClient.connect(port) for _ in range(CONNECTIONS)]
        except (ConnectionError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)

    async def consume(client: LeanClient, slot: int, name: str) -> None:
        while True:
            got: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def delivered(got: asyncio.Future[None] = got) -> None:
                if not got.done():
                    got.set_result(None)

            client.on_deliver[slot] = delivered
            response = await client.request(
                lambda corr: c.SubscribeRequest(corr, slot, name, FIRST, 1)
            )
            if response.response_code == ResponseCode.OK:
                await asyncio.wait_for(got, max(1.0, deadline - time.monotonic()))
                del client.on_deliver[slot]
                await client.request(lambda corr: c.UnsubscribeRequest(corr, slot))
                return
            del client.on_deliver[slot]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not available: code {response.response_code}")
            await asyncio.sleep(0.05)

    try:
        await _in_waves(clients, names, consume)
    finally:
        for client in clients:
            await client.close()


# --------------------------------------------------------------------------- servers


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, RSS KiB) of a process."""
    threads = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return threads, rss


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TierlogNode:
    base: Path
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start the server; seconds until the stream port accepts connections."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
        env.update(
            TIERLOG_SERVER_PORT=str(self.port),
            TIERLOG_SERVER_ADMIN_PORT=str(self.admin_port),
            TIERLOG_STORAGE_DATA_DIR=str(self.base / "data"),
            TIERLOG_SERVER_LOG_LEVEL="WARNING",
            TIERLOG_SERVER_HEARTBEAT="0",
        )
        started = time.monotonic()
        log = open(self.base / "server.log", "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tierlog", "serve"], env=env, stdout=log, stderr=log
        )
        while not port_open(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"tierlog serve exited: see {self.base / 'server.log'}")
            time.sleep(0.01)
        return time.monotonic() - started

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> float:
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - started


def run_tierlog(count: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="tierlog-scale-"))
    names = [f"s{i:05d}" for i in range(count)]
    node = TierlogNode(base)
    out: dict[str, float] = {"streams": count}
    try:
        node.start()
        time.sleep(1.0)
        threads0, rss0 = proc_status(node.pid)
        t = time.monotonic()
        asyncio.run(create_streams(node.port, names))
        out["create_s"] = time.monotonic() - t
        t = time.monotonic()
        asyncio.run(publish_all(node.port, names))
        out["publish_s"] = time.monotonic() - t
        time.sleep(2.0)
        threads, rss = proc_status(node.pid)
        out.update(threads_empty=threads0, rss_kib_empty=rss0, threads=threads, rss_kib=rss)
        out["stop_s"] = node.stop()
        t = time.monotonic()
        out["listen_s"] = node.start()
        asyncio.run(wait_all_available(node.port, names, time.monotonic() + 1800))
        out["available_s"] = time.monotonic() - t
        threads, rss = proc_status(node.pid)
        out.update(threads_restarted=threads, rss_kib_restarted=rss)
        node.stop()
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
        shutil.rmtree(base, ignore_errors=True)
    return out


def run_rabbitmq(count: int) -> dict[str, float]:
    from rabbitmq_node import rabbitmq_node

    base = Path(tempfile.mkdtemp(prefix="tierlog-scale-rmq-"))
    names = [f"s{i:05d}" for i in range(count)]
    out: dict[str, float] = {"streams": count}
    nodename = f"tierlog-scale-{os.getpid()}@localhost"
    try:
        with rabbitmq_node(base, nodename=nodename) as node:
            pid = _beam_pid(nodename)
            threads0, rss0 = proc_status(pid)
            t = time.monotonic()
            asyncio.run(create_streams(node.stream_port, names))
            out["create_s"] = time.monotonic() - t
            t = time.monotonic()
            asyncio.run(publish_all(node.stream_port, names))
            out["publish_s"] = time.monotonic() - t
            time.sleep(2.0)
            threads, rss = proc_status(pid)
            out.update(threads_empty=threads0, rss_kib_empty=rss0, threads=threads, rss_kib=rss)
        t = time.monotonic()
        with rabbitmq_node(base, nodename=nodename) as node:
            out["listen_s"] = time.monotonic() - t
            asyncio.run(wait_all_available(node.stream_port, names, time.monotonic() + 1800))
            out["available_s"] = time.monotonic() - t
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def _beam_pid(nodename: str) -> int:
    """The pid of the node's Erlang VM (its environment or command line names the node)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not cmdline or b"beam" not in cmdline[0]:
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            if nodename.encode() in environ or nodename.encode() in b" ".join(cmdline):
                return int(entry)
    raise RuntimeError(f"no Erlang VM for {nodename}")


@contextlib.contextmanager
def _timed(label: str) -> Iterator[None]:
    t = time.monotonic()
    yield
    print(f"  ({label}: {time.monotonic() - t:.1f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="1000,10000", help="tierlog stream counts")
    parser.add_argument("--rabbitmq", type=int, default=1000, help="RabbitMQ streams (0: skip)")
    args = parser.parse_args()
    counts = [int(x) for x in args.counts.split(",") if x]
    print(f"load average at start: {os.getloadavg()}, cpus: {os.cpu_count()}", flush=True)
    results: dict[str, dict[str, float]] = {}
    for count in counts:
        with _timed(f"tierlog {count}"):
            results[f"tierlog_{count}"] = run_tierlog(count)
        print(f"tierlog {count}: {json.dumps(_rounded(results[f'tierlog_{count}']))}", flush=True)
    if args.rabbitmq:
        with _timed(f"rabbitmq {args.rabbitmq}"):
            results["rabbitmq"] = run_rabbitmq(args.rabbitmq)
        print(f"rabbitmq {args.rabbitmq}: {json.dumps(_rounded(results['rabbitmq']))}", flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    big = results[f"tierlog_{max(counts)}"]
    n = big["streams"]
    threads_per_stream = big["threads"] / n
    rss_per_stream = (big["rss_kib"] - big["rss_kib_empty"]) / n
    ten_k = results.get("tierlog_10000", {})
    one_k = results.get("tierlog_1000", {})
    rabbit = results.get("rabbitmq", {})
    ratio = (
        one_k["available_s"] / rabbit["available_s"]
        if one_k and rabbit and rabbit["streams"] == 1000
        else float("nan")
    )
    print(
        f"threads_per_stream={threads_per_stream:.4f} rss_kib_per_stream={rss_per_stream:.1f} "
        f"listen_s_10k={ten_k.get('listen_s', float('nan')):.2f} "
        f"available_s_10k={ten_k.get('available_s', float('nan')):.2f} "
        f"restart_ratio_1k={ratio:.2f}"
    )
    return 0


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


if __name__ == "__main__":
    raise SystemExit(main())
