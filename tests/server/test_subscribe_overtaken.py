"""A position that cannot be served is refused once, with its reason, never in a loop.

A Subscribe at an offset retention already removed used to be accepted and then ended
by a MetadataUpdate; rstream answers a MetadataUpdate by subscribing again at the same
offset, so the consumer looped (accepted, told, again) for as long as it ran. Now the
Subscribe itself is refused (PRECONDITION_FAILED, the reason in the log); with
``x-tierlog-overtaken=skip`` it starts at the first available offset instead.
"""

from __future__ import annotations

import asyncio

import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType
from rstream.exceptions import PreconditionFailed

from tests.server.test_inprocess import (  # noqa: F401 - fixtures
    AsyncRawClient,
    _drop_oldest_segments,
    _make_segments,
    lag,
    server,
)
from tierlog.formats.chunk import decode_header
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType as WireOffsetType
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.server.app import Server


async def test_a_subscribe_below_the_first_offset_is_refused_at_once(server: Server) -> None:  # noqa: F811
    client = await AsyncRawClient.connect(server.stream_port)
    await _make_segments(server, client, "ov", 8)
    first = await _drop_oldest_segments(server, "ov", 2)
    assert first > 10
    at_zero = c.WireOffsetSpec(WireOffsetType.OFFSET, 5)
    for sub_id in (1, 2):  # asked again: the same answer, never accepted then ended
        answer = await client.request(
            c.SubscribeRequest(client.next_corr(), sub_id, "ov", at_zero, 1)
        )
        assert answer.response_code == ResponseCode.PRECONDITION_FAILED
    # at the first offset, or with ``skip``, it is served
    skip = {"x-tierlog-overtaken": "skip"}
    sub = c.SubscribeRequest(client.next_corr(), 3, "ov", at_zero, 1, skip)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    assert decode_header(bytes((await client.expect(Deliver)).chunk)).chunk_id == first
    at_first = c.WireOffsetSpec(WireOffsetType.OFFSET, first)
    sub = c.SubscribeRequest(client.next_corr(), 4, "ov", at_first, 1)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    client.close()


async def test_an_rstream_consumer_below_the_first_offset_does_not_loop(server: Server) -> None:  # noqa: F811
    client = await AsyncRawClient.connect(server.stream_port)
    await _make_segments(server, client, "ov", 8)
    await _drop_oldest_segments(server, "ov", 2)
    client.close()
    consumer = Consumer("127.0.0.1", port=server.stream_port, username="guest", password="guest")
    await consumer.start()
    got: list[int] = []

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        got.append(context.offset)

    try:
        spec = ConsumerOffsetSpecification(OffsetType.OFFSET, 5)
        with pytest.raises(PreconditionFailed):
            await consumer.subscribe("ov", on_message, offset_specification=spec)
        await asyncio.sleep(1.0)  # a looping client would subscribe again and again
        notified = server.metrics.value("tierlog_overtaken_consumers_total", action="notify")
        assert not notified
        assert got == []
    finally:
        await consumer.close()
