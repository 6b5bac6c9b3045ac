"""Benchmark: catching up on a stream from the local tier and from the remote tier, same run.

Builds a local log (``--mib`` of 1 KiB records in batches of 1,000, ``fsync="never"`` and one
``sync()``, 128 MiB segments; not timed), tiers all of it to a SeaweedFS it starts itself
(production ``TieringConfig()``: 64 MiB fragments; M = ``--m``, default 1024), then reads the
whole stream twice with the same ``TieredReader.records()`` loop:

1. local: strategy ``NOT_IN_DISK`` with every segment still on disk (0 GETs);
2. remote: every deletable local segment freed, strategy ``FORCE`` so the tiered chunks of
   the active segment come from the remote tier too (asserted: 0 chunks read locally), with
   the default prefetch (4 MiB requests, AIMD window up to 64 MiB, 256 MiB budget).

Throughput counts record bytes handed to the loop. ``seek_gets``: with the root cached (the
live tierer's) and cold branch and index caches, the most GETs (any kind) any of 20 random
old offsets took from attaching to having its first record, data GET included.

Last line: ``remote_local_ratio=<remote MB/s ÷ local MB/s> seek_gets=<n>``.

    .venv/bin/python benches/catchup.py [--mib 1024] [--m 1024] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.object_store import FaultyObjectStore
from tests.plugins.seaweed import SeaweedServer, start_seaweed

from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.prefetch import Prefetcher
from tierlog.read.strategies import ReadStrategy
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

MiB = 1024 * 1024
RECORD = 1024
BATCH = 1000


def read_all(reader: TieredReader) -> tuple[int, int, float]:
    """(records, record bytes, seconds) of one full catch-up read."""
    count = size = 0
    started = time.perf_counter()
    with reader:
        for _offset, record in reader.records():
            count += 1
            size += len(record)
    return count, size, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="stream size in MiB")
    parser.add_argument("--m", type=int, default=1024, help="manifest branching factor")
    parser.add_argument("--dir", default=None, help="where the local log goes")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tierlog-bench-catchup-", dir=args.dir)
    server: SeaweedServer = start_seaweed(os.path.join(workdir, "seaweed"))
    try:
        run(server, workdir, args.mib, args.m)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run(server: SeaweedServer, workdir: str, mib: int, m: int) -> None:
    s3 = S3ObjectStore(
        S3Config(
            bucket=server.bucket,
            prefix="bench/catchup",
            endpoint=server.endpoint,
            region=server.region,
            access_key_id=server.access_key,
            secret_access_key=server.secret_key,
        )
    )
    store = FaultyObjectStore(s3)  # only counts requests here
    meta = SqliteMetaStore(os.path.join(workdir, "meta.db"))
    catalog = Catalog(meta)
    record = catalog.create("/", "catchup")
    log = StreamLog.create(
        os.path.join(workdir, "data"),
        "/",
        "catchup",
        LogConfig(max_segment_bytes=128 * MiB, fsync="never"),
        created_ns=record.created_ns,
    )
    payload = os.urandom(RECORD * BATCH)
    batches = mib * MiB // (RECORD * BATCH)
    started = time.perf_counter()
    for b in range(batches):
        at = (b * 7919) % (len(payload) - RECORD)
        chunk = payload[at:] + payload[:at]
        log.append([chunk[i * RECORD : (i + 1) * RECORD] for i in range(BATCH)])
    log.sync()
    print(f"wrote {batches * BATCH:,} records in {time.perf_counter() - started:.1f} s")
    tierer = StreamTierer(
        log, store, catalog, DeletionQueue(meta, grace_seconds=0.0), config=TieringConfig(), m=m
    )
    started = time.perf_counter()
    tierer.start()
    assert tierer.flush(timeout=3600), "tiering did not finish"
    tree = tierer.committer.tree
    print(
        f"tiered {tree.header().total_fragments} fragments in "
        f"{time.perf_counter() - started:.1f} s, manifest height {tree.height}"
    )
    manifest = ManifestSource(tierer)
    prefetcher = Prefetcher()
    try:
        store.reset_log()
        local = TieredReader(log, manifest, OffsetSpec.first(), prefetcher=prefetcher)
        n_local, bytes_local, t_local = read_all(local)
        assert local.remote_chunks == 0 and store.count("get") == 0
        local_mbs = bytes_local / t_local / 1e6
        print(
            f"local : {n_local:,} records, {bytes_local / MiB:.0f} MiB in {t_local:.2f} s "
            f"= {local_mbs:.0f} MB/s"
        )

        freed = tierer.deletable_segments()
        for first in freed:
            log.delete_segment(first)
        print(f"freed {len(freed)} of {len(freed) + len(log.list_segments())} local segments")
        store.reset_log()
        remote = TieredReader(
            log, manifest, OffsetSpec.first(), strategy=ReadStrategy.FORCE, prefetcher=prefetcher
        )
        n_remote, bytes_remote, t_remote = read_all(remote)
        assert (n_remote, bytes_remote) == (n_local, bytes_local), "remote read differs"
        assert remote.local_chunks == 0, "a tiered chunk was read locally"
        remote_mbs = bytes_remote / t_remote / 1e6
        print(
            f"remote: {n_remote:,} records in {t_remote:.2f} s = {remote_mbs:.0f} MB/s, "
            f"{store.count('get')} GETs, budget peak {prefetcher.budget.peak / MiB:.0f} MiB"
        )

        rng = random.Random(1)
        worst = 0
        for _ in range(20):
            target = rng.randrange(0, tree.next_offset)
            cold = ManifestSource(tierer)  # root cached, branch and index caches empty
            store.reset_log()
            with TieredReader(None, cold, OffsetSpec.offset(target), prefetcher=prefetcher) as r:
                first = next(r.records())
                assert first[0] == target
                worst = max(worst, store.count("get") + store.count("get_suffix"))
        print(f"seek: worst of 20 random old offsets took {worst} GETs (height {tree.height})")
        print(f"remote_local_ratio={remote_mbs / local_mbs:.3f} seek_gets={worst}")
    finally:
        prefetcher.close()
        tierer.stop(flush=False)
        log.close()
        meta.close()
        s3.close()


if __name__ == "__main__":
    main()
