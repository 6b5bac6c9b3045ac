"""Stream filtering as RabbitMQ does it: Publish v2 filter values build each chunk's bloom
filter (osiris's bytes, sized by ``stream-filter-size-bytes``), and subscriptions with
``filter.N`` / ``match-unfiltered`` get only the chunks whose bloom may match — from the
local log and from the remote tier, where the fragment index's blooms let the reader skip
chunks without fetching them. rstream's producer ``filter_value_extractor`` and consumer
``FilterConfiguration`` are the independent client.

The expected bloom bytes come from osiris's ``osiris_bloom.erl`` run on Erlang/OTP 25
(see tests/formats/test_bloom.py), never from tierlog's code.
"""

from __future__ import annotations

import asyncio
import glob
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import STREAM_ARGS, config, status, wait_for
from tierlog.formats.chunk import HEADER_SIZE, decode_header
from tierlog.formats.fragment import TRAILER_SIZE
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType as WireOffsetType
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.server.app import Server

# osiris_bloom:to_binary of {<<"apple">>, <<>>} at 16 and of {<<"apple">>} at 32 bytes
OSIRIS_APPLE_AND_UNFILTERED_16 = bytes.fromhex("84000000000000000000040000000000")
OSIRIS_APPLE_16 = bytes.fromhex("04000000000000000000040000000000")
DOWNLOADED = "tierlog_object_store_downloaded_bytes_total"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(config(tmp_path))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


def _chunks_on_disk(server: Server, name: str) -> list[bytes]:
    """Every chunk of the stream's local segment files, as stored."""
    assert server.broker is not None
    handle = server.broker.get("/", name)
    assert handle is not None
    chunks: list[bytes] = []
    for ref in handle.log.segment_refs():
        data = Path(ref.segment_path).read_bytes()
        pos = 8  # the segment file header
        while pos + HEADER_SIZE <= len(data):
            header = decode_header(data, pos)
            chunks.append(data[pos : pos + header.total_size])
            pos += header.total_size
    return chunks


async def _create(client: AsyncRawClient, name: str, args: dict[str, str]) -> int:
    answer = await client.request(c.CreateRequest(client.next_corr(), name, args))
    return int(answer.response_code)


async def test_filter_size_is_validated_as_rabbitmq_does(server: Server) -> None:
    """16..255 (rabbit_stream_manager), anything else PRECONDITION_FAILED; accepted sizes
    size the blooms (before, any value was accepted and ignored)."""
    client = await AsyncRawClient.connect(server.stream_port)
    for bad in ("15", "256", "0", "big"):
        code = await _create(client, "f", {"stream-filter-size-bytes": bad})
        assert code == ResponseCode.PRECONDITION_FAILED, bad
    assert await _create(client, "f", {"stream-filter-size-bytes": "32"}) == ResponseCode.OK
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "f"))
    client.send(encode_publish(1, [(1, b"a")], filter_values=["apple"]))
    await client.expect(PublishConfirm)
    (chunk,) = _chunks_on_disk(server, "f")
    header = decode_header(chunk)
    assert header.bloom_size == 32
    # osiris_bloom:to_binary(insert(<<"apple">>, init(32))): make_hash(<<"apple">>, 256)
    # is {208, 48}: bits 48 and 208 of the Erlang bitstring
    expected = bytearray(32)
    expected[48 // 8] |= 0x80 >> (48 % 8)
    expected[208 // 8] |= 0x80 >> (208 % 8)
    assert chunk[HEADER_SIZE : HEADER_SIZE + 32] == bytes(expected)
    client.close()


async def test_chunks_carry_osiris_blooms(server: Server) -> None:
    """The bytes osiris_log:make_chunk writes: bloom size in header byte 44, the bloom
    right after the header, the entry data CRC unchanged; v1 publishes (and v2 ones
    without any filter value) have no bloom."""
    client = await AsyncRawClient.connect(server.stream_port)
    assert await _create(client, "b", {}) == ResponseCode.OK
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "b"))
    client.send(encode_publish(1, [(1, b"x"), (2, b"y")], filter_values=["apple", None]))
    await client.expect(PublishConfirm)
    client.send(encode_publish(1, [(3, b"z")], filter_values=["apple"]))
    await client.expect(PublishConfirm)
    client.send(encode_publish(1, [(4, b"w")]))  # v1
    await client.expect(PublishConfirm)
    client.send(encode_publish(1, [(5, b"v"), (6, b"u")], filter_values=[None, ""]))
    await client.expect(PublishConfirm)
    chunks = _chunks_on_disk(server, "b")
    assert len(chunks) == 4
    first, second, plain, unfiltered = chunks
    assert first[44] == 16 and first[HEADER_SIZE:64] == OSIRIS_APPLE_AND_UNFILTERED_16
    # the entries follow the bloom: two simple entries "x", "y"
    assert first[64:74] == b"\x00\x00\x00\x01x\x00\x00\x00\x01y"
    assert second[44] == 16 and second[HEADER_SIZE:64] == OSIRIS_APPLE_16
    assert plain[44] == 0 and unfiltered[44] == 0
    # Deliver sends header and data only, as RabbitMQ (the bloom is skipped)
    spec = c.WireOffsetSpec(WireOffsetType.FIRST)
    sub = c.SubscribeRequest(client.next_corr(), 1, "b", spec, 10)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    delivered = await client.expect(Deliver)
    assert bytes(delivered.chunk) == first[:HEADER_SIZE] + first[64:74]
    client.close()


