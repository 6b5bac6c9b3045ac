"""Super streams against ``tierlog serve``: the four commands' codes as RabbitMQ answers
them (raw frames), rstream's ``SuperStreamProducer`` / ``SuperStreamConsumer`` routing by
hash and by key with every message read once through the partitions, and a creation cut
short by a crash converging when it is asked again (docs/compatibility.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    RouteType,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
    amqp_decoder,
)

from tests.plugins.tierlog_server import (  # noqa: F401
    RawClient,
    TierlogServerProcess,
    running_server,
    session_tierlog_server,
)
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType as WireOffsetType
from tierlog.formats.protocol.constants import ResponseCode as R
from tierlog.remote.super_streams import (
    SuperStreamCatalog,
    SuperStreamDefinition,
)
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

HOST = "127.0.0.1"


@pytest.fixture
def client(session_tierlog_server: TierlogServerProcess) -> Iterator[RawClient]:  # noqa: F811
    raw = RawClient(HOST, session_tierlog_server.stream_port, timeout=10)
    assert raw.handshake() == R.OK
    try:
        yield raw
    finally:
        raw.close()


def ask(client: RawClient, request: Any) -> Any:
    """Send ``request`` (its correlation id set by the caller) and the answer to it."""
    client.send(request.encode())
    while True:
        answer = client.recv_frame()
        assert answer is not None, "connection closed"
        if getattr(answer, "correlation_id", None) == request.correlation_id:
            return answer


def create(
    client: RawClient, name: str, partitions: list[str], keys: list[str], **args: str
) -> int:
    request = c.CreateSuperStreamRequest(client.next_corr(), name, partitions, keys, args)
    answer = ask(client, request)
    assert isinstance(answer, c.SimpleResponse)
    return int(answer.response_code)


def delete(client: RawClient, name: str) -> int:
    answer = ask(client, c.DeleteSuperStreamRequest(client.next_corr(), name))
    assert isinstance(answer, c.SimpleResponse)
    return int(answer.response_code)


def route(client: RawClient, name: str, key: str) -> tuple[int, list[str]]:
    answer = ask(client, c.RouteRequest(client.next_corr(), key, name))
    assert isinstance(answer, c.RouteResponse)
    return int(answer.response_code), list(answer.streams)


def partitions(client: RawClient, name: str) -> tuple[int, list[str]]:
    answer = ask(client, c.PartitionsRequest(client.next_corr(), name))
    assert isinstance(answer, c.PartitionsResponse)
    return int(answer.response_code), list(answer.streams)


def metadata_codes(client: RawClient, streams: list[str]) -> dict[str, int]:
    answer = ask(client, c.MetadataRequest(client.next_corr(), streams))
    assert isinstance(answer, c.MetadataResponse)
    return {s.name: s.response_code for s in answer.streams}


def test_create_route_partitions_delete_answer_as_rabbitmq(client: RawClient) -> None:
    parts = ["ss-inv-eu", "ss-inv-us", "ss-inv-apac"]
    assert create(client, "ss-inv", parts, ["eu", "us", "eu"], **{"max-age": "1h"}) == R.OK
    assert metadata_codes(client, parts) == dict.fromkeys(parts, R.OK)  # ordinary streams
    assert create(client, "ss-inv", parts, ["eu", "us", "eu"]) == R.STREAM_ALREADY_EXISTS
    assert partitions(client, "ss-inv") == (R.OK, parts)  # in the order created
    # exact binding key, every partition bound with it, in partition order
    assert route(client, "ss-inv", "eu") == (R.OK, ["ss-inv-eu", "ss-inv-apac"])
    assert route(client, "ss-inv", "us") == (R.OK, ["ss-inv-us"])
    assert route(client, "ss-inv", "EU") == (R.OK, [])  # no match: OK, no stream
    assert route(client, "ss-none", "eu") == (R.STREAM_DOES_NOT_EXIST, [])
    assert partitions(client, "ss-none") == (R.STREAM_DOES_NOT_EXIST, [])
    # a consumer of a partition is told when the super stream goes, as Delete tells it
    watcher = RawClient(HOST, client.sock.getpeername()[1], timeout=10)
    assert watcher.handshake() == R.OK
    first = c.WireOffsetSpec(WireOffsetType.FIRST, 0)
    subscribe = c.SubscribeRequest(watcher.next_corr(), 1, parts[1], first, 1)
    assert ask(watcher, subscribe).response_code == R.OK
    assert delete(client, "ss-inv") == R.OK
    update = watcher.expect(c.MetadataUpdate)
    assert isinstance(update, c.MetadataUpdate)
    assert (update.stream, update.code) == (parts[1], R.STREAM_NOT_AVAILABLE)
    watcher.close()
    assert metadata_codes(client, parts) == dict.fromkeys(parts, R.STREAM_DOES_NOT_EXIST)
    assert partitions(client, "ss-inv") == (R.STREAM_DOES_NOT_EXIST, [])
    assert delete(client, "ss-inv") == R.STREAM_DOES_NOT_EXIST
    # the name is free again
    assert create(client, "ss-inv", parts, ["eu", "us", "eu"]) == R.OK
    # a partition deleted on its own leaves the answers, as a deleted queue's binding does
    assert ask(client, c.DeleteRequest(client.next_corr(), parts[0])).response_code == R.OK
    assert partitions(client, "ss-inv") == (R.OK, parts[1:])
    assert route(client, "ss-inv", "eu") == (R.OK, ["ss-inv-apac"])
    assert delete(client, "ss-inv") == R.OK  # the others go with it
    assert metadata_codes(client, parts) == dict.fromkeys(parts, R.STREAM_DOES_NOT_EXIST)


def test_bad_definitions_are_refused_and_leave_nothing(client: RawClient) -> None:
    assert create(client, "ss-bad", ["ss-bad-0", "ss-bad-1"], ["0"]) == R.PRECONDITION_FAILED
    assert create(client, "ss-bad", ["ss-bad-0", "ss-bad-0"], ["0", "1"]) == R.PRECONDITION_FAILED
    assert create(client, "ss-bad", [], []) == R.PRECONDITION_FAILED
    assert create(client, "", ["ss-bad-0"], ["0"]) == R.PRECONDITION_FAILED
    args = {"max-age": "forever"}
    assert create(client, "ss-bad", ["ss-bad-0"], ["0"], **args) == R.PRECONDITION_FAILED
    # reserved names: the super stream or any partition (before permissions)
    assert create(client, "__tierlog_ss", ["ss-bad-0"], ["0"]) == R.PRECONDITION_FAILED
    assert create(client, "ss-bad", ["__tierlog_p"], ["0"]) == R.PRECONDITION_FAILED
    assert delete(client, "__tierlog_ss") == R.ACCESS_REFUSED
    assert route(client, "__tierlog_ss", "0") == (R.ACCESS_REFUSED, [])
    assert partitions(client, "__tierlog_ss") == (R.ACCESS_REFUSED, [])
    assert partitions(client, "ss-bad") == (R.STREAM_DOES_NOT_EXIST, [])
    assert metadata_codes(client, ["ss-bad-0"]) == {"ss-bad-0": R.STREAM_DOES_NOT_EXIST}
    # an existing stream as a partition: the whole creation is refused, nothing made
    ask(client, c.CreateRequest(client.next_corr(), "ss-taken-1", {}))
    parts = ["ss-taken-0", "ss-taken-1"]
    assert create(client, "ss-taken", parts, ["0", "1"]) == R.STREAM_ALREADY_EXISTS
    assert metadata_codes(client, ["ss-taken-0"]) == {"ss-taken-0": R.STREAM_DOES_NOT_EXIST}
    assert partitions(client, "ss-taken") == (R.STREAM_DOES_NOT_EXIST, [])
    ask(client, c.DeleteRequest(client.next_corr(), "ss-taken-1"))


USERS = """
[tier]
enabled = false
[auth]
users = { guest = "guest", app = "app", limited = "limited" }
[auth.permissions.app]
"/" = { configure = "^orders.*", write = "^orders.*", read = "^orders.*" }
[auth.permissions.limited]
"/" = { configure = "^orders$|^orders-0$", write = ".*", read = ".*" }
"""


def test_permissions_as_rabbitmq(tmp_path: Path) -> None:
    """configure + read on the super stream and configure + write on every partition to
    create or delete; write to route; read or write to list partitions."""
    with running_server(tmp_path / "data", config_text=USERS) as server:
        app = RawClient(HOST, server.stream_port, timeout=10)
        limited = RawClient(HOST, server.stream_port, timeout=10)
        assert app.handshake("app", "app") == R.OK
        assert limited.handshake("limited", "limited") == R.OK
        try:
            parts = ["orders-0", "orders-1"]
            assert create(limited, "orders", parts, ["0", "1"]) == R.ACCESS_REFUSED
            assert metadata_codes(app, parts) == dict.fromkeys(parts, R.STREAM_DOES_NOT_EXIST)
            assert create(app, "orders", ["orders-0", "other-1"], ["0", "1"]) == R.ACCESS_REFUSED
            assert create(app, "orders", parts, ["0", "1"]) == R.OK
            assert route(limited, "orders", "1") == (R.OK, ["orders-1"])
            assert partitions(limited, "orders") == (R.OK, parts)
            assert delete(limited, "orders") == R.ACCESS_REFUSED  # not orders-1
            assert partitions(app, "orders") == (R.OK, parts)
            assert delete(app, "orders") == R.OK
        finally:
            app.close()
            limited.close()


async def _key(message: AMQPMessage) -> str:
    return str(message.application_properties["key"])


def _message(i: int, key: str) -> AMQPMessage:
    return AMQPMessage(body=f"m-{i}".encode(), application_properties={"key": key})


async def _consume_all(port: int, name: str, expected: int) -> dict[str, list[str]]:
    """Every partition read from its first offset: body -> partitions it was read from."""
    seen: dict[str, list[str]] = {}
    done = asyncio.Event()
    consumer = SuperStreamConsumer(
        HOST, port, username="guest", password="guest", super_stream=name
    )

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        seen.setdefault(bytes(message.body).decode(), []).append(context.stream)
        if sum(len(v) for v in seen.values()) >= expected:
            done.set()

    await consumer.start()
    try:
        first = ConsumerOffsetSpecification(OffsetType.FIRST, None)
        await consumer.subscribe(
            callback=on_message, offset_specification=first, decoder=amqp_decoder
        )
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(0.3)  # nothing more arrives (no duplicate)
    finally:
        await consumer.close()
    return seen


def test_rstream_super_stream_producer_and_consumer_hash_routing(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    port, name, count = session_tierlog_server.stream_port, "ss-rs-hash", 300

    async def main() -> dict[str, list[str]]:
        producer = SuperStreamProducer(
            HOST,
            port,
            username="guest",
            password="guest",
            super_stream=name,
            routing_extractor=_key,
            routing=RouteType.Hash,
            super_stream_creation_option=SuperStreamCreationOption(n_partitions=3),
        )
        async with producer:
            for i in range(count):
                await producer.send(_message(i, f"customer-{i % 37}"))
        return await _consume_all(port, name, count)

    seen = asyncio.run(main())
    assert sorted(seen) == sorted(f"m-{i}" for i in range(count))
    assert all(len(where) == 1 for where in seen.values())  # each read once
    per_partition = {p: sum(1 for w in seen.values() if w == [p]) for p in _names(name, 3)}
    assert all(n > 0 for n in per_partition.values()), per_partition  # the client spread them
    # the same key always went to the same partition (the client's hash, not the server's)
    by_key: dict[str, set[str]] = {}
    for i in range(count):
        by_key.setdefault(f"customer-{i % 37}", set()).update(seen[f"m-{i}"])
    assert all(len(parts) == 1 for parts in by_key.values())


def _names(name: str, n: int) -> list[str]:
    return [f"{name}-{i}" for i in range(n)]


def test_rstream_super_stream_producer_routing_by_key(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    """Key routing asks Route. rstream 1.1.1 caches the first Route answer for every later
    key (``DefaultSuperstreamMetadata.routes``), so one producer per key here."""
    port, name = session_tierlog_server.stream_port, "ss-rs-key"
    keys = ["eu", "us", "apac"]

    async def main() -> dict[str, list[str]]:
        option = SuperStreamCreationOption(n_partitions=0, binding_keys=keys)
        for n, key in enumerate(keys):
            producer = SuperStreamProducer(
                HOST,
                port,
                username="guest",
                password="guest",
                super_stream=name,
                routing_extractor=_key,
                routing=RouteType.Key,
                super_stream_creation_option=option if n == 0 else None,
            )
            async with producer:
                for i in range(20):
                    await producer.send(_message(100 * n + i, key))
        return await _consume_all(port, name, 60)

    seen = asyncio.run(main())
    assert len(seen) == 60
    for n, key in enumerate(keys):
        assert all(seen[f"m-{100 * n + i}"] == [f"{name}-{key}"] for i in range(20))


def test_a_creation_cut_short_converges_when_asked_again(tmp_path: Path) -> None:
    """A crash after the entry was written ``creating`` and one partition made: the same
    CreateSuperStream resumes (keeps the partition, makes the others, answers OK); Route
    and Partitions ignore the entry until then. A half-done creation is also removed by
    DeleteSuperStream."""
    config = "[tier]\nenabled = false\n"
    data = tmp_path / "data"
    with running_server(data, config_text=config) as server:
        raw = RawClient(HOST, server.stream_port, timeout=10)
        assert raw.handshake() == R.OK
        ask(raw, c.CreateRequest(raw.next_corr(), "cut-0", {}))  # made before the "crash"
        ask(raw, c.CreateRequest(raw.next_corr(), "gone-0", {}))
        raw.close()
    meta = SqliteMetaStore(str(data / "meta.db"))
    try:
        catalog = SuperStreamCatalog(meta)
        for name in ("cut", "gone"):
            parts = (f"{name}-0", f"{name}-1", f"{name}-2")
            record, resumed = catalog.begin_create(
                SuperStreamDefinition("/", name, parts, ("0", "1", "2"))
            )
            assert record.state == "creating" and not resumed
    finally:
        meta.close()
    with running_server(data, config_text=config) as server:
        raw = RawClient(HOST, server.stream_port, timeout=10)
        assert raw.handshake() == R.OK
        try:
            assert partitions(raw, "cut") == (R.STREAM_DOES_NOT_EXIST, [])
            assert route(raw, "cut", "0") == (R.STREAM_DOES_NOT_EXIST, [])
            # another definition under the name: taken
            assert create(raw, "cut", ["cut-0"], ["0"]) == R.STREAM_ALREADY_EXISTS
            assert create(raw, "cut", ["cut-0", "cut-1", "cut-2"], ["0", "1", "2"]) == R.OK
            assert partitions(raw, "cut") == (R.OK, ["cut-0", "cut-1", "cut-2"])
            parts = ["cut-0", "cut-1", "cut-2"]
            assert metadata_codes(raw, parts) == dict.fromkeys(parts, R.OK)
            # the other one deleted half-done: its partition and entry go
            assert delete(raw, "gone") == R.OK
            assert metadata_codes(raw, ["gone-0"]) == {"gone-0": R.STREAM_DOES_NOT_EXIST}
            assert create(raw, "gone", ["gone-0"], ["0"]) == R.OK
        finally:
            raw.close()
