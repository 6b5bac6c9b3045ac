"""Benchmark: tierlog's S3 backend against raw obstore, same SeaweedFS, same run.

8 MiB PUTs and 4 MiB ranged GETs at concurrency 8. Starts its own SeaweedFS on free loopback
ports and stops it at the end. Both sides send the same requests (single-request PUTs,
``get_range`` GETs) and get the same zero-copy buffer back (tierlog's ``get_view``; ``get``
adds one copy into ``bytes``, about 0.3 ms per 4 MiB); the tierlog side adds key validation,
retries, the concurrency bound and error mapping. The sides alternate in rounds so drift in
the machine's load hits both alike; each ratio is the median of the per-round ratios, which
shrugs off a burst of load from other processes on a small machine.

Last line: ``put_ratio=<tierlog / raw throughput> get_ratio=<...>``.

    .venv/bin/python benches/object_store.py [--objects 16] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import obstore
from obstore.store import S3Store
from tests.plugins.seaweed import SeaweedServer, start_seaweed

from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore

PUT_SIZE = 8 * 1024 * 1024
GET_SIZE = 4 * 1024 * 1024
CONCURRENCY = 8


POOL = ThreadPoolExecutor(CONCURRENCY)
GETS_PER_OBJECT = 4  # GETs are short; more of them per round steadies the measurement


def timed(jobs: list[Callable[[], object]]) -> float:
    started = time.perf_counter()
    for _ in POOL.map(lambda job: job(), jobs):
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=16, help="PUTs (and GETs) per side/round")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tierlog-bench-seaweed-")
    server: SeaweedServer = start_seaweed(workdir)
    try:
        run(server, args.objects, args.rounds)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run(server: SeaweedServer, objects: int, rounds: int) -> None:
    raw = S3Store(
        server.bucket,
        prefix="bench/raw",
        endpoint=server.endpoint,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        client_options={"allow_http": True},
    )
    config = S3Config(
        bucket=server.bucket,
        prefix="bench/tierlog",
        endpoint=server.endpoint,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
    )
    tierlog = S3ObjectStore(config)
    payload = os.urandom(PUT_SIZE)
    sides: dict[str, dict[str, Callable[..., object]]] = {
        "raw": {
            "put": lambda k: obstore.put(raw, k, payload, use_multipart=False),
            "get": lambda k, at=0: obstore.get_range(raw, k, start=at, length=GET_SIZE),
        },
        "tierlog": {
            "put": lambda k: tierlog.put(k, payload),
            "get": lambda k, at=0: tierlog.get_view(k, at, at + GET_SIZE),
        },
    }
    seconds = {(side, op): 0.0 for side in sides for op in ("put", "get")}
    ratios: dict[str, list[float]] = {"put": [], "get": []}
    keys = [f"obj-{i:04d}" for i in range(objects)]
    for side in sides:  # warm up connections and create the objects once
        timed([lambda k=k, s=side: sides[s]["put"](k) for k in keys])
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for op in ("put", "get"):
            took = {}
            for side in order:
                if op == "put":
                    jobs = [lambda k=k, s=side: sides[s]["put"](k) for k in keys]
                else:
                    offsets = [i * (PUT_SIZE - GET_SIZE) // 3 for i in range(GETS_PER_OBJECT)]
                    jobs = [
                        lambda k=k, s=side, at=at: sides[s]["get"](k, at)
                        for at in offsets
                        for k in keys
                    ]
                took[side] = timed(jobs)
                seconds[(side, op)] += took[side]
            ratios[op].append(took["raw"] / took["tierlog"])
    total = {
        "put": PUT_SIZE * objects * rounds,
        "get": GET_SIZE * objects * rounds * GETS_PER_OBJECT,
    }
    for op in ("put", "get"):
        for side in sides:
            mib_s = total[op] / seconds[(side, op)] / 2**20
            print(f"{op} {side:8s} {seconds[(side, op)]:7.2f} s  {mib_s:8.1f} MiB/s")
        print(f"{op} per-round tierlog/raw: " + " ".join(f"{x:.2f}" for x in ratios[op]))
    tierlog.delete_many(keys)
    obstore.delete(raw, keys)
    tierlog.close()
    put_ratio = statistics.median(ratios["put"])
    get_ratio = statistics.median(ratios["get"])
    print(f"put_ratio={put_ratio:.3f} get_ratio={get_ratio:.3f}")


if __name__ == "__main__":
    main()
