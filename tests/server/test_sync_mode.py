"""The sync mode through the server: ``x-tierlog-sync`` per stream, confirms without
an fdatasync in ``os`` mode, with one in the default mode, bad values refused."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.server.test_inprocess import AsyncRawClient, _config
from tierlog.formats.chunk import decode_header
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.server.app import Server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(_config(tmp_path))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real: Callable[[int], None] = os.fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


async def _publish_confirmed(client: AsyncRawClient, stream: str, frames: int) -> None:
    declare = c.DeclarePublisherRequest(client.next_corr(), 1, "", stream)
    assert (await client.request(declare)).response_code == ResponseCode.OK
    for f in range(frames):
        client.send(encode_publish(1, [(f * 10 + k, b"m%d" % (f * 10 + k)) for k in range(10)]))
        confirm = await client.expect(PublishConfirm)
        assert sorted(confirm.publishing_ids) == [f * 10 + k for k in range(10)]


@pytest.mark.parametrize(("sync", "fsyncs"), [("os", False), ("fsync", True), (None, True)])
async def test_stream_sync_argument_sets_what_a_confirm_waits_for(
    server: Server, fdatasyncs: list[int], sync: str | None, fsyncs: bool
) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    arguments = {} if sync is None else {"x-tierlog-sync": sync}
    create = c.CreateRequest(client.next_corr(), "s", arguments)
    assert (await client.request(create)).response_code == ResponseCode.OK
    before = len(fdatasyncs)
    await _publish_confirmed(client, "s", 5)
    assert (len(fdatasyncs) > before) is fsyncs
    assert server.broker is not None
    handle = server.broker.get("/", "s")
    assert handle is not None
    log = handle.log
    assert log.committed_offset == 49  # confirmed = committed = readable, in every mode
    assert (log.durable_point() == log.commit_point()) is fsyncs
    sub = c.SubscribeRequest(client.next_corr(), 1, "s", c.WireOffsetSpec(OffsetType.FIRST), 100)
    assert (await client.request(sub)).response_code == ResponseCode.OK
    records = 0
    while records < 50:
        records += decode_header(bytes((await client.expect(Deliver)).chunk)).num_records
    assert records == 50
    client.close()


async def test_bad_sync_argument_is_refused(server: Server) -> None:
    client = await AsyncRawClient.connect(server.stream_port)
    create = c.CreateRequest(client.next_corr(), "bad", {"x-tierlog-sync": "sometimes"})
    assert (await client.request(create)).response_code != ResponseCode.OK
    assert server.broker is not None and server.broker.get("/", "bad") is None
    assert server.metrics.value("tierlog_consumer_buffer_bytes") == 0.0
    client.close()
