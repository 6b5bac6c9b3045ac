"""Benchmark: restarting a server whose delayed stream delivered 10,000,000 messages and
holds 100,000 pending, against restarting the same server with an ordinary stream of the
same size.

How the history is built (docs/benchmarks.md says the same):

1. ``tierlog serve`` (``[tier] enabled = false``: one node, nothing parked, every pending
   message in the working set) runs; the 100,000 pending messages are published through
   the real intake with rstream (``x-deliver-at``: 1,000 of them 90 s ahead, so they are
   due when the measured restarts come, the rest one day ahead). The server stops cleanly.
2. The delivered history is appended through the internal append path (``StreamLog.append``
   on the stopped server's logs, as the scheduler's port appends): to the system stream,
   10,000,000 ``SCHEDULE`` records (due in the past, producer ``hist``) in batches of 500,
   each batch's ``DISPATCH`` intent after it; to the stream, the 10,000,000 messages under
   the dispatcher producer with publishing ids 1.., 500 a chunk. Then the checkpoint the
   scheduler writes at that point (a ``CARRY`` of each pending message with its published
   bytes, then the ``CHECKPOINT`` record), the retention the floor allows (sealed segments
   of the system stream wholly below the checkpoint deleted) and the checkpoint pointer.
   The scheduler would have written a checkpoint every ~100,000 records on the way; each
   of them is below the last one and retention removes it, so the data directory is the
   one the live path leaves (its older checkpoints never reach a restart).
3. The baseline: a second data directory with one ordinary stream of 10,100,000 messages
   of the same size, appended the same way.

Measured, tierlog and baseline alternating (``--rounds``), each on a fresh copy of its data
directory: the server is spawned and a consumer attaches at ``next`` as soon as the stream
port accepts; ``ready_s`` is the time from the spawn to the first message it receives (a
due scheduled message; for the baseline, a message published as soon as the stream is
open); ``rss_mib`` is the server's peak RSS (``VmHWM``) 3 s after that, minus the peak RSS
of the same server started on an empty data directory.

    PYTHONPATH=src python benches/delayed_restart.py [--delivered 10000000] [--pending 100000]

The last line is ``delayed_restart rss_mib=.. ready_s=..`` (medians over the rounds; the
line before it gives the ratios to the baseline). Targets: RSS growth <= 128 MiB, ready
<= 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.consumer import Consumer, MessageContext
from rstream.producer import ConfirmationStatus
from tests.plugins.tierlog_server import TierlogServerProcess

from tierlog.delayed.pointer import CheckpointPointer
from tierlog.delayed.records import (
    Schedule,
    decode_system_record,
    encode_carry,
    encode_checkpoint,
    encode_dispatch,
    encode_schedule,
    msg_id_of,
)
from tierlog.formats.amqp import encode_message
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.server.delayed_intake import DISPATCHER_REFERENCE, SYSTEM_PREFIX
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

HOST = "127.0.0.1"
STREAM = "jobs"
PLAIN = "plain"
BATCH = 500
CONFIG = "[tier]\nenabled = false\n"
DUE_SOON_S = 90


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def _admin(server: TierlogServerProcess, method: str, path: str, body: object = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{server.admin_url}{path}", data=data, method=method)
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30):
        pass


def _stream_dir(data_dir: Path, name: str) -> Path:
    streams = data_dir / "streams"
    found = [p for p in streams.iterdir() if p.name.startswith(f"__{name}_")]
    if len(found) != 1:
        raise RuntimeError(f"{name}: {found}")
    return found[0]


async def _publish_pending(port: int, pending: int, now_ms: int) -> None:
    confirmed = 0
    done = asyncio.Event()

    async def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed
        if status.is_confirmed:
            confirmed += 1
            if confirmed == pending:
                done.set()

    async with Producer(HOST, port=port, username="guest", password="guest") as producer:
        for start in range(0, pending, 1000):
            batch = []
            for pid in range(start + 1, min(pending, start + 1000) + 1):
                later = DUE_SOON_S * 1000 if pid <= 1000 else 86_400_000
                message = AMQPMessage(
                    body=b"pending-%08d" % pid,
                    application_properties={"x-deliver-at": now_ms + later},
                )
                message.publishing_id = pid
                batch.append(message)
            await producer.send_batch(
                STREAM, batch, publisher_name="app", on_publish_confirm=on_confirm
            )
        await asyncio.wait_for(done.wait(), 300)


def build_delayed(data_dir: Path, delivered: int, pending: int) -> float:
    """The delayed stream's data directory (see the module docstring); returns the time by
    which the 1,000 soon-due messages are due (epoch seconds)."""
    server = TierlogServerProcess(data_dir, config_text=CONFIG).start()
    now_ms = int(time.time() * 1000)
    try:
        _admin(
            server,
            "POST",
            "/api/streams",
            {"name": STREAM, "arguments": {"x-tierlog-delayed": "true"}},
        )
        asyncio.run(_publish_pending(server.stream_port, pending, now_ms))
    finally:
        server.stop()
    system_dir = _stream_dir(data_dir, SYSTEM_PREFIX + STREAM)
    target_dir = _stream_dir(data_dir, STREAM)
    incarnation = target_dir.name
    config = LogConfig(fsync="never")
    system = StreamLog.open(str(system_dir), config)
    target = StreamLog.open(str(target_dir), config)
    try:
        pending_records = []
        with system.reader(OffsetSpec.first()) as reader:
            for _offset, raw in reader.records():
                record = decode_system_record(raw)
                if isinstance(record, Schedule):
                    pending_records.append(record)
        assert len(pending_records) == pending, len(pending_records)
        past = now_ms - 3_600_000
        body = encode_message(b"delivered-message-0000")
        for first in range(1, delivered + 1, BATCH):
            pids = list(range(first, min(delivered, first + BATCH - 1) + 1))
            system.append([encode_schedule(past, "hist", p, body) for p in pids], "hist", pids)
            ids = [msg_id_of(incarnation, "hist", p) for p in pids]
            system.append([encode_dispatch(first, ids)])
            target.append([body] * len(pids), DISPATCHER_REFERENCE, pids)
        through = system.sync().next_offset
        carries = [
            encode_carry(
                through,
                msg_id_of(incarnation, r.reference, r.publishing_id),
                r.due_ms,
                0,
                False,
                r.message,
            )
            for r in pending_records
        ]
        for k in range(0, len(carries), 5000):
            system.append(carries[k : k + 5000])
        at = system.sync().next_offset
        system.append([encode_checkpoint(through, delivered + 1, len(carries))])
        system.sync()
        target.sync()
        for segment in system.list_segments():  # retention below the checkpoint
            if not segment.sealed or segment.next_offset > through:
                break
            system.delete_segment(segment.first_offset)
    finally:
        system.close()
        target.close()
    meta = SqliteMetaStore(str(data_dir / "meta.db"))
    try:
        CheckpointPointer(meta, incarnation).store(through, at)
    finally:
        meta.close()
    return now_ms / 1000 + DUE_SOON_S


def build_plain(data_dir: Path, messages: int) -> None:
    server = TierlogServerProcess(data_dir, config_text=CONFIG).start()
    try:
        _admin(server, "POST", "/api/streams", {"name": PLAIN, "arguments": {}})
    finally:
        server.stop()
    log = StreamLog.open(str(_stream_dir(data_dir, PLAIN)), LogConfig(fsync="never"))
    try:
        body = encode_message(b"delivered-message-0000")
        for first in range(1, messages + 1, BATCH):
            count = min(BATCH, messages - first + 1)
            log.append([body] * count)
        log.sync()
    finally:
        log.close()


async def _first_message(port: int, stream: str, publish: bool, deadline: float) -> float:
    """When the first message reached a consumer attached at ``next`` (monotonic)."""
    got = asyncio.Event()
    at = [0.0]

    async def on_message(msg: object, ctx: MessageContext) -> None:
        if not got.is_set():
            at[0] = time.monotonic()
            got.set()

    consumer = Consumer(HOST, port=port, username="guest", password="guest")
    await consumer.start()
    try:
        while True:
            try:
                await consumer.subscribe(
                    stream,
                    on_message,
                    offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT),
                )
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
        if publish:
            async with Producer(HOST, port=port, username="guest", password="guest") as p:
                await p.send_wait(stream, AMQPMessage(body=b"probe"))
        await asyncio.wait_for(got.wait(), max(1.0, deadline - time.monotonic()))
    finally:
        await consumer.close()
    return at[0]


def measure(data_dir: Path, stream: str, publish: bool, work: Path) -> tuple[float, int]:
    """(seconds from spawn to the first message, peak RSS KiB 3 s later) of a restart on a
    fresh copy of ``data_dir``."""
    copy = work / "run-data"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data_dir, copy)
    server = TierlogServerProcess(copy, config_text=CONFIG)
    spawned = time.monotonic()
    server.start(wait_streams=False)
    try:
        assert server.proc is not None
        first = asyncio.run(_first_message(server.stream_port, stream, publish, spawned + 120))
        time.sleep(3)
        return first - spawned, _peak_rss_kib(server.proc.pid)
    finally:
        server.stop()
        shutil.rmtree(copy, ignore_errors=True)


def empty_peak(work: Path) -> int:
    data = work / "empty-data"
    shutil.rmtree(data, ignore_errors=True)
    server = TierlogServerProcess(data, config_text=CONFIG).start()
    try:
        time.sleep(3)
        assert server.proc is not None
        return _peak_rss_kib(server.proc.pid)
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delivered", type=int, default=10_000_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data and server logs")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tierlog-delayed-restart-"))
    print(f"load average at start: {os.getloadavg()}, cpus: {os.cpu_count()}", flush=True)
    try:
        started = time.monotonic()
        due_by = build_delayed(work / "delayed", args.delivered, args.pending)
        print(f"  (delayed history built: {time.monotonic() - started:.0f} s)", flush=True)
        started = time.monotonic()
        build_plain(work / "plain", args.delivered + args.pending)
        print(f"  (baseline built: {time.monotonic() - started:.0f} s)", flush=True)
        with contextlib.suppress(ValueError):
            time.sleep(max(0.0, due_by + 1 - time.time()))
        results: dict[str, list[tuple[float, float]]] = {"tierlog": [], "baseline": []}
        for round_ in range(args.rounds):
            base = empty_peak(work)
            for name in ("tierlog", "baseline") if round_ % 2 == 0 else ("baseline", "tierlog"):
                if name == "tierlog":
                    ready, peak = measure(work / "delayed", STREAM, False, work)
                else:
                    ready, peak = measure(work / "plain", PLAIN, True, work)
                growth = (peak - base) / 1024
                results[name].append((ready, growth))
                print(
                    f"round {round_ + 1} {name}: ready_s={ready:.2f} rss_mib={growth:.1f}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    ready = statistics.median(r for r, _ in results["tierlog"])
    rss = statistics.median(g for _, g in results["tierlog"])
    base_ready = statistics.median(r for r, _ in results["baseline"])
    base_rss = statistics.median(g for _, g in results["baseline"])
    print(
        f"baseline rss_mib={base_rss:.1f} ready_s={base_ready:.2f} "
        f"ratio_rss={rss / max(base_rss, 0.1):.2f} ratio_ready={ready / max(base_ready, 0.01):.2f}"
    )
    print(f"delayed_restart rss_mib={rss:.1f} ready_s={ready:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
