"""Generate the real-RabbitMQ compatibility fixture in tests/data/rabbitmq/.

Starts a private RabbitMQ node (scripts/rabbitmq_node.py), drives it with the ``rstream``
client, stops it cleanly and copies the stream's Osiris directory next to an ``expected.json``
that says what a reader must find in it. The stream gets a small segment size so the data spans
several segments, and the traffic covers every kind of entry and chunk Osiris writes:

* plain messages (simple entries), including an empty body;
* sub-batch entries compressed with gzip, and one uncompressed sub-batch;
* a named producer with publishing ids (deduplication: a re-sent range is dropped by the
  broker, then the producer reconnects and continues from the queried sequence), which
  Osiris records in chunk trailers and tracking snapshots;
* a named consumer's stored offset (tracking delta chunks), stored before the first segment
  rolls (so later segments start with a tracking snapshot) and again at the end.

Usage: ``.venv/bin/python scripts/make_rabbitmq_fixture.py [--out tests/data/rabbitmq]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rabbitmq_node import RabbitMQNode, rabbitmq_node
from rstream import (
    CompressionType,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    RawMessage,
)

STREAM = "tierlog-compat"
VHOST = "/"
SEGMENT_BYTES = 64 * 1024
PRODUCER_NAME = "fixture-producer"
CONSUMER_NAME = "fixture-consumer"
MAX_FIXTURE_BYTES = 1024 * 1024
SEED = 20240601
USER = "guest"
DUPLICATE_BODY = b"DUPLICATE-must-be-dropped"

_CHUNK_HEADER = struct.Struct(">BBHIqQQiIIB3x")
_INDEX_RECORD = struct.Struct(">QqQIB")


class Confirmations:
    """Counts publish confirms for one send and fails on any negative confirm."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.confirmed: list[int] = []
        self.failed: list[ConfirmationStatus] = []
        self.done = asyncio.Event()

    def __call__(self, status: ConfirmationStatus) -> None:
        if status.is_confirmed:
            self.confirmed.append(status.message_id)
        else:
            self.failed.append(status)
        if len(self.confirmed) + len(self.failed) >= self.expected:
            self.done.set()

    async def wait(self, timeout: float = 60.0) -> None:
        await asyncio.wait_for(self.done.wait(), timeout)
        if self.failed:
            raise RuntimeError(f"publish not confirmed: {self.failed}")


async def send_confirmed(
    producer: Producer,
    messages: Sequence[bytes | RawMessage],
    publisher_name: str | None = None,
) -> list[int]:
    confirms = Confirmations(len(messages))
    raw = [m if isinstance(m, RawMessage) else RawMessage(m) for m in messages]
    await producer.send_batch(
        STREAM, raw, publisher_name=publisher_name, on_publish_confirm=confirms
    )
    await confirms.wait()
    return sorted(confirms.confirmed)


def plain_bodies(rng: random.Random, label: str, count: int, lo: int, hi: int) -> list[bytes]:
    return [f"{label}-{i:04d}|".encode() + rng.randbytes(rng.randint(lo, hi)) for i in range(count)]


def text_bodies(label: str, count: int) -> list[bytes]:
    """Compressible bodies for the gzip sub-batches."""
    words = "the quick brown fox jumps over the lazy dog while streams keep every record"
    return [f"{label}-{i:03d} {words} {i * 7919 % 1000:03d}".encode() for i in range(count)]


