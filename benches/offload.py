"""Benchmark: offloading sealed segments to SeaweedFS against a raw multipart upload.

Writes a stream log with sealed segments of ``--segment-mb`` (default 500 MB, tierlog's
default) holding about ``--gib`` GiB in all, starts its own SeaweedFS on free loopback ports,
then for every segment, alternating which side goes first:

* tierlog: ``ObjectStoreOffloader.offload`` (attempt recorded in SQLite, one part per 64 MiB
  block streamed from the segment file, the whole-chunk CRCs and Osiris CRC checks, the index
  object), through ``S3ObjectStore``;
* raw: the same segment file's bytes cut into 64 MiB parts, read with ``os.pread`` and sent
  with the same boto3 client (initiate, ``upload_part`` per part, complete): the least any
  multipart copy of the segment can do.

Object-store write requests of the tierlog side (initiate, parts, complete, index) are counted
through the fault wrapper (no faults configured). Last line:
``offload_ratio=<tierlog MB/s ÷ raw MB/s> puts_per_gib=<write requests per GiB offloaded>``.

    .venv/bin/python benches/offload.py [--gib 1] [--segment-mb 500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.object_store import FaultyObjectStore
from tests.plugins.seaweed import SeaweedServer, start_seaweed

from tierlog.formats.offload import DEFAULT_BLOCK_SIZE
from tierlog.log.config import LogConfig
from tierlog.log.segment_files import SegmentRef
from tierlog.log.writer import StreamLog
from tierlog.offload.offloader import ObjectStoreOffloader
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

WRITE_OPS = frozenset({"create_multipart", "put_part", "complete_multipart", "put"})
RECORD = 16 * 1024
RECORDS_PER_CHUNK = 64


def write_segments(root: str, gib: float, segment_bytes: int) -> list[SegmentRef]:
    """Sealed segments of about ``gib`` GiB in all (at least one), 1 MiB chunks of 16 KiB
    records drawn from a random pool (incompressible, all different)."""
    wanted = max(1, round(gib * 2**30 / segment_bytes))
    config = LogConfig(max_segment_bytes=segment_bytes, fsync="never")
    log = StreamLog.create(root, "bench", "offload", config, created_ns=1)
    pool = os.urandom(8 * 1024 * 1024 + RECORD)
    step = 4099
    at = 0
    while len(log.segment_refs()) <= wanted:
        records = []
        for _ in range(RECORDS_PER_CHUNK):
            at = (at + step) % (len(pool) - RECORD)
            records.append(pool[at : at + RECORD])
        log.append(records)
    refs = list(log.segment_refs()[:wanted])
    log.close()
    return refs


def raw_upload(store: S3ObjectStore, key: str, path: str, part_size: int) -> int:
    """Multipart upload of the file's bytes with the store's own boto3 client; returns the
    number of write requests."""
    client = store.boto_client()
    bucket = store.config.bucket
    full_key = f"{store.config.prefix}/{key}" if store.config.prefix else key
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=full_key)["UploadId"]
    parts = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        for number, start in enumerate(range(0, size, part_size), start=1):
            body = os.pread(fd, min(part_size, size - start), start)
            reply = client.upload_part(
                Bucket=bucket, Key=full_key, UploadId=upload_id, PartNumber=number, Body=body
            )
            parts.append({"ETag": reply["ETag"], "PartNumber": number})
    finally:
        os.close(fd)
    client.complete_multipart_upload(
        Bucket=bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    return len(parts) + 2


def run(server: SeaweedServer, segments: list[SegmentRef], workdir: str) -> None:
    config = S3Config(
        bucket=server.bucket,
        prefix="bench",
        endpoint=server.endpoint,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
    )
    s3 = S3ObjectStore(config)
    counted = FaultyObjectStore(s3)
    meta = SqliteMetaStore(os.path.join(workdir, "meta.db"))
    offloader = ObjectStoreOffloader(
        counted, meta, "offload", "bench_offload_1", block_size=DEFAULT_BLOCK_SIZE
    )
    # warm up connections (and the page cache of the first segment) on both sides
    raw_upload(s3, "warmup/raw", segments[0].segment_path, DEFAULT_BLOCK_SIZE)
    s3.delete("warmup/raw")
    seconds = {"tierlog": 0.0, "raw": 0.0}
    total_bytes = 0
    raw_puts = 0
    counted.reset_log()
    for n, ref in enumerate(segments):
        size = os.path.getsize(ref.segment_path)
        total_bytes += size
        order = ["tierlog", "raw"] if n % 2 == 0 else ["raw", "tierlog"]
        for side in order:
            started = time.perf_counter()
            if side == "tierlog":
                attempt = uuid.uuid4()
                result = offloader.offload(ref, attempt, {"stream": "bench/offload"})
                took = time.perf_counter() - started
                offloader.finish(ref.first_offset, attempt)
                offloader.delete_offloaded(ref.first_offset, attempt)
            else:
                raw_puts += raw_upload(s3, f"raw/{n}", ref.segment_path, DEFAULT_BLOCK_SIZE)
                took = time.perf_counter() - started
                s3.delete(f"raw/{n}")
            seconds[side] += took
            print(f"segment {n} {side:8s} {size / took / 1e6:8.1f} MB/s ({took:.2f} s)", flush=True)
        print(f"segment {n}: {result.block_count} blocks, {result.puts} write requests", flush=True)
    puts = sum(1 for r in counted.log if r.op in WRITE_OPS)
    meta.close()
    s3.close()
    rates = {side: total_bytes / seconds[side] / 1e6 for side in seconds}
    gib = total_bytes / 2**30
    print(
        f"{len(segments)} segments, {total_bytes / 1e6:.0f} MB: "
        f"tierlog {rates['tierlog']:.1f} MB/s, "
        f"raw {rates['raw']:.1f} MB/s; write requests tierlog {puts}, raw {raw_puts}"
    )
    print(f"offload_ratio={rates['tierlog'] / rates['raw']:.3f} puts_per_gib={puts / gib:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0, help="GiB of sealed segments")
    parser.add_argument("--segment-mb", type=float, default=500.0, help="segment size, MB")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tierlog-bench-offload-")
    try:
        started = time.perf_counter()
        segments = write_segments(
            os.path.join(workdir, "log"), args.gib, int(args.segment_mb * 1_000_000)
        )
        print(f"wrote {len(segments)} sealed segments in {time.perf_counter() - started:.1f} s")
        server = start_seaweed(os.path.join(workdir, "seaweed"))
        try:
            run(server, segments, workdir)
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
