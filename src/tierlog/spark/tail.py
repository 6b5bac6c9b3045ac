"""The un-tiered tail of a stream, read through the server (``includeTail``).

A batch read with a server address covers ``[first, end)`` where ``end`` is the end of the
chunk the server reported as committed when the read was planned: the committed manifest
gives ``[first, next)`` as before, and one more task subscribes to the stream at the
manifest's ``next`` (always a chunk boundary: fragments hold whole chunks) and takes every
delivered chunk up to and including that committed chunk (when that chunk is a tracking
chunk, which consumers never get, the task stops once nothing more arrives for a second
after the chunk before it). Both ends are fixed at planning,
so the two parts meet exactly whatever tiering does meanwhile (the server serves offsets
below its local log from the remote tier).

Delivered chunks carry the chunk header and the data section only (the bloom filter and
trailer sizes stay in the header); the task zeroes those two sizes, which makes each a
valid chunk again (the CRC covers the data only), and decodes runs of them with the same
vectorised decoder as fragments.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from tierlog.formats.chunk import HEADER
from tierlog.remote.manifest_walk import Bounds
from tierlog.spark.arrow_batch import chunks_to_record_batch
from tierlog.spark.client import StreamClient, StreamClientError

SUBSCRIPTION_ID = 0
LAST_CHUNK_WAIT_S = 1.0  # the committed chunk may be a tracking chunk, never delivered
CREDIT = 8
DECODE_BYTES = 8 * 1024 * 1024  # decode in runs of about this many chunk bytes
_SIZES_AT = 40  # trailer length u32 + bloom size u8 follow the data length


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """How tasks reach the server (picklable)."""

    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    timeout: float = 60.0

    def connect(self, vhost: str) -> StreamClient:
        return StreamClient.connect(
            self.host,
            self.port,
            user=self.user,
            password=self.password,
            vhost=vhost,
            timeout=self.timeout,
        )


@dataclass(frozen=True, slots=True)
class TailTask:
    """Read offsets ``[start, ...]`` of ``stream`` through the chunk ``last_chunk_id``."""

    stream: str  # the stream column's value
    vhost: str
    name: str
    start: int
    last_chunk_id: int
    bounds: Bounds


def committed_chunk_id(server: ServerAddress, vhost: str, name: str) -> int | None:
    """The id of the server's last committed chunk of the stream (None: empty stream)."""
    with server.connect(vhost) as client:
        stats = client.stream_stats(name)
    committed = stats.get("committed_chunk_id", -1)
    return None if committed < 0 else committed


def read_tail(
    task: TailTask, server: ServerAddress, include_amqp: bool, verify_crc: bool
) -> Iterator[pa.RecordBatch]:
    """Record batches of the tail's rows within ``task.bounds``, in offset order."""
    b = task.bounds
    low = task.start if b.min_offset is None else max(task.start, b.min_offset)
    with server.connect(task.vhost) as client:
        client.subscribe(SUBSCRIPTION_ID, task.name, task.start, CREDIT)
        run: list[bytes] = []
        size = 0
        done = False
        while not done:
            try:
                chunk = client.next_chunk(SUBSCRIPTION_ID)
            except StreamClientError:
                if client.sock.gettimeout() != LAST_CHUNK_WAIT_S:
                    raise
                break  # everything below the committed chunk was read; it is not user data
            client.credit(SUBSCRIPTION_ID, 1)
            fields = HEADER.unpack_from(chunk)
            chunk_id, records = fields[6], fields[3]
            if chunk_id > task.last_chunk_id:
                break
            done = chunk_id == task.last_chunk_id
            if chunk_id + records >= task.last_chunk_id:
                client.sock.settimeout(LAST_CHUNK_WAIT_S)
            data = bytearray(chunk)
            data[_SIZES_AT : _SIZES_AT + 5] = bytes(5)
            run.append(bytes(data))
            size += len(data)
            if size >= DECODE_BYTES or done:
                yield from _decode(run, task, low, include_amqp, verify_crc)
                run, size = [], 0
        if run:
            yield from _decode(run, task, low, include_amqp, verify_crc)


def _decode(
    run: list[bytes], task: TailTask, low: int, include_amqp: bool, verify_crc: bool
) -> Iterator[pa.RecordBatch]:
    if not run:
        return
    b = task.bounds
    batch = chunks_to_record_batch(
        b"".join(run),
        task.stream,
        include_amqp=include_amqp,
        min_offset=low,
        max_offset=b.max_offset,
        min_ts=b.min_ts,
        max_ts=b.max_ts,
        verify_crc=verify_crc,
    )
    if batch.num_rows:
        yield batch