async def publish(node: RabbitMQNode) -> dict[str, Any]:
    """Publish the fixture traffic; return what the stream must contain, in stream order."""
    rng = random.Random(SEED)
    bodies: list[bytes] = []
    host, port = node.host, node.stream_port

    async with Producer(host, port, username=USER, password=USER) as producer:
        await producer.create_stream(
            STREAM, arguments={"stream-max-segment-size-bytes": SEGMENT_BYTES}
        )
        # Phase A: plain messages, one chunk per publish frame (roughly), one empty body.
        for batch in range(6):
            msgs = plain_bodies(rng, f"plain-a{batch}", 40, 0, 300)
            if batch == 1:
                msgs[0] = b""
            await send_confirmed(producer, msgs)
            bodies.extend(msgs)

    # Phase B: named producer with explicit publishing ids; a re-sent range is deduplicated.
    async with Producer(host, port, username=USER, password=USER) as named:
        first = plain_bodies(rng, "named-b", 30, 10, 200)
        await send_confirmed(
            named,
            [RawMessage(b, publishing_id=i + 1) for i, b in enumerate(first)],
            PRODUCER_NAME,
        )
        bodies.extend(first)
        dups = [RawMessage(DUPLICATE_BODY, publishing_id=i) for i in range(21, 31)]
        await send_confirmed(named, dups, PRODUCER_NAME)  # confirmed but not stored
        more = plain_bodies(rng, "named-c", 10, 10, 200)
        await send_confirmed(
            named,
            [RawMessage(b, publishing_id=31 + i) for i, b in enumerate(more)],
            PRODUCER_NAME,
        )
        bodies.extend(more)

    # Phase C: a consumer offset stored while everything is still in the first segment.
    async with Consumer(host, port, username=USER, password=USER) as consumer:
        await consumer.store_offset(STREAM, CONSUMER_NAME, 57)

    async with Producer(host, port, username=USER, password=USER) as producer:
        # Phase D: sub-batch entries, gzip-compressed, plus one uncompressed sub-batch.
        sub_batches: list[tuple[list[bytes], CompressionType]] = [
            (text_bodies(f"gzip-{j:02d}", 30), CompressionType.Gzip) for j in range(12)
        ]
        sub_batches.insert(5, (text_bodies("nocomp", 5), CompressionType.No))
        confirms = Confirmations(len(sub_batches))
        for msgs, compression in sub_batches:
            await producer.send_sub_entry(
                STREAM, msgs, compression_type=compression, on_publish_confirm=confirms
            )
            bodies.extend(msgs)
        await confirms.wait()
        # Phase E: larger incompressible plain messages to roll over several segments.
        for batch in range(6):
            msgs = plain_bodies(rng, f"plain-e{batch}", 40, 400, 900)
            await send_confirmed(producer, msgs)
            bodies.extend(msgs)

    # Phase F: the named producer reconnects; rstream continues after the queried sequence.
    async with Producer(host, port, username=USER, password=USER) as named:
        last = plain_bodies(rng, "named-f", 20, 10, 200)
        ids = await send_confirmed(named, last, PRODUCER_NAME)
        if ids != list(range(41, 61)):
            raise RuntimeError(f"named producer did not resume at 41: {ids}")
        bodies.extend(last)
        client = await named.default_client
        last_publishing_id = await client.query_publisher_sequence(STREAM, PRODUCER_NAME)

    records = await consume_all(node, len(bodies))
    if [r["body"] for r in records] != bodies:
        raise RuntimeError("RabbitMQ delivered different bodies than were published")

    # Phase G: the consumer's final stored offset: the first record of phase E.
    first_e = next(i for i, b in enumerate(bodies) if b.startswith(b"plain-e0-0000|"))
    final_offset = records[first_e]["offset"]
    async with Consumer(host, port, username=USER, password=USER) as consumer:
        await consumer.store_offset(STREAM, CONSUMER_NAME, final_offset)
        queried = await consumer.query_offset(STREAM, CONSUMER_NAME)
    if queried != final_offset:
        raise RuntimeError(f"stored offset {final_offset}, queried {queried}")

    return {
        "records": records,
        "producer": {"name": PRODUCER_NAME, "last_publishing_id": last_publishing_id},
        "consumer": {"name": CONSUMER_NAME, "offset": final_offset, "earlier_offset": 57},
    }


async def consume_all(node: RabbitMQNode, count: int) -> list[dict[str, Any]]:
    """Read the whole stream back through RabbitMQ: the broker's own offsets and timestamps."""
    received: list[dict[str, Any]] = []
    done = asyncio.Event()

    def on_message(message: bytes, context: MessageContext) -> None:
        received.append(
            {"offset": context.offset, "timestamp": context.timestamp, "body": bytes(message)}
        )
        if len(received) >= count:
            done.set()

    async with Consumer(node.host, node.stream_port, username=USER, password=USER) as consumer:
        await consumer.subscribe(
            STREAM,
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        )
        await asyncio.wait_for(done.wait(), 120)
    return received


def scan_chunks(stream_dir: Path) -> list[dict[str, Any]]:
    """An independent, minimal reading of every chunk header (cross-check for the decoders)."""
    chunks: list[dict[str, Any]] = []
    for segment in sorted(stream_dir.glob("*.segment")):
        data = segment.read_bytes()
        if data[:8] != b"OSIL\x00\x00\x00\x01":
            raise RuntimeError(f"{segment.name}: bad segment header {data[:8]!r}")
        pos = 8
        while pos + _CHUNK_HEADER.size <= len(data):
            (magic_ver, ctype, n_entries, n_records, ts, epoch, chunk_id, crc, data_len,
             trailer_len, bloom) = _CHUNK_HEADER.unpack_from(data, pos)  # fmt: skip
            if magic_ver != 0x50:
                raise RuntimeError(f"{segment.name}@{pos}: bad chunk magic {magic_ver:#x}")
            chunks.append(
                {
                    "segment": segment.name,
                    "position": pos,
                    "chunk_id": chunk_id,
                    "type": ctype,
                    "num_entries": n_entries,
                    "num_records": n_records,
                    "timestamp": ts,
                    "epoch": epoch,
                    "crc": crc & 0xFFFFFFFF,
                    "data_length": data_len,
                    "trailer_length": trailer_len,
                    "bloom_size": bloom,
                }
            )
            pos += _CHUNK_HEADER.size + bloom + data_len + trailer_len
        if pos != len(data):
            raise RuntimeError(f"{segment.name}: trailing {len(data) - pos} bytes")
    return chunks


