"""Benchmark: tiering a committed local log to SeaweedFS against raw obstore PUTs, same run.

Builds a local log first (1 KiB records in batches of 1,000, ``fsync="never"`` then one
``sync()``; not timed), then times tiering at production defaults (``TieringConfig()``:
64 MiB fragments, 4 concurrent uploads, debounce 5 fragments / 2 s, M = 1024) from
``StreamTierer.start()`` (resolution + fencing commit) until ``flush()`` reports everything
durable. By default the debounce governs the bulk and ``flush()`` is called only once the
uncut tail (< 1 fragment, which would otherwise wait ``max_fragment_age``) is all that is left
and an upload slot is free; ``--flush-at-start`` calls it right after ``start()``, which
commits every uploaded run at once (a flush bypasses the debounce) and so shows the PUT count
of a forced flush rather than of steady tiering. Then PUTs equally many objects of exactly
the fragments' sizes with the raw obstore client at the same concurrency (4 threads,
single-request PUTs). A few untimed raw PUTs first warm up connections and SeaweedFS's volume
allocation so neither side pays for it.

Object-creating requests per GiB tiered count fragment PUTs plus manifest PUTs (branch and
root objects; ``ManifestCommitter.puts``); DELETEs are not counted.

Last line: ``tier_ratio=<tierlog MB/s / raw MB/s> puts_per_gib=<...>``.

    .venv/bin/python benches/tiering.py [--gib 2] [--dir /tmp] [--flush-at-start]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import obstore
from obstore.store import S3Store
from tests.plugins.seaweed import SeaweedServer, start_seaweed

from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import Catalog
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.state import PlanStatus, TieringConfig
from tierlog.tiering.tierer import StreamTierer

GIB = 1024**3
MIB = 1024**2
RECORD = 1024
BATCH = 1000
CONCURRENCY = TieringConfig().max_uploads  # the raw side uses the tierer's upload bound
WARMUP_OBJECTS = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0, help="GiB of log to tier")
    parser.add_argument("--dir", default="/tmp", help="parent directory for all data")
    parser.add_argument(
        "--flush-at-start",
        action="store_true",
        help="call flush() right after start() (a flush commits each uploaded run at once, "
        "bypassing the debounce); default: let the debounce govern, flush for the uncut tail "
        "once an upload slot is free after the last full fragment",
    )
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tierlog-bench-tiering-", dir=args.dir)
    server: SeaweedServer | None = None
    try:
        server = start_seaweed(os.path.join(workdir, "seaweed"))
        run(server, workdir, int(args.gib * GIB), args.flush_at_start)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def build_log(workdir: str, catalog: Catalog, total: int) -> StreamLog:
    """Append ``total`` bytes of 1 KiB records with fsync="never", then commit with sync()."""
    record = catalog.create("/", "bench")
    stream_log = StreamLog.create(
        os.path.join(workdir, "data"),
        "/",
        "bench",
        LogConfig(fsync="never"),
        created_ns=record.created_ns,
    )
    pool = os.urandom(8 * MIB)
    span = BATCH * RECORD
    batches = -(-total // span)
    for i in range(batches):
        start = (i * 4096) % (len(pool) - span)
        stream_log.append_records(
            [pool[j : j + RECORD] for j in range(start, start + span, RECORD)]
        )
    stream_log.sync()
    return stream_log


def wait_for_tail_slot(tierer: StreamTierer, target: int, timeout: float = 1800.0) -> None:
    """Let the debounce govern the bulk: wait (without Flush) until every chunk is handed to
    the state machine, every full fragment is cut and has started uploading, and an upload
    slot is free. Only the uncut tail (< 1 fragment) is then left, which would otherwise wait
    ``max_fragment_age`` (60 s); the caller flushes it. Reads the state from this thread."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not tierer.halted:
        state = tierer.state
        if state is not None and state.pending_offset >= target:
            statuses = [status for _plan, status in state.plans()]
            waiting = PlanStatus.QUEUED in statuses or PlanStatus.WAITING_RETRY in statuses
            if not waiting and state.in_flight() < tierer.config.max_uploads:
                return
        time.sleep(0.01)


def run(server: SeaweedServer, workdir: str, total: int, flush_at_start: bool) -> None:
    meta = SqliteMetaStore(os.path.join(workdir, "meta.db"))
    catalog = Catalog(meta)
    deletions = DeletionQueue(meta)
    started = time.perf_counter()
    stream_log = build_log(workdir, catalog, total)
    built = time.perf_counter() - started
    log_bytes = sum(
        s.stat().st_size for s in os.scandir(stream_log.stream_dir) if s.name.endswith(".segment")
    )
    print(f"local log: {log_bytes / MIB:.0f} MiB committed in {built:.1f} s (untimed)")

    store = S3ObjectStore(
        S3Config(
            bucket=server.bucket,
            prefix="bench/tierlog",
            endpoint=server.endpoint,
            region=server.region,
            access_key_id=server.access_key,
            secret_access_key=server.secret_key,
        )
    )
    raw = S3Store(
        server.bucket,
        prefix="bench/raw",
        endpoint=server.endpoint,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        client_options={"allow_http": True},
    )
    payload = memoryview(os.urandom(80 * MIB))
    pool = ThreadPoolExecutor(CONCURRENCY)

    def put_raw(key: str, size: int) -> None:
        obstore.put(raw, key, payload[:size], use_multipart=False)

    warm = [f"warm-{i}" for i in range(WARMUP_OBJECTS)]
    list(pool.map(put_raw, warm, [64 * MIB] * len(warm)))
    obstore.delete(raw, warm)

    tierer = StreamTierer(stream_log, store, catalog, deletions, config=TieringConfig())
    target = stream_log.commit_point().next_offset
    started = time.perf_counter()
    tierer.start()
    if not flush_at_start:
        wait_for_tail_slot(tierer, target)
    durable = tierer.flush(timeout=1800.0)
    tier_s = time.perf_counter() - started
    if not durable or tierer.durable_next < target:
        raise SystemExit(f"tiering did not finish: durable={durable} halted={tierer.halted}")
    tierer.stop(flush=False)

    locations = list(tierer.committer.tree.iter_fragments(tierer.remote.load))
    sizes = [store.head(loc.key).size for loc in locations]
    tiered = sum(sizes)
    print(
        f"tierlog: {len(sizes)} fragments ({min(sizes) / MIB:.1f}..{max(sizes) / MIB:.1f} MiB), "
        f"{tiered / MIB:.0f} MiB in {tier_s:.2f} s = {tiered / MIB / tier_s:.1f} MiB/s; "
        f"fragment PUTs {tierer.puts}, manifest PUTs {tierer.committer.puts}, "
        f"commits {tierer.committer.commits}, height {tierer.committer.tree.height}"
    )

    keys = [f"obj-{i:05d}" for i in range(len(sizes))]
    started = time.perf_counter()
    list(pool.map(put_raw, keys, sizes))
    raw_s = time.perf_counter() - started
    print(
        f"raw obstore: {len(sizes)} PUTs, {tiered / MIB:.0f} MiB in {raw_s:.2f} s = "
        f"{tiered / MIB / raw_s:.1f} MiB/s (concurrency {CONCURRENCY})"
    )

    obstore.delete(raw, keys)
    pool.shutdown()
    store.close()
    stream_log.close()
    meta.close()

    tier_ratio = (tiered / tier_s) / (tiered / raw_s)
    puts_per_gib = (tierer.puts + tierer.committer.puts) / (tiered / GIB)
    print(f"tier_ratio={tier_ratio:.3f} puts_per_gib={puts_per_gib:.2f}")


if __name__ == "__main__":
    main()
