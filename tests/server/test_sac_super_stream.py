"""Single active consumer of super-stream partitions, through the connection glue (an
in-process server; the partition index comes from the ``SacCoordinator.partitions`` port
the super-stream catalog provides, here a fixed table): a second consumer takes over one
partition only after the first one stepped down — ConsumerUpdate(active=false), its
delivery stopped at once, its answer — and gets it back when the second one leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.server.test_inprocess import AsyncRawClient, _config
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import encode_publish
from tierlog.server.app import Server

PARTITIONS = {"inv-0": 0, "inv-1": 1}
NONE = c.WireOffsetSpec(OffsetType.NONE)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(_config(tmp_path))
    await srv.start()
    assert srv.broker is not None
    srv.broker.sac.partitions = lambda _vhost, _super, stream: PARTITIONS.get(stream)
    try:
        yield srv
    finally:
        await srv.stop()


async def _subscribe(client: AsyncRawClient, sid: int, stream: str) -> None:
    props = {"single-active-consumer": "true", "name": "app", "super-stream": "inv"}
    first = c.WireOffsetSpec(OffsetType.FIRST)
    answer = await client.request(
        c.SubscribeRequest(client.next_corr(), sid, stream, first, 50, props)
    )
    assert answer.response_code == ResponseCode.OK


async def _update(client: AsyncRawClient) -> c.ConsumerUpdateRequest:
    update: c.ConsumerUpdateRequest = await client.expect(c.ConsumerUpdateRequest)
    return update


async def _quiet(client: AsyncRawClient, seconds: float = 0.4) -> list[object]:
    """Frames the client gets within ``seconds`` (none expected)."""
    got: list[object] = []
    try:
        while True:
            got.append(await client.frame(seconds))
    except TimeoutError:
        return got


async def test_partitions_spread_and_step_down_before_the_hand_over(server: Server) -> None:
    producer = await AsyncRawClient.connect(server.stream_port)
    for pid, stream in enumerate(PARTITIONS, start=1):
        await producer.request(c.CreateRequest(producer.next_corr(), stream, {}))
        await producer.request(c.DeclarePublisherRequest(producer.next_corr(), pid, None, stream))
    a = await AsyncRawClient.connect(server.stream_port)
    b = await AsyncRawClient.connect(server.stream_port)
    for sid, stream in ((1, "inv-0"), (2, "inv-1")):  # a alone: active on both partitions
        await _subscribe(a, sid, stream)
        update = await _update(a)  # (read before the next request: ``expect`` skips frames)
        assert (update.subscription_id, update.active) == (sid, True)
        a.send(c.ConsumerUpdateResponse(update.correlation_id, ResponseCode.OK, NONE).encode())
    await _subscribe(b, 1, "inv-0")  # 0 % 2 = 0: stays with a
    await _subscribe(b, 2, "inv-1")  # 1 % 2 = 1: moves to b, a steps down first
    down = await _update(a)
    assert (down.subscription_id, down.active) == (2, False)
    producer.send(encode_publish(2, [(1, b"x")]))  # into inv-1 while nobody is active
    await producer.expect(c.PublishConfirm)
    assert await _quiet(b) == []  # not active before a answered
    assert not [f for f in await _quiet(a) if isinstance(f, Deliver) and f.subscription_id == 2]
    a.send(c.ConsumerUpdateResponse(down.correlation_id, ResponseCode.OK, NONE).encode())
    up = await _update(b)
    assert (up.subscription_id, up.active) == (2, True)
    b.send(c.ConsumerUpdateResponse(up.correlation_id, ResponseCode.OK, NONE).encode())
    deliver = await b.expect(Deliver)
    assert deliver.subscription_id == 2
    b.close()  # b leaves: inv-1 back to a at once
    back = await asyncio.wait_for(_update(a), 10)
    assert (back.subscription_id, back.active) == (2, True)
    for client in (a, producer):
        client.close()


async def test_partition_indexes_come_from_the_super_stream_catalog(tmp_path: Path) -> None:
    """Without a fixed table: the super stream created through the protocol places each
    partition in its group, so two consumers of a two-partition super stream are each
    active on one partition (0 % 2 and 1 % 2), not both on both as plain groups."""
    srv = Server(_config(tmp_path))
    await srv.start()
    try:
        admin = await AsyncRawClient.connect(srv.stream_port)
        created = await admin.request(
            c.CreateSuperStreamRequest(admin.next_corr(), "inv", ("inv-0", "inv-1"), ("0", "1"), {})
        )
        assert created.response_code == ResponseCode.OK
        a = await AsyncRawClient.connect(srv.stream_port)
        b = await AsyncRawClient.connect(srv.stream_port)
        for sid, stream in ((1, "inv-0"), (2, "inv-1")):
            await _subscribe(a, sid, stream)
            update = await _update(a)
            assert (update.subscription_id, update.active) == (sid, True)
            a.send(c.ConsumerUpdateResponse(update.correlation_id, ResponseCode.OK, NONE).encode())
        await _subscribe(b, 1, "inv-0")
        await _subscribe(b, 2, "inv-1")
        down = await _update(a)  # partition 1 moves to b: a steps down on it
        assert (down.subscription_id, down.active) == (2, False)
        a.send(c.ConsumerUpdateResponse(down.correlation_id, ResponseCode.OK, NONE).encode())
        up = await _update(b)
        assert (up.subscription_id, up.active) == (2, True)
        for client in (a, b, admin):
            client.close()
    finally:
        await srv.stop()