async def _filtered_delivery(
    port: int, name: str, spec: c.WireOffsetSpec, properties: dict[str, str], until: int
) -> list[int]:
    """Chunk ids a raw subscription with ``properties`` is sent, up to chunk id ``until``."""
    client = await AsyncRawClient.connect(port)
    sub = c.SubscribeRequest(client.next_corr(), 1, name, spec, 1000, properties)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    ids: list[int] = []
    try:
        while True:
            frame = await client.expect(Deliver, timeout=3.0)
            ids.append(decode_header(bytes(frame.chunk)).chunk_id)
            if ids[-1] >= until:
                break
    except TimeoutError:
        pass
    client.close()
    return ids


async def _publish_colours(
    client: AsyncRawClient, name: str, rounds: int, base: int = 0
) -> list[int]:
    """One chunk per frame: red, green, blue (filter values) and a v1 chunk, ``rounds``
    times; returns the first offset of each of the 4 * rounds chunks (the stream's next
    offset was ``base``)."""
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", name))
    noise = random.Random(7)  # incompressible bodies: zstd fragments keep their size
    firsts = []
    pid = 0
    for _ in range(rounds):
        for colour in ("red", "green", "blue", None):
            batch = [(pid + i + 1, noise.randbytes(2000)) for i in range(10)]
            firsts.append(base + pid)
            pid += 10
            values = None if colour is None else [colour] * 10
            client.send(encode_publish(1, batch, filter_values=values))
            await client.expect(PublishConfirm)
    return firsts


async def test_local_reads_skip_chunks_the_bloom_rules_out(server: Server) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    assert await _create(client, "c", {}) == ResponseCode.OK
    firsts = await _publish_colours(client, "c", 3)
    client.close()
    first = c.WireOffsetSpec(WireOffsetType.FIRST)
    last = firsts[-1]
    green = await _filtered_delivery(server.stream_port, "c", first, {"filter.0": "green"}, last)
    assert green == firsts[1::4]
    both = {"filter.0": "green", "filter.1": "red"}
    assert await _filtered_delivery(server.stream_port, "c", first, both, last) == sorted(
        firsts[0::4] + firsts[1::4]
    )
    unfiltered = {"filter.0": "green", "match-unfiltered": "true"}
    got = await _filtered_delivery(server.stream_port, "c", first, unfiltered, last)
    assert got == sorted(firsts[1::4] + firsts[3::4])
    # without filter properties, everything
    assert await _filtered_delivery(server.stream_port, "c", first, {}, last) == firsts


