"""Benchmark: a filtered consume from the remote tier (stream filtering, issue 32).

A ``tierlog serve`` subprocess (filesystem object store under its data directory, the local
copy freed as soon as it is tiered) gets ``--chunks`` chunks, one Publish v2 frame each
(confirmed before the next, so a chunk never merges two frames) of ``--per-chunk`` messages
of ``--size`` bytes: 100 filter values, 2 per chunk (chunk ``j`` holds ``v{2j mod 100}``
and ``v{2j+1 mod 100}``, half its messages each), so one value is 1 % of the stream. Once
everything is tiered and the local segments are freed, a subscription with ``filter.0``
of one value reads from ``first`` to the last chunk holding it (every such chunk must
arrive). The figure: bytes the server fetched from the object store during the consume
(``tierlog_object_store_downloaded_bytes_total``, fragment indexes included) ÷ the bytes
of the stream in the remote tier (its status ``remote.bytes``). Without filtering it is
1.0 or more; the target is ≤ 0.05.

    .venv/bin/python benches/filtered_consume.py [--chunks 5000] [--quick]

Last line: ``filtered_fraction_read=<fraction> chunks_delivered=<n> chunks_expected=<n>``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))

from lean_client import LeanConnection  # noqa: E402

from tierlog.formats.chunk import decode_header  # noqa: E402
from tierlog.formats.protocol import commands as c  # noqa: E402
from tierlog.formats.protocol.constants import OffsetType  # noqa: E402
from tierlog.formats.protocol.deliver import Deliver  # noqa: E402
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish  # noqa: E402

STREAM = "filtered"
VALUES = 100
STREAM_ARGS = {
    "stream-max-segment-size-bytes": str(1 << 20),
    "x-tierlog-local-max-bytes": "1",
    "x-tierlog-fragment-bytes": str(4 << 20),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.05",
}
DOWNLOADED = "tierlog_object_store_downloaded_bytes_total"
_AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


@contextlib.contextmanager
def server() -> Iterator[tuple[int, int]]:
    """A ``tierlog serve`` subprocess with a fast tier cycle; yields (stream, admin) ports."""
    base = Path(tempfile.mkdtemp(prefix="tierlog-filter-bench-"))
    ready = base / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    env.update(
        TIERLOG_SERVER_PORT="0",
        TIERLOG_SERVER_ADMIN_PORT="0",
        TIERLOG_SERVER_READY_FILE=str(ready),
        TIERLOG_STORAGE_DATA_DIR=str(base / "data"),
        TIERLOG_SERVER_LOG_LEVEL="WARNING",
        TIERLOG_TIER_LOCAL_RETENTION_INTERVAL_SECONDS="0.2",
        TIERLOG_TIER_DELETE_GRACE_SECONDS="0",
    )
    proc = subprocess.Popen([sys.executable, "-m", "tierlog", "serve"], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tierlog serve did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        yield int(info["stream_port"]), int(info["admin_port"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def admin_get(admin: int, path: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{admin}{path}")
    request.add_header("Authorization", _AUTH)
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())


def metric(admin: int, name: str) -> float:
    for line in admin_get(admin, "/metrics").decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def status(admin: int) -> dict[str, Any]:
    return dict(json.loads(admin_get(admin, f"/api/streams/{STREAM}")))


def chunk_values(j: int) -> tuple[str, str]:
    return f"v{(2 * j) % VALUES}", f"v{(2 * j + 1) % VALUES}"


def publish(port: int, chunks: int, per_chunk: int, size: int) -> None:
    """One confirmed Publish v2 frame per chunk (two filter values, half the messages each)."""
    conn = LeanConnection("127.0.0.1", port)
    conn.create(STREAM, STREAM_ARGS)
    conn.send(c.DeclarePublisherRequest(conn.corr(), 1, "", STREAM).encode())
    conn.expect(c.SimpleResponse)
    noise = random.Random(1)
    pid = 0
    for j in range(chunks):
        a, b = chunk_values(j)
        messages = [(pid + i, noise.randbytes(size)) for i in range(per_chunk)]
        values = [a if i % 2 == 0 else b for i in range(per_chunk)]
        pid += per_chunk
        conn.send(encode_publish(1, messages, filter_values=values))
        conn.expect(PublishConfirm)
    conn.close()


def wait_tiered_and_freed(admin: int, next_offset: int, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status(admin)
        local, remote = s["local"], s["remote"]
        if remote["tiered_offset"] >= next_offset and local["first_offset"] > next_offset // 2:
            return s
        time.sleep(0.2)
    raise RuntimeError(f"stream not tiered and freed in {timeout:.0f} s: {status(admin)}")


def consume(port: int, value: str, last_chunk: int) -> int:
    """Chunks delivered to a ``filter.0=value`` subscription from ``first`` through
    ``last_chunk`` (credit kept ahead; the client would post-filter their messages)."""
    conn = LeanConnection("127.0.0.1", port)
    spec = c.WireOffsetSpec(OffsetType.FIRST)
    conn.send(c.SubscribeRequest(conn.corr(), 1, STREAM, spec, 64, {"filter.0": value}).encode())
    answer = conn.expect(c.SimpleResponse)
    assert isinstance(answer, c.SimpleResponse) and answer.response_code == 1, answer
    delivered = 0
    while True:
        frame = conn.expect(Deliver)
        assert isinstance(frame, Deliver)
        delivered += 1
        conn.send(c.CreditRequest(1, 1).encode())
        if decode_header(bytes(frame.chunk)).chunk_id >= last_chunk:
            break
    conn.close()
    return delivered


def run(chunks: int, per_chunk: int, size: int) -> tuple[float, int, int]:
    """(fraction read, chunks delivered, chunks holding the value below the local copy)."""
    with server() as (port, admin):
        publish(port, chunks, per_chunk, size)
        s = wait_tiered_and_freed(admin, chunks * per_chunk)
        local_first = s["local"]["first_offset"]
        value = "v17"  # chunk j holds it when (2j + 1) mod 100 == 17
        holding = [j * per_chunk for j in range(chunks) if value in chunk_values(j)]
        remote_only = [first for first in holding if first < local_first]
        before = metric(admin, DOWNLOADED)
        delivered = consume(port, value, remote_only[-1])
        read = metric(admin, DOWNLOADED) - before
        return read / s["remote"]["bytes"], delivered, len(remote_only)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=5_000)
    parser.add_argument("--per-chunk", type=int, default=20)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.chunks = 1_000
    fraction, delivered, expected = run(args.chunks, args.per_chunk, args.size)
    print(
        f"filtered_fraction_read={fraction:.4f} chunks_delivered={delivered} "
        f"chunks_expected={expected}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
