"""The Spark writer against a real ``tierlog serve`` subprocess and real Spark (local).

No duplicates under an injected task failure (retried attempt), under concurrent
duplicate attempts of every partition (what speculation does), under a whole-job re-run
with the same writeId, and with 300 partitions while the stream rolls segments; AMQP
encoding of properties; clear errors for bad options and schemas.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.plugins.tierlog_server import TierlogServerProcess, stored_bodies
from tierlog.formats.amqp import decode_message
from tierlog.spark.client import StreamClient

pytestmark = pytest.mark.spark
PAD = "." * 1000
# Many small tasks cost Spark scheduling time: CI writes 60 partitions (enough to roll the
# stream's segments several times), the long run (scripts/spark_long.sh) 300.
WIDE_PARTITIONS, WIDE_ROWS = (60, 100) if os.environ.get("CI") == "true" else (300, 40)


@pytest.fixture
def server(session_tierlog_server: TierlogServerProcess) -> TierlogServerProcess:
    """The session's server: this module's streams are named apart from other modules'."""
    return session_tierlog_server


def create_stream(server: TierlogServerProcess, name: str, **arguments: str) -> None:
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.create_stream(name, arguments)


def segment_count(server: TierlogServerProcess, name: str) -> int:
    (stream_dir,) = glob.glob(str(server.data_dir / "streams" / f"*_{name}_*"))
    return len(glob.glob(os.path.join(stream_dir, "*.segment")))


def assert_exactly_once(bodies: list[bytes], expected: list[bytes]) -> None:
    dups = [b for b, n in Counter(bodies).items() if n > 1]
    assert not dups, f"{len(dups)} duplicated rows, e.g. {dups[:3]}"
    assert sorted(bodies) == sorted(expected)


def body_frame(spark: Any, partitions: int, rows: int) -> Any:
    """``partitions`` partitions of ``rows`` rows each, body ``p{p}-r{i}``; deterministic."""
    from pyspark.sql import functions as F

    df = spark.range(0, partitions * rows, 1, partitions)
    return df.select(
        F.concat(
            F.lit("p"),
            F.spark_partition_id().cast("string"),
            F.lit("-r"),
            F.col("id").cast("string"),
        ).alias("body")
    )