def check_indexes(stream_dir: Path, chunks: list[dict[str, Any]]) -> None:
    """Every index record must name a chunk at the position the segment scan found."""
    by_id = {(c["segment"], c["chunk_id"]): c for c in chunks}
    for index in sorted(stream_dir.glob("*.index")):
        data = index.read_bytes()
        if data[:8] != b"OSII\x00\x00\x00\x01":
            raise RuntimeError(f"{index.name}: bad index header {data[:8]!r}")
        segment = index.name.replace(".index", ".segment")
        for pos in range(8, len(data) - _INDEX_RECORD.size + 1, _INDEX_RECORD.size):
            record = _INDEX_RECORD.unpack_from(data, pos)
            chunk = by_id.get((segment, record[0]))
            if chunk is None or record[1:] != (
                chunk["timestamp"],
                chunk["epoch"],
                chunk["position"],
                chunk["type"],
            ):
                raise RuntimeError(f"{index.name}@{pos}: record does not match its segment")
        in_segment = sum(1 for c in chunks if c["segment"] == segment)
        if (len(data) - 8) != in_segment * _INDEX_RECORD.size:
            raise RuntimeError(f"{index.name}: {len(data)} bytes for {in_segment} chunks")


def to_json_lines(document: dict[str, Any]) -> str:
    """JSON with one list item per line: compact, yet diffable and readable."""
    lines = ["{"]
    for n, (key, value) in enumerate(document.items()):
        comma = "," if n < len(document) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n".join("  " + json.dumps(item) for item in value)
            lines.append(f" {json.dumps(key)}: [\n{items}\n ]{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def rabbitmq_version() -> str:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = Path(__file__).resolve().parent.parent / "tests" / "data" / "rabbitmq"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    out: Path = args.out

    work = Path(tempfile.mkdtemp(prefix="tierlog-fixture-"))
    try:
        started_ms = int(time.time() * 1000)
        with rabbitmq_node(work / "node") as node:
            result = asyncio.run(publish(node))
            stream_dirs = [p for p in node.stream_dir.iterdir() if p.is_dir()]
            osiris = sorted(
                p.name for p in Path("/usr/lib/rabbitmq/lib").glob("*/plugins/osiris-*")
            )
        # The node is stopped cleanly here: the stream directory is complete.
        finished_ms = int(time.time() * 1000)
        if len(stream_dirs) != 1:
            raise RuntimeError(f"expected one stream directory, found {stream_dirs}")
        source = stream_dirs[0]

        if out.exists():
            for old in out.iterdir():
                if old.is_dir():
                    shutil.rmtree(old)
                elif old.name == "expected.json":
                    old.unlink()
        out.mkdir(parents=True, exist_ok=True)
        target = out / source.name
        shutil.copytree(source, target)

        chunks = scan_chunks(target)
        check_indexes(target, chunks)
        segments = sorted(p.name for p in target.glob("*.segment"))
        if len(segments) < 2:
            raise RuntimeError(f"need at least two segments, got {segments}")
        records = result["records"]
        expected = {
            "stream_dir": source.name,
            "vhost": VHOST,
            "stream": STREAM,
            "rabbitmq_version": rabbitmq_version(),
            "osiris_version": osiris[-1] if osiris else "",
            "max_segment_size_bytes": SEGMENT_BYTES,
            "written_between_ms": [started_ms, finished_ms],
            "segments": segments,
            "indexes": sorted(p.name for p in target.glob("*.index")),
            "producer": result["producer"],
            "consumer": result["consumer"],
            "record_count": len(records),
            "absent_bodies": [base64.b64encode(DUPLICATE_BODY).decode()],
            "chunk_types": {
                str(t): sum(1 for c in chunks if c["type"] == t)
                for t in sorted({c["type"] for c in chunks})
            },
            "records": [
                {
                    "offset": r["offset"],
                    "timestamp": r["timestamp"],
                    "body": base64.b64encode(r["body"]).decode(),
                }
                for r in records
            ],
            "chunks": chunks,
        }
        (out / "expected.json").write_text(to_json_lines(expected))
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        if size > MAX_FIXTURE_BYTES:
            raise RuntimeError(f"fixture is {size} bytes, over {MAX_FIXTURE_BYTES}")
        print(
            f"wrote {target} ({len(segments)} segments, {len(chunks)} chunks, "
            f"{len(records)} records, {size} bytes)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
