"""Benchmark: tiering a committed local log to SeaweedFS against raw obstore PUTs, same run.

Builds a local log first (1 KiB records in batches of 1,000, ``fsync="never"`` then one
``sync()``; not timed), then times tiering at production defaults (``TieringConfig()``:
64 MiB fragments, 4 concurrent uploads, commit batches of 8 fragments / 512 MiB, M = 1024) from
``StreamTierer.start()`` (resolution + fencing commit) until ``flush()`` reports everything
durable. By default the commit rule governs the bulk and ``flush()`` is called only once
the uncut tail (< 1 fragment, which would otherwise wait ``max_fragment_age``) is all that
is left and an upload slot is free; ``--flush-at-start`` calls it right after ``start()``
(a flush commits full batches at once and the rest once the last upload lands, so the
commit count is the same). Then PUTs equally many objects of exactly
the fragments' sizes with the raw obstore client at the same concurrency (4 threads,
single-request PUTs). A few untimed raw PUTs first warm up connections and SeaweedFS's volume
allocation so neither side pays for it.

Requests per GiB tiered count every request the tierer's object store sends while tiering
runs, whatever its kind: PUTs and create-only PUTs (fragments, manifest branches and roots),
multipart initiate / part / complete / abort, GETs, HEADs, list pages, DELETEs (a bulk
delete is one request). They are counted where each HTTP request is made
(``S3ObjectStore._request``, so retries count too), not inferred from the tierer's own
counters; the breakdown by kind is printed. The manifest pointer lives in the MetaStore,
not the object store.

``--rounds N`` repeats the whole measurement with a fresh log, alternating which side goes
first (tierlog then raw, raw then tierlog, ...), and reports the medians of the per-round
ratios: the machine is shared, so a single order would measure its load as much as either
side.

Last line: ``tier_ratio=<tierlog MB/s / raw MB/s> puts_per_gib=<requests / GiB>``.

    .venv/bin/python benches/tiering.py [--gib 2] [--dir /tmp] [--flush-at-start] [--rounds 1]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import threading
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

_MULTIPART = {
    "create multipart": "multipart_initiate",
    "upload part": "multipart_part",
    "complete multipart": "multipart_complete",
    "abort multipart": "multipart_abort",
}


class CountingS3Store(S3ObjectStore):
    """The tierer's store, counting every HTTP request it makes, by kind."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _request(self, what, operation):  # type: ignore[no-untyped-def]
        two = " ".join(what.split(" ", 2)[:2])
        kind = _MULTIPART.get(two) or what.split(" ", 1)[0]
        if kind == "create":
            kind = "put_if_absent"
        with self._count_lock:
            self.requests[kind] += 1
        return super()._request(what, operation)

    def take_counts(self) -> collections.Counter[str]:
        with self._count_lock:
            counts, self.requests = self.requests, collections.Counter()
        return counts


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
        help="call flush() right after start() (a flush commits full batches at once and the "
        "rest when the last upload lands); default: let the commit rule govern, flush the tail "
        "once an upload slot is free after the last full fragment",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (medians)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tierlog-bench-tiering-", dir=args.dir)
    server: SeaweedServer | None = None
    ratios: list[float] = []
    per_gib: list[float] = []
    sizes: list[int] = []
    try:
        server = start_seaweed(os.path.join(workdir, "seaweed"))
        for i in range(args.rounds):
            with open("/proc/loadavg") as f:
                load = " ".join(f.read().split()[:3])
            print(f"round {i + 1} (load {load}): {'raw' if i % 2 else 'tierlog'} first")
            round_dir = os.path.join(workdir, f"round-{i}")
            os.makedirs(round_dir)
            ratio, requests, sizes = run(
                server,
                round_dir,
                int(args.gib * GIB),
                args.flush_at_start,
                i,
                sizes if i % 2 else None,
            )
            ratios.append(ratio)
            per_gib.append(requests)
            shutil.rmtree(round_dir, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.rounds > 1:
        print(f"per round: tier_ratio {[round(r, 3) for r in ratios]} puts_per_gib {per_gib}")
    ratio, requests = statistics.median(ratios), statistics.median(per_gib)
    print(f"tier_ratio={ratio:.3f} puts_per_gib={requests:.2f}")


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


def run(
    server: SeaweedServer,
    workdir: str,
    total: int,
    flush_at_start: bool,
    round_no: int = 0,
    raw_sizes: list[int] | None = None,
) -> tuple[float, float, list[int]]:
    """One round (the raw side first when given ``raw_sizes``); returns (tier_ratio,
    requests per GiB, fragment sizes)."""
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

    store = CountingS3Store(
        S3Config(
            bucket=server.bucket,
            prefix=f"bench/tierlog-{round_no}",
            endpoint=server.endpoint,
            region=server.region,
            access_key_id=server.access_key,
            secret_access_key=server.secret_key,
        )
    )
    store.take_counts()  # the construction's probe is not tiering
    raw = S3Store(
        server.bucket,
        prefix=f"bench/raw-{round_no}",
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

    def raw_side(sizes: list[int]) -> float:
        keys = [f"obj-{i:05d}" for i in range(len(sizes))]
        started = time.perf_counter()
        list(pool.map(put_raw, keys, sizes))
        raw_s = time.perf_counter() - started
        print(
            f"raw obstore: {len(sizes)} PUTs, {sum(sizes) / MIB:.0f} MiB in {raw_s:.2f} s = "
            f"{sum(sizes) / MIB / raw_s:.1f} MiB/s (concurrency {CONCURRENCY})"
        )
        obstore.delete(raw, keys)
        return raw_s

    # The raw side PUTs objects of the fragments' sizes; when it goes first it takes the
    # previous round's fragment sizes (same log, same cut), checked afterwards.
    raw_s = 0.0
    if raw_sizes:
        raw_s = raw_side(raw_sizes)

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
    requests = store.take_counts()  # everything the tierer sent, start to stop

    locations = list(tierer.committer.tree.iter_fragments(tierer.remote.load))
    sizes = [store.head(loc.key).size for loc in locations]
    tiered = sum(sizes)
    print(
        f"tierlog: {len(sizes)} fragments ({min(sizes) / MIB:.1f}..{max(sizes) / MIB:.1f} MiB), "
        f"{tiered / MIB:.0f} MiB in {tier_s:.2f} s = {tiered / MIB / tier_s:.1f} MiB/s; "
        f"fragment PUTs {tierer.puts}, manifest PUTs {tierer.committer.puts}, "
        f"commits {tierer.committer.commits}, height {tierer.committer.tree.height}"
    )
    print(
        f"object store requests while tiering: {sum(requests.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(requests.items()))})"
    )
    if not raw_sizes:
        raw_s = raw_side(sizes)
    elif sorted(sizes) != sorted(raw_sizes):
        print("note: the raw side's sizes (previous round) differ from these fragments")

    pool.shutdown()
    store.close()
    stream_log.close()
    meta.close()

    tier_ratio = (tiered / tier_s) / (tiered / raw_s)
    puts_per_gib = sum(requests.values()) / (tiered / GIB)
    print(f"round: tier_ratio={tier_ratio:.3f} puts_per_gib={puts_per_gib:.2f}", flush=True)
    return tier_ratio, round(puts_per_gib, 2), sizes


if __name__ == "__main__":
    main()
