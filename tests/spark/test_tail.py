"""Batch and streaming reads that include the un-tiered tail through a real ``tierlog
serve``: the manifest part and the tail meet exactly (no gap, no duplicate) while the server
keeps tiering between and during the reads; a streaming query sees a message as soon as the
server confirmed it, long before it is tiered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.plugins.tierlog_server import TierlogServerProcess
from tierlog.errors import ConfigError
from tierlog.spark import connections
from tierlog.spark.batch import TailPartition, TaskPartition, TierlogBatchReader
from tierlog.spark.client import StreamClient
from tierlog.spark.options import parse_options
from tierlog.spark.planning import plan_read
from tierlog.spark.reading import traced_reads

pytestmark = pytest.mark.spark

STREAM = "tailed"
FOLLOWED = "followed"  # streaming query while tiering runs
UNTIERED = "untiered"  # tiering only after an hour
STREAM_ARGS = {
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.1",
    "x-tierlog-local-max-bytes": "1",  # tiered data is served from the remote tier
}
UNTIERED_ARGS = {"x-tierlog-fragment-bytes": str(64 << 20), "x-tierlog-max-fragment-age": "1h"}


@pytest.fixture(scope="module")
def server(session_tierlog_server: TierlogServerProcess) -> Iterator[TierlogServerProcess]:
    """The session's server with this module's streams (named apart from other modules')."""
    proc = session_tierlog_server
    try:
        with StreamClient.connect(proc.host, proc.stream_port) as client:
            client.create_stream(STREAM, STREAM_ARGS)
            client.create_stream(FOLLOWED, STREAM_ARGS)
            client.create_stream(UNTIERED, UNTIERED_ARGS)
        yield proc
    finally:
        connections.close_all()


def publish(server: TierlogServerProcess, bodies: list[bytes], stream: str = STREAM) -> None:
    lengths = np.array([len(b) for b in bodies], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    data = np.frombuffer(b"".join(bodies), dtype=np.uint8)
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.declare_publisher(0, stream)
        for lo in range(0, len(bodies), 50):  # several chunks
            hi = min(lo + 50, len(bodies))
            ids = np.arange(lo + 1, hi + 1, dtype=np.uint64)
            client.publish(0, ids, offsets[lo : hi + 1], data)
            client.wait_for_confirms(0)


def options(proc: TierlogServerProcess, stream: str = STREAM, **extra: str) -> dict[str, str]:
    data = proc.data_dir
    return {
        "stream": stream,
        "objectStore": f"file://{data / 'objects'}",
        "metaStore": f"sqlite://{data / 'meta.db'}",
        **extra,
    }


def tiered_next(server: TierlogServerProcess, stream: str = STREAM) -> int:
    (plan,) = plan_read(parse_options(options(server, stream)))
    return plan.next_offset


def read(spark: Any, opts: dict[str, str]) -> list[bytes]:
    df = spark.read.format("tierlog").options(**opts).load()
    return [bytes(r["body"]) for r in df.orderBy("offset").select("body").collect()]


def test_tail_reads_meet_the_manifest_exactly_while_tiering(
    spark: Any, server: TierlogServerProcess
) -> None:
    published: list[bytes] = []
    batch = [b"early-%04d" % i for i in range(300)]
    publish(server, batch)
    published += batch
    deadline = time.monotonic() + 60
    while tiered_next(server) == 0:  # wait until some of it is tiered
        assert time.monotonic() < deadline, "nothing was tiered"
        time.sleep(0.2)
    address = f"{server.host}:{server.stream_port}"
    saw_both = False
    for round_ in range(4):
        more = [b"r%d-%04d" % (round_, i) for i in range(150)]
        publish(server, more)  # confirmed = committed: a tail read must see it
        published += more
        reader = TierlogBatchReader(parse_options(options(server, server=address)))
        parts = reader.partitions()
        kinds = {type(p) for p in parts}
        saw_both = saw_both or kinds == {TaskPartition, TailPartition}
        rows = read(spark, options(server, server=address))
        assert rows == published, f"round {round_}: {len(rows)} rows, {len(published)} published"
        time.sleep(0.4 * round_)  # let tiering move the boundary by different amounts
    assert saw_both, "no read had both a tiered part and a tail"
    # Without the server: only what is tiered, a prefix of the same records.
    tiered = read(spark, options(server))
    assert tiered == published[: len(tiered)]
    # Offsets across the boundary: a range that straddles it.
    cut = tiered_next(server)
    lo, hi = max(0, cut - 20), cut + 20
    ranged = read(spark, options(server, server=address, startOffset=str(lo), endOffset=str(hi)))
    assert ranged == published[lo:hi]


def test_tail_options_are_checked() -> None:
    base = {"stream": "s", "objectStore": "file:///x", "metaStore": "sqlite:///m.db"}
    assert parse_options({**base, "server": "h:5552"}).server == ("h", 5552)
    with pytest.raises(ConfigError, match="only apply with includeTail"):
        parse_options({**base, "server": "h:5552", "includeTail": "false"})
    with pytest.raises(ConfigError, match="host:port"):
        parse_options({**base, "includeTail": "true"})
    with pytest.raises(ConfigError, match="only apply with includeTail"):
        parse_options({**base, "includeTail": "false", "password": "x"})
    parse_options({**base, "server": "h:1"}).check_mode("stream")  # streaming reads too


class Follower:
    """A running streaming query over one stream and the rows of its micro-batches; the
    tasks trace every fragment they read from the remote tier (``traceDir``), so what was
    read through the server shows afterwards."""

    def __init__(self, spark: Any, server: TierlogServerProcess, stream: str, cp: str) -> None:
        self.rows: list[tuple[int, bytes]] = []
        self.server, self.stream = server, stream
        self.trace = Path(cp) / "trace"
        self.trace.mkdir(parents=True)
        address = f"{server.host}:{server.stream_port}"
        opts = options(server, stream, server=address, traceDir=str(self.trace))
        self.query = (
            spark.readStream.format("tierlog")
            .options(**opts)
            .load()
            .writeStream.foreachBatch(self._collect)
            .option("checkpointLocation", cp)
            .trigger(processingTime="300 milliseconds")
            .start()
        )

    def _collect(self, df: Any, batch_id: int) -> None:
        rows = [(r["offset"], bytes(r["body"])) for r in df.select("offset", "body").collect()]
        self.rows += sorted(rows)

    def wait_for(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.rows) < count and time.monotonic() < deadline:
            assert self.query.exception() is None, self.query.exception()
            time.sleep(0.1)
        assert len(self.rows) >= count, f"{len(self.rows)} of {count} rows after {timeout}s"

    def stop(self) -> None:
        self.query.stop()

    def rows_from_the_tier(self) -> int:
        """How many of the rows read lie in a fragment the tasks read."""
        traced = {first for _, first in traced_reads(str(self.trace))}
        (plan,) = plan_read(parse_options(options(self.server, self.stream)))
        fragments = [f for f in plan.fragments if f.first_offset in traced]
        spans = [(f.first_offset, f.next_offset) for f in fragments]
        return sum(1 for o, _ in self.rows if any(lo <= o < hi for lo, hi in spans))


def test_streaming_query_sees_messages_before_they_are_tiered(
    spark: Any, server: TierlogServerProcess, tmp_path: Any
) -> None:
    follower = Follower(spark, server, UNTIERED, str(tmp_path / "cp"))
    try:
        first = [b"fresh-%03d" % i for i in range(20)]
        publish(server, first, UNTIERED)
        started = time.monotonic()
        follower.wait_for(20, timeout=30)
        latency = time.monotonic() - started
        more = [b"more-%03d" % i for i in range(30)]
        publish(server, more, UNTIERED)
        follower.wait_for(50, timeout=30)
    finally:
        follower.stop()
    assert tiered_next(server, UNTIERED) == 0, "the stream was tiered: the test proves nothing"
    assert follower.rows == list(enumerate(first + more))
    assert follower.rows_from_the_tier() == 0  # every row came through the server
    assert latency < 15, f"the query saw confirmed messages only after {latency:.1f}s"


def test_streaming_tail_meets_the_manifest_while_tiering(
    spark: Any, server: TierlogServerProcess, tmp_path: Any
) -> None:
    """Real Spark, a processing-time query, publishing and tiering all the while."""
    follower = Follower(spark, server, FOLLOWED, str(tmp_path / "cp"))
    published: list[bytes] = []
    try:
        for round_ in range(8):
            batch = [b"f%d-%04d" % (round_, i) for i in range(120)]
            publish(server, batch, FOLLOWED)
            published += batch
            time.sleep(0.25 * (round_ % 4))  # tiering moves the boundary between and during
        follower.wait_for(len(published), timeout=90)
        time.sleep(1.0)  # a duplicate would show up in a later micro-batch
    finally:
        follower.stop()
    assert tiered_next(server, FOLLOWED) > 0, "nothing was tiered: the test proves nothing"
    assert follower.rows == list(enumerate(published)), "gap or duplicate at the boundary"


def test_micro_batches_split_at_a_moving_boundary(server: TierlogServerProcess) -> None:
    """The source's own calls, as Spark makes them (latestOffset, then partitions and a
    read of each): each micro-batch spans records already tiered and records published a
    moment ago, with tiering cutting into the latter before, during or after planning; the
    two parts meet exactly."""
    from tierlog.spark.streaming import TierlogStreamReader

    stream = STREAM + "_split"
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.create_stream(stream, STREAM_ARGS)
    address = f"{server.host}:{server.stream_port}"
    reader = TierlogStreamReader(parse_options(options(server, stream, server=address)))
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    position = reader.initialOffset()
    published: list[bytes] = []
    read: list[tuple[int, bytes]] = []
    split_batches = 0
    for round_ in range(6):
        tiered = [b"t%02d-%04d" % (round_, i) for i in range(100)]
        publish(server, tiered, stream)
        published += tiered
        deadline = time.monotonic() + 30
        while tiered_next(server, stream) < len(published):  # this part reaches the tier
            assert time.monotonic() < deadline, "not tiered in time"
            time.sleep(0.1)
        fresh = [b"f%02d-%04d" % (round_, i) for i in range(100)]
        publish(server, fresh, stream)  # and this part is read before it is tiered (1 s)
        published += fresh
        end = reader.latestOffset(position, ReadAllAvailable())
        time.sleep(0.5 * (round_ % 3))  # ... or while it is being tiered, or after
        parts = reader.partitions(position, end)
        kinds = {type(p) for p in parts}
        split_batches += kinds == {TaskPartition, TailPartition}
        for part in parts:
            for b in reader.read(part):
                offsets = b.column("offset").to_pylist()
                read += zip(offsets, (bytes(x) for x in b.column("body").to_pylist()), strict=True)
        position = end
    assert read == list(enumerate(published)), "gap or duplicate at the boundary"
    assert split_batches > 0, "no micro-batch had both a tiered part and a tail"


def test_streaming_limits_take_the_tail_and_need_the_server(
    server: TierlogServerProcess,
) -> None:
    from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxRows

    from tierlog.spark.errors import StreamUnavailableError
    from tierlog.spark.streaming import TierlogStreamReader

    publish(server, [b"limit-%03d" % i for i in range(40)], UNTIERED)
    address = f"{server.host}:{server.stream_port}"
    reader = TierlogStreamReader(parse_options(options(server, UNTIERED, server=address)))
    head = reader.reportLatestOffset()[UNTIERED]
    assert head >= 40 and tiered_next(server, UNTIERED) == 0  # all of it is tail
    start = {UNTIERED: 0}
    # A byte limit takes the tail as one unit: a query never stalls on un-tiered data.
    assert reader.latestOffset(start, ReadMaxBytes(1)) == {UNTIERED: head}
    assert reader.latestOffset(start, ReadMaxRows(7)) == {UNTIERED: 7}
    (part,) = reader.partitions(start, {UNTIERED: 7})
    assert isinstance(part, TailPartition)
    rows = [r for b in reader.read(part) for r in b.column("offset").to_pylist()]
    assert rows == list(range(7))
    # Offsets past the manifest (from a checkpoint) cannot be read without the server.
    plain = TierlogStreamReader(parse_options(options(server, UNTIERED)))
    with pytest.raises(StreamUnavailableError, match="not tiered yet"):
        plain.partitions(start, {UNTIERED: 7})