async def test_rstream_filtering_end_to_end(server: Server) -> None:
    """rstream's producer sends filter values (it asks ExchangeCommandVersions for Publish
    v2 and refused to filter before); its consumer's FilterConfiguration subscribes with
    filter.N and post-filters; the server sends only chunks that may match."""
    port = server.stream_port
    producer = Producer(
        "127.0.0.1",
        port=port,
        username="guest",
        password="guest",
        filter_value_extractor=_region,
    )
    await producer.start()
    await producer.create_stream("orders")
    regions = ["eu", "us", "apac", "latam"]
    for r, region in enumerate(regions * 5):
        msgs = [
            AMQPMessage(
                body=f"{region}-{r}-{i}".encode(), application_properties={"region": region}
            )
            for i in range(20)
        ]
        await producer.send_wait("orders", msgs[0])  # a chunk of its own, then the rest
        await producer.send_batch("orders", msgs[1:])
    await producer.close()

    before = server.metrics.value("tierlog_delivered_chunks_total")
    got: list[str] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, context: MessageContext) -> None:
        got.append(bytes(msg.body).decode())
        if len(got) == 5 * 20:
            done.set()

    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await consumer.start()
    await consumer.subscribe(
        "orders",
        on_message,
        offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        decoder=amqp_decoder,
        filter_input=FilterConfiguration(
            values_to_filter=["apac"],
            predicate=lambda m: _region_of(m) == "apac",
        ),
    )
    await asyncio.wait_for(done.wait(), 10)
    await asyncio.sleep(0.3)
    await consumer.close()
    assert len(got) == 100 and all(body.startswith("apac-") for body in got)
    delivered = server.metrics.value("tierlog_delivered_chunks_total") - before
    chunks = _chunks_on_disk(server, "orders")
    with_apac = [chunk for chunk in chunks if b"apac-" in chunk]
    # the chunks holding apac messages (a bloom false positive at most), not all
    assert len(with_apac) <= delivered <= len(with_apac) + 1 < len(chunks)


async def _region(message: AMQPMessage) -> str:
    """rstream's filter_value_extractor (a coroutine function)."""
    return _region_of(message)


def _region_of(message: AMQPMessage) -> str:
    """The message's ``region`` property (decoded messages have bytes keys)."""
    props = message.application_properties or {}
    return _as_str(props.get("region", props.get(b"region")))  # type: ignore[call-overload]


def _as_str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize("fragment_codec", ["none", "zstd"])
async def test_remote_reads_skip_chunks_without_fetching_them(
    tmp_path: Path, fragment_codec: str
) -> None:
    """The local copy freed, a filtered subscription reads the remote tier: fragments of
    chunks with blooms are format v2 (the index carries the blooms), and the chunks the
    blooms rule out are never fetched."""
    cold = Server(config(tmp_path))
    await cold.start()
    try:
        client = await AsyncRawClient.connect(cold.stream_port)
        args = dict(STREAM_ARGS)
        if fragment_codec != "none":
            args["x-tierlog-compression"] = fragment_codec
        assert await _create(client, "cold", args) == ResponseCode.OK
        firsts = await _publish_colours(client, "cold", 8)
        client.close()

        async def freed() -> bool:
            s = await status(cold, "cold")
            return (
                s["remote"]["tiered_offset"] == s["local"]["next_offset"]
                and s["local"]["first_offset"] > firsts[len(firsts) // 2]
            )

        await wait_for(freed)
        fragments = glob.glob(str(tmp_path / "**" / "*.fragment*"), recursive=True)
        assert fragments and all(
            Path(p).read_bytes()[4:8] == b"\x00\x00\x00\x02" for p in fragments
        )
        stream_bytes = sum(os.path.getsize(p) - TRAILER_SIZE for p in fragments)
        downloaded = cold.metrics.value(DOWNLOADED)
        first = c.WireOffsetSpec(WireOffsetType.FIRST)
        local_first = (await status(cold, "cold"))["local"]["first_offset"]
        remote_green = [f for f in firsts[1::4] if f < local_first]  # the remote tier's only
        green = await _filtered_delivery(
            cold.stream_port, "cold", first, {"filter.0": "green"}, remote_green[-1]
        )
        assert green == remote_green
        read = cold.metrics.value(DOWNLOADED) - downloaded
        # a quarter of the chunks are green (all chunks are alike in size): the reader
        # fetched little more than those (indexes included), never all it went through
        went_through = stream_bytes * local_first / (firsts[-1] + 10)
        assert 0 < read < went_through * 0.45, (read, went_through)
    finally:
        await cold.stop()
