"""Scale simulation of the manifest tree: 1 PB of 64 MiB fragments through the real code.

Feeds 15,625,000 fragment entries (1 PB / 64 MiB) into ``ManifestTree`` in per-commit batches,
writes every folded branch object create-only to the filesystem ObjectStore
(``open_object_store("file://...")``) before the root that names it, then reloads the root from
the store and locates random old offsets with a cold cache, counting GETs: branch loads plus
the one ranged GET of the fragment index that a reader needs at the end (fragments themselves
are not written: they would be 1 PB).

Usage: ``python benches/manifest_scale.py [--fragments N] [--batch B] [--m 128 --m 1024]``

Batch size: 16 fragments per commit by default. The debounce fires at 5 fragments or 2 s, but
at the ~1 GB/s a 1 PB stream implies (one 64 MB fragment every 64 ms) fragments keep arriving
while a commit (root PUT + conditional put, ~0.5-1 s against a real object store) is in flight,
so a steady writer commits about 16 per commit. ``--batch 5`` runs the debounce minimum.
Prints one line per M and a summary table (Markdown) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from tierlog.formats.manifest import ENTRY_DTYPE
from tierlog.remote.keys import new_uid, root_key
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.storage.object_store import ObjectStore, open_object_store

PB = 10**15
FRAGMENT_BYTES = 64 * 10**6  # the seed's arithmetic: 1 PB / 64 MB = 15,625,000 fragments
RECORDS_PER_FRAGMENT = 65_536  # ~1 KB messages
CHUNKS_PER_FRAGMENT = 64
FRAGMENT_MS = 64  # ~1 GB/s: one 64 MB fragment every 64 ms
STREAM = "vh_bench_1700000000000000000"
PREFIX = "bench"
GEN_BLOCK = 1 << 20  # entries generated per numpy block


@dataclass
class Result:
    m: int
    fragments: int
    batch: int
    commits: int
    seconds: float
    height: int
    level_counts: list[int]
    root_bytes: int
    max_root_bytes: int
    branch_objects: int
    branch_bytes: int
    max_gets: int
    mean_gets: float
    oldest_gets: int
    lookup_ms: float


def fragment_block(start: int, count: int) -> np.ndarray:
    i = np.arange(start, start + count, dtype=np.uint64)
    arr = np.zeros(count, dtype=ENTRY_DTYPE)
    arr["first_offset"] = i * RECORDS_PER_FRAGMENT
    arr["min_timestamp"] = 1_700_000_000_000 + i.astype(np.int64) * FRAGMENT_MS
    arr["max_timestamp"] = arr["min_timestamp"] + FRAGMENT_MS - 1
    arr["data_size"] = FRAGMENT_BYTES
    arr["chunk_count"] = CHUNKS_PER_FRAGMENT
    arr["fragment_count"] = 1
    return arr


def run(
    store: ObjectStore, m: int, fragments: int, batch: int, root_every: int, samples: int
) -> Result:
    tree = ManifestTree(PREFIX, STREAM, m=m)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
    pending: list[concurrent.futures.Future[object]] = []
    branch_objects = branch_bytes = max_root = commits = 0
    old_root: str | None = None

    def commit_root() -> None:
        nonlocal old_root
        for f in pending:  # branch objects are durable before the root that names them
            f.result()
        pending.clear()
        key = root_key(PREFIX, STREAM, new_uid())
        store.put_if_absent(key, tree.encode_root())
        if old_root:
            store.delete(old_root)
        old_root = key

    t0 = time.perf_counter()
    for block_start in range(0, fragments, GEN_BLOCK):
        block = fragment_block(block_start, min(GEN_BLOCK, fragments - block_start))
        for i in range(0, len(block), batch):
            run_ = block[i : i + batch]
            end = block_start + i + len(run_)
            for w in tree.append_array(run_, end * RECORDS_PER_FRAGMENT):
                pending.append(pool.submit(store.put_if_absent, w.key, w.data))
                branch_objects += 1
                branch_bytes += len(w.data)
            commits += 1
            max_root = max(max_root, tree.root_size())
            if commits % root_every == 0:
                commit_root()
    commit_root()
    seconds = time.perf_counter() - t0
    pool.shutdown()
    assert old_root is not None

    # A reader (or a restarted writer) starts from the stored root with a cold cache.
    root = store.get(old_root)
    reader = ManifestTree.from_root(root, PREFIX, m=m, cache_nodes=0)
    gets = 0

    def load(key: str) -> bytes:
        nonlocal gets
        gets += 1
        return store.get(key)

    rng = random.Random(42)
    old = [0] + [rng.randrange(0, int(fragments * 0.9)) for _ in range(samples)]
    per_lookup = []
    t1 = time.perf_counter()
    for frag in old:
        gets = 0
        offset = frag * RECORDS_PER_FRAGMENT + rng.randrange(RECORDS_PER_FRAGMENT)
        loc = reader.locate_offset(offset, load)
        assert loc.entry.first_offset == frag * RECORDS_PER_FRAGMENT, (offset, loc)
        assert loc.next_offset == (frag + 1) * RECORDS_PER_FRAGMENT
        per_lookup.append(gets + 1)  # + the ranged GET of the fragment's index
    lookup_ms = (time.perf_counter() - t1) / len(old) * 1000
    header = reader.header()
    assert header.total_fragments == fragments and header.total_bytes == fragments * FRAGMENT_BYTES
    return Result(
        m=m,
        fragments=fragments,
        batch=batch,
        commits=commits,
        seconds=seconds,
        height=reader.height,
        level_counts=reader.level_counts(),
        root_bytes=len(root),
        max_root_bytes=max_root,
        branch_objects=branch_objects,
        branch_bytes=branch_bytes,
        max_gets=max(per_lookup),
        mean_gets=sum(per_lookup) / len(per_lookup),
        oldest_gets=per_lookup[0],
        lookup_ms=lookup_ms,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fragments", type=int, default=PB // FRAGMENT_BYTES)
    parser.add_argument("--batch", type=int, default=16, help="fragments per manifest commit")
    parser.add_argument("--m", type=int, action="append", help="branching factors (repeatable)")
    parser.add_argument("--root-every", type=int, default=10_000, help="commits per root PUT")
    parser.add_argument("--samples", type=int, default=200, help="random old offsets to locate")
    parser.add_argument("--dir", default=None, help="store directory (default: a temp dir)")
    args = parser.parse_args()
    ms = args.m or [128, 1024]
    base = args.dir or tempfile.mkdtemp(prefix="manifest_scale_")
    results = []
    try:
        for m in ms:
            path = os.path.join(os.path.abspath(base), f"m{m}")
            with open_object_store(f"file://{path}") as store:
                r = run(store, m, args.fragments, args.batch, args.root_every, args.samples)
            results.append(r)
            print(
                f"m={r.m} fragments={r.fragments} batch={r.batch} commits={r.commits} "
                f"seconds={r.seconds:.1f} height={r.height} levels={r.level_counts} "
                f"root_bytes={r.root_bytes} max_root_bytes={r.max_root_bytes} "
                f"branch_objects={r.branch_objects} branch_bytes={r.branch_bytes} "
                f"gets_oldest={r.oldest_gets} gets_max={r.max_gets} gets_mean={r.mean_gets:.2f} "
                f"cold_lookup_ms={r.lookup_ms:.2f}",
                flush=True,
            )
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(
        "| M | height | root entries per height (0..) | root size (final / max) | "
        "branch objects (bytes) | GETs to locate an old offset (max / mean) | commits/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.m} | {r.height} | {r.level_counts} | {r.root_bytes / 1024:.1f} KiB / "
            f"{r.max_root_bytes / 1024:.1f} KiB | {r.branch_objects} "
            f"({r.branch_bytes / 2**20:.1f} MiB) | {r.max_gets} / {r.mean_gets:.2f} "
            f"| {r.commits / r.seconds:,.0f} |"
        )


if __name__ == "__main__":
    main()
