"""The un-tiered tail of a stream, read through the server (``includeTail``).

A read with a server address covers offsets up to ``end``: the end of the last user chunk
the server had committed when the read was planned (``committed_end``: the stream stats
name the committed chunk; one delivered chunk from there gives its end). The committed
manifest gives ``[first, next)`` as before, and a tail task subscribes to the stream at the
manifest's ``next`` (always a chunk boundary: fragments hold whole chunks) and takes every
delivered chunk until one reaches ``end``. Both ends are fixed at planning, so the two
parts meet exactly whatever tiering does meanwhile (the server serves offsets below its
local log from the remote tier). Batch reads and the streaming source plan their tails
with the same ``tail_task`` and read them with the same ``read_tail``.

Tracking chunks (stored consumer offsets, tracking snapshots) take offsets but are never
delivered to consumers, so ``end`` is always the end of a user chunk the planner saw
delivered: the committed chunk itself, or, when that is a tracking chunk, the last user
chunk delivered from ``TRACKING_SLACK`` offsets below it. A task therefore always meets a
chunk reaching ``end`` and never waits on a timeout. When no user chunk shows up there (more
tracking chunks than that at the very end, or a server too slow to answer in
``PEEK_WAIT_S``) the tail ends at the manifest for this read: a read planned a moment
earlier, never a gap or a duplicate (the streaming source takes it in a later trigger).

Delivered chunks carry the chunk header and the data section only (the bloom filter and
trailer sizes stay in the header); the task zeroes those two sizes, which makes each a
valid chunk again (the CRC covers the data only), and decodes runs of them with the same
vectorised decoder as fragments.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from tierlog.formats.chunk import HEADER
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.remote.manifest_walk import Bounds
from tierlog.spark.arrow_batch import chunks_to_record_batch
from tierlog.spark.client import StreamClient, StreamClientError
from tierlog.spark.errors import ResponseError

SUBSCRIPTION_ID = 0
PEEK_WAIT_S = 0.5  # the committed chunk is delivered at once unless it is a tracking chunk
TRACKING_SLACK = 64  # offsets below a committed tracking chunk searched for a user chunk
CREDIT = 8
UNAVAILABLE_RETRY_S = 10.0  # a stream without a leader for longer: the head stays at the tier
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
    """Read offsets ``[start, end)`` of ``stream`` (within ``bounds``) from the server."""

    stream: str  # the stream column's value
    vhost: str
    name: str
    start: int
    end: int
    bounds: Bounds


def committed_end(
    server: ServerAddress, vhost: str, name: str, floor: int = 0, *, streaming: bool = False
) -> int:
    """The end of the server's last committed user chunk (``floor`` if none above it).

    A stream momentarily without a leader (an election, a node restarting) answers
    STREAM_NOT_AVAILABLE, which is retriable: it is asked again for
    ``UNAVAILABLE_RETRY_S``. Then a batch read fails with that error; a ``streaming``
    micro-batch takes ``floor`` (what the remote tier holds) as its head — the tail is
    read by a later micro-batch, never skipped — instead of failing the query."""
    deadline = time.monotonic() + UNAVAILABLE_RETRY_S
    while True:
        try:
            return _committed_end(server, vhost, name, floor)
        except ResponseError as exc:
            if exc.code != ResponseCode.STREAM_NOT_AVAILABLE:
                raise
            if time.monotonic() >= deadline:
                if streaming:
                    return floor
                raise
            time.sleep(0.5)


def _committed_end(server: ServerAddress, vhost: str, name: str, floor: int) -> int:
    with server.connect(vhost) as client:
        committed = client.stream_stats(name).get("committed_chunk_id", -1)
        if committed < floor:
            return floor
        client.subscribe(SUBSCRIPTION_ID, name, committed, 1)
        client.sock.settimeout(PEEK_WAIT_S)
        ends = _delivered_ends(client, committed)
        if not ends:  # a tracking chunk: look for the user chunk before it
            low = max(floor, committed - TRACKING_SLACK)
            client.subscribe(SUBSCRIPTION_ID + 1, name, low, TRACKING_SLACK + 1)
            ends = _delivered_ends(client, committed, SUBSCRIPTION_ID + 1)
        return max([floor, *ends])


def _delivered_ends(
    client: StreamClient, committed: int, subscription: int = SUBSCRIPTION_ID
) -> list[int]:
    """Ends of the chunks at or below ``committed`` delivered until none came for a while."""
    ends: list[int] = []
    while True:
        try:
            chunk = client.next_chunk(subscription)
        except StreamClientError:
            return ends
        fields = HEADER.unpack_from(chunk)
        chunk_id, records = fields[6], fields[3]
        if chunk_id > committed:
            return ends
        ends.append(chunk_id + records)
        if chunk_id == committed:
            return ends


def tail_task(
    stream: str, vhost: str, name: str, start: int, end: int, bounds: Bounds
) -> TailTask | None:
    """The task reading ``[start, end)`` within ``bounds``; None when that is empty."""
    low = start if bounds.min_offset is None else max(start, bounds.min_offset)
    high = end if bounds.max_offset is None else min(end, bounds.max_offset + 1)
    if high <= low or bounds.is_empty:
        return None
    return TailTask(stream, vhost, name, start, end, bounds)


def read_tail(
    task: TailTask, server: ServerAddress, include_amqp: bool, verify_crc: bool
) -> Iterator[pa.RecordBatch]:
    """Record batches of the tail's rows within ``task.bounds``, in offset order."""
    b = task.bounds
    low = task.start if b.min_offset is None else max(task.start, b.min_offset)
    high = task.end - 1 if b.max_offset is None else min(task.end - 1, b.max_offset)
    with server.connect(task.vhost) as client:
        # Subscribe at the first offset needed: the chunk holding it comes first.
        client.subscribe(SUBSCRIPTION_ID, task.name, low, CREDIT)
        run: list[bytes] = []
        size = 0
        done = False
        while not done:
            chunk = client.next_chunk(SUBSCRIPTION_ID)
            client.credit(SUBSCRIPTION_ID, 1)
            fields = HEADER.unpack_from(chunk)
            chunk_id, records = fields[6], fields[3]
            if chunk_id > high:
                break
            done = chunk_id + records > high
            data = bytearray(chunk)
            data[_SIZES_AT : _SIZES_AT + 5] = bytes(5)
            run.append(bytes(data))
            size += len(data)
            if size >= DECODE_BYTES or done:
                yield from _decode(run, task, low, high, include_amqp, verify_crc)
                run, size = [], 0
        if run:
            yield from _decode(run, task, low, high, include_amqp, verify_crc)


def _decode(
    run: list[bytes], task: TailTask, low: int, high: int, include_amqp: bool, verify_crc: bool
) -> Iterator[pa.RecordBatch]:
    if not run:
        return
    b = task.bounds
    batch = chunks_to_record_batch(
        b"".join(run),
        task.stream,
        include_amqp=include_amqp,
        min_offset=low,
        max_offset=high,
        min_ts=b.min_ts,
        max_ts=b.max_ts,
        verify_crc=verify_crc,
    )
    if batch.num_rows:
        yield batch
