"""Benchmark: vectorised fragment → Arrow decoding against a naive per-record loop.

Builds fragments of ~64 MiB in memory (no I/O) and decodes each with
``fragment_to_record_batch`` and with a naive loop (``chunk.iter_records`` per record, Python
lists, ``pa.array`` per column, ``amqp.decode_message`` per record for the AMQP case) that
produces the same batch. Cases: 100-byte records (the
uniform-length fast path), mixed sizes (the prefix walk), gzip sub-batches, and AMQP 1.0
data-only messages with ``include_amqp``. Each side runs ``--rounds`` times, alternating;
the best time counts.

Last line: ``decode_ratio=<vectorised rows/s ÷ naive rows/s>`` for the 100-byte case.

    .venv/bin/python benches/arrow_decode.py [--mib 64] [--per-chunk 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import pyarrow as pa

from tierlog.formats.amqp import Symbol, decode_message, encode_message, looks_like_message
from tierlog.formats.chunk import (
    HEADER_SIZE,
    Entry,
    SubBatch,
    decode_header,
    encode_chunk,
    encode_records,
    iter_records,
)
from tierlog.formats.compression import Compression, compress
from tierlog.formats.fragment import (
    FragmentChunkInfo,
    FragmentPlacement,
    decode_index,
    decode_trailer,
    encode_fragment,
)
from tierlog.spark.arrow_batch import (
    fragment_to_record_batch,
    record_batch_schema,
)


def build_fragment(batches: list[list[Entry]]) -> bytes:
    """One fragment of user chunks, one chunk per batch of entries."""
    chunks: list[bytes] = []
    infos: list[FragmentChunkInfo] = []
    offset = 0
    for i, entries in enumerate(batches):
        chunk = encode_chunk(0, offset, 1, 1_700_000_000_000 + i, entries)
        header = decode_header(chunk)
        chunks.append(chunk)
        infos.append(
            FragmentChunkInfo(
                header.chunk_id,
                header.timestamp,
                header.epoch,
                len(chunk),
                header.num_records,
                header.data_crc,
                0,
                header.num_entries,
            )
        )
        offset += header.num_records
    parts, _ = encode_fragment(FragmentPlacement(0, 0, 0), chunks, infos)
    return b"".join(parts)


def naive_decode(fragment: bytes, stream: str, include_amqp: bool = False) -> pa.RecordBatch:
    """The same batch, one Python object per record (the baseline); with ``include_amqp``
    every record that looks like a message is decoded too (AMQP columns not compared)."""
    view = memoryview(fragment)
    trailer = decode_trailer(view)
    index = decode_index(view[trailer.index_start :], trailer)
    offsets: list[int] = []
    chunk_ids: list[int] = []
    timestamps: list[int] = []
    epochs: list[int] = []
    bodies: list[bytes] = []
    for position in index.records["position"].tolist():
        header = decode_header(view, position)
        if header.chunk_type != 0:
            continue
        start = position + HEADER_SIZE + header.bloom_size
        for offset, record in iter_records(
            header.chunk_id, view[start : start + header.data_length], header.num_entries
        ):
            offsets.append(offset)
            chunk_ids.append(header.chunk_id)
            timestamps.append(header.timestamp)
            epochs.append(header.epoch)
            bodies.append(bytes(record))
    n = len(offsets)
    if include_amqp:
        messages = [decode_message(b) if looks_like_message(b) else None for b in bodies]
        pa.array([m.body if m else None for m in messages], type=pa.binary())
        pa.array([dict(m.properties) if m and m.properties else None for m in messages])
    return pa.RecordBatch.from_arrays(
        [
            pa.array([stream] * n, type=pa.string()),
            pa.array(offsets, type=pa.int64()),
            pa.array(chunk_ids, type=pa.int64()),
            pa.array(timestamps, type=pa.timestamp("ms")),
            pa.array(epochs, type=pa.int64()),
            pa.array(bodies, type=pa.binary()),
        ],
        schema=record_batch_schema(include_amqp=False),
    )


def best_of(rounds: int, fn: Callable[[], pa.RecordBatch]) -> tuple[float, pa.RecordBatch]:
    best = float("inf")
    batch = fn()
    for _ in range(rounds):
        started = time.perf_counter()
        batch = fn()
        best = min(best, time.perf_counter() - started)
    return best, batch


def run_case(name: str, fragment: bytes, rounds: int, include_amqp: bool = False) -> float:
    fast_s, fast = best_of(
        rounds, lambda: fragment_to_record_batch(fragment, "bench", include_amqp=include_amqp)
    )
    naive_s, naive = best_of(rounds, lambda: naive_decode(fragment, "bench", include_amqp))
    if not fast.select(naive.schema.names).equals(naive):
        raise SystemExit(f"{name}: vectorised and naive batches differ")
    rows = fast.num_rows
    mb = len(fragment) / 1e6
    ratio = (rows / fast_s) / (rows / naive_s)
    print(
        f"{name:28s} rows={rows:>8d}  vectorised {rows / fast_s / 1e6:6.2f} Mrows/s "
        f"{mb / fast_s:7.0f} MB/s ({fast_s * 1e3:7.1f} ms)  naive {rows / naive_s / 1e6:5.2f} "
        f"Mrows/s {mb / naive_s:5.0f} MB/s ({naive_s * 1e3:7.1f} ms)  ratio {ratio:5.1f}x"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64, help="fragment size")
    parser.add_argument("--per-chunk", type=int, default=100, help="records per chunk")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rnd = random.Random(7)
    target = args.mib * 1024 * 1024
    per = args.per_chunk

    def batches(make: Callable[[], bytes], approx: int) -> list[list[Entry]]:
        count = target // (approx * per)
        return [[make() for _ in range(per)] for _ in range(count)]

    body = rnd.randbytes(100)
    uniform = build_fragment(batches(lambda: body, 100 + 4))
    mixed = build_fragment(batches(lambda: body * rnd.randint(0, 4) + rnd.randbytes(8), 212))
    message = encode_message(rnd.randbytes(93))
    amqp = build_fragment(batches(lambda: message, 100 + 4))
    rich = encode_message(
        rnd.randbytes(60),
        properties={"message_id": 1, "content_type": Symbol("application/json")},
        application_properties={"key": "k1", "n": 5},
    )
    amqp_rich = build_fragment(batches(lambda: rich, len(rich) + 4))
    records = [rnd.randbytes(100) for _ in range(per)]
    plain = encode_records(records)
    zipped = compress(Compression.GZIP, plain)
    sub = [
        [SubBatch(Compression.GZIP, per, len(plain), zipped)] for _ in range(target // len(plain))
    ]
    sub_batches = build_fragment(sub)
    del sub

    ratio = run_case("100-byte records", uniform, args.rounds)
    run_case("mixed 8..408-byte records", mixed, args.rounds)
    run_case("gzip sub-batches", sub_batches, args.rounds)
    run_case("AMQP data messages +amqp", amqp, args.rounds, include_amqp=True)
    run_case("AMQP with properties +amqp", amqp_rich, args.rounds, include_amqp=True)
    print(f"decode_ratio={ratio:.1f}")


if __name__ == "__main__":
    main()