def expected_bodies(partitions: int, rows: int) -> list[bytes]:
    return [b"p%d-r%d" % (i // rows, i) for i in range(partitions * rows)]


def write(df: Any, server: TierlogServerProcess, stream: str, **options: str) -> None:
    w = df.write.format("tierlog").mode("append").option("stream", stream)
    w = w.option("server", f"{server.host}:{server.stream_port}")
    for key, value in options.items():
        w = w.option(key, value)
    w.save()


def test_writes_every_row_once_and_a_rerun_adds_nothing(
    spark: Any, server: TierlogServerProcess
) -> None:
    create_stream(server, "basic")
    df = body_frame(spark, 4, 500)
    write(df, server, "basic", writeId="basic-run")
    assert_exactly_once(stored_bodies(server, "basic"), expected_bodies(4, 500))
    write(df, server, "basic", writeId="basic-run")  # the whole job again: all skipped
    assert_exactly_once(stored_bodies(server, "basic"), expected_bodies(4, 500))
    with StreamClient.connect(server.host, server.stream_port) as client:
        assert client.query_publisher_sequence("basic", "basic-run-3") == 500
    write(df, server, "basic")  # a fresh writeId is a new write: appends again
    assert len(stored_bodies(server, "basic")) == 4000


def test_injected_task_failure_is_retried_without_duplicates(
    spark: Any, server: TierlogServerProcess, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    assert "," in spark.sparkContext.master, (
        "the spark fixture must allow task retries: master local[N,F] with F >= 2 "
        "(local[N] never retries a failed task, whatever spark.task.maxFailures says)"
    )
    create_stream(server, "retried")
    marker = str(tmp_path / "failed-once")
    host, port = server.host, server.stream_port

    def fail_once(body: str) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if body == "p1-r1700" and not os.path.exists(marker):
            # Fail only once rows of this partition were published by this attempt (the
            # writer consumes batches of 50 rows while this UDF runs ahead of it).
            with StreamClient.connect(host, port) as client:
                for _ in range(400):
                    sequence = client.query_publisher_sequence("retried", "retry-run-1")
                    if sequence:
                        break
                    time.sleep(0.05)
            with open(marker, "w") as f:
                f.write(f"{ctx.attemptNumber() if ctx else -1} {sequence}")
            raise RuntimeError("injected task failure")
        return body + PAD  # big rows: the JVM flushes its buffer to the writer sooner

    df = body_frame(spark, 2, 1000)
    df = df.select(F.udf(fail_once, StringType())("body").alias("body"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        write(df, server, "retried", writeId="retry-run", maxInFlight="100")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    attempt, sequence = map(int, Path(marker).read_text().split())
    assert attempt == 0
    assert 0 < sequence < 1000  # the failed attempt had published part of its rows
    expected = [b + PAD.encode() for b in expected_bodies(2, 1000)]
    assert_exactly_once(stored_bodies(server, "retried"), expected)


def test_concurrent_duplicate_attempts_store_each_row_once(
    spark: Any, server: TierlogServerProcess
) -> None:
    """Every partition written by two attempts at once (what speculation does), then a
    third time: the named producers and the server's dedup keep one copy."""
    create_stream(server, "speculative")
    df = body_frame(spark, 4, 3000)
    errors: list[BaseException] = []

    def run() -> None:
        # Python data sources are looked up in the JVM thread's active session, which a
        # new thread does not have.
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        try:
            write(df, server, "speculative", writeId="spec", maxInFlight="200")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, [str(e)[:3000] for e in errors]
    write(df, server, "speculative", writeId="spec")
    assert_exactly_once(stored_bodies(server, "speculative"), expected_bodies(4, 3000))


def test_many_partitions_across_segment_rolls(spark: Any, server: TierlogServerProcess) -> None:
    create_stream(server, "wide", **{"stream-max-segment-size-bytes": "16384"})
    df = body_frame(spark, WIDE_PARTITIONS, WIDE_ROWS)
    write(df, server, "wide", writeId="wide-run")
    assert segment_count(server, "wide") > 3  # the stream rolled during the write
    write(df, server, "wide", writeId="wide-run")  # dedup state survives the rolls
    assert_exactly_once(stored_bodies(server, "wide"), expected_bodies(WIDE_PARTITIONS, WIDE_ROWS))


def test_properties_and_application_properties_become_amqp(
    spark: Any, server: TierlogServerProcess
) -> None:
    create_stream(server, "amqp")
    rows = [
        (b"hello", ("id-1", "greeting"), {"region": "eu", "tier": "gold"}),
        (b"world", ("id-2", None), None),
    ]
    schema = (
        "body binary, properties struct<message_id: string, subject: string>, "
        "application_properties map<string, string>"
    )
    write(spark.createDataFrame(rows, schema).coalesce(1), server, "amqp")
    messages = [decode_message(b) for b in stored_bodies(server, "amqp")]
    assert [m.body for m in messages] == [b"hello", b"world"]
    assert dict(messages[0].properties) == {"message_id": "id-1", "subject": "greeting"}
    assert dict(messages[0].application_properties) == {"region": "eu", "tier": "gold"}
    assert dict(messages[1].properties) == {"message_id": "id-2"}
    assert not messages[1].application_properties


def test_raw_and_amqp_message_formats(spark: Any, server: TierlogServerProcess) -> None:
    create_stream(server, "formats")
    df = spark.createDataFrame([("plain",)], "body string")
    write(df, server, "formats")
    write(df, server, "formats", messageFormat="amqp")
    raw, wrapped = stored_bodies(server, "formats")
    assert raw == b"plain"
    assert decode_message(wrapped).body == b"plain"


@pytest.mark.parametrize(
    ("schema", "rows", "options", "message"),
    [
        ("value string", [("x",)], {}, "needs a 'body' column"),
        ("body int", [(1,)], {}, "must be binary or string"),
        ("body string", [(None,)], {}, "holds nulls"),
        ("body string", [("x",)], {"server": "no-port"}, "must be host:port"),
        ("body string", [("x",)], {"messageFormat": "json"}, "messageFormat"),
        ("body string", [("x",)], {"stream": "does-not-exist"}, "STREAM_DOES_NOT_EXIST"),
        ("body string", [("x",)], {"maxInFlights": "8"}, "did you mean 'maxInFlight'"),
    ],
)
def test_bad_input_fails_the_write_clearly(
    spark: Any,
    server: TierlogServerProcess,
    schema: str,
    rows: list[tuple[object, ...]],
    options: dict[str, str],
    message: str,
) -> None:
    create_stream_once(server, "errors")
    df = spark.createDataFrame(rows, schema)
    w = df.write.format("tierlog").mode("append")
    w = w.option("stream", "errors").option("server", f"{server.host}:{server.stream_port}")
    for key, value in options.items():
        w = w.option(key, value)
    with pytest.raises(Exception, match=message):
        w.save()
    assert stored_bodies(server, "errors") == []


def test_overwrite_is_refused(spark: Any, server: TierlogServerProcess) -> None:
    create_stream_once(server, "errors")
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("tierlog").mode("overwrite").option("stream", "errors").option(
            "server", f"{server.host}:{server.stream_port}"
        ).save()


def test_unreachable_server_fails_the_write(spark: Any, server: TierlogServerProcess) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="cannot connect"):
        df.write.format("tierlog").mode("append").option("stream", "s").option(
            "server", f"127.0.0.1:{port}"
        ).save()


def create_stream_once(server: TierlogServerProcess, name: str) -> None:
    with StreamClient.connect(server.host, server.stream_port) as client:
        client.create_stream(name, exist_ok=True)


@pytest.fixture(scope="module", autouse=True)
def writable_source(spark: Any) -> Iterator[None]:
    """``format("tierlog")`` must write. Until the full source mixes in the writer
    (``TierlogWriteMixin``), register the write-only source for this module and put the
    full source back afterwards."""
    from tierlog.spark.batch import TierlogDataSource
    from tierlog.spark.session import register
    from tierlog.spark.writer import TierlogWriteMixin, TierlogWriteSource

    if issubclass(TierlogDataSource, TierlogWriteMixin):
        yield
        return
    spark.dataSource.register(TierlogWriteSource)
    try:
        yield
    finally:
        register(spark)


@given(st.lists(st.binary(max_size=300), max_size=60), st.integers(0, 2**40))
def test_publish_frame_matches_the_codec(bodies: list[bytes], first_id: int) -> None:
    """The numpy-built Publish frame is byte for byte the codec's, and decodes back."""
    import numpy as np

    from tierlog.formats.protocol.publish import (
        decode_publish,
        encode_publish,
        encode_publish_columns,
    )

    offsets = np.zeros(len(bodies) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in bodies])
    data = np.frombuffer(b"".join(bodies), dtype=np.uint8)
    ids = np.arange(first_id, first_id + len(bodies), dtype=np.uint64)
    frame = encode_publish_columns(7, ids, offsets, data)
    assert frame == encode_publish(7, [(first_id + i, b) for i, b in enumerate(bodies)])
    if bodies:
        batch = decode_publish(memoryview(frame)[4:])
        assert list(batch.publishing_ids) == ids.tolist()


@given(st.lists(st.binary(max_size=40), max_size=30), st.data())
def test_message_buffers_of_a_sliced_batch(bodies: list[bytes], data: st.DataObject) -> None:
    """A replay publishes a batch minus the rows already held (``batch.slice(skip)``): the
    buffers are those of the slice, whatever the slice's offset into the Arrow buffers."""
    import pyarrow as pa

    from tierlog.spark.writer import _binary_buffers

    skip = data.draw(st.integers(0, len(bodies)))
    for kind in (pa.binary(), pa.large_binary(), pa.string()):
        values = [b.hex() for b in bodies] if kind == pa.string() else bodies
        array = pa.array(values, kind)[skip:]
        if kind == pa.string():
            array = array.cast(pa.binary())
        offsets, buffer = _binary_buffers(array)
        assert len(offsets) == len(array) + 1
        got = [bytes(buffer[offsets[i] : offsets[i + 1]]) for i in range(len(array))]
        want = [v.encode() if isinstance(v, str) else v for v in values[skip:]]
        assert got == want
