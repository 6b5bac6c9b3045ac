"""The intake of a system stream: only the server's internal path writes one, and only
records a system stream holds get in (``ForeignRecordError`` otherwise, nothing appended);
the client path (``StreamHandle.submit_publish``) refuses reserved streams and references
as its last gate, even if a command forgot its check. A running in-process server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tierlog.delayed.errors import ForeignRecordError
from tierlog.delayed.records import (
    check_system_record,
    encode_cancel,
    encode_carry,
    encode_checkpoint,
    encode_dispatch,
    encode_schedule,
)
from tierlog.formats.chunk import simple_entry
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishBatch
from tierlog.remote.settings import StreamSettings
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection
from tierlog.server.delayed_intake import DISPATCHER_REFERENCE, HandlePort, system_stream_name


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    config = replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
    )
    srv = Server(config)
    await srv.start()
    await srv.streams_opened(10)
    try:
        yield srv
    finally:
        await srv.stop()


def test_what_a_system_stream_holds() -> None:
    for record in (
        encode_schedule(1, "app", 7, b"message"),
        encode_schedule(1, "", 0, b""),
        encode_dispatch(1, [b"\x01" * 16, b"\x02" * 16]),
        encode_cancel(b"\x03" * 16),
        # the scheduler's checkpoints: refused, every tick failed once a checkpoint was due
        encode_carry(5, b"\x04" * 16, 1, 0, False, b"message"),
        encode_carry(5, b"\x04" * 16, 1, 3, True, b""),
        encode_checkpoint(5, 8, 2),
    ):
        check_system_record(record)
    for foreign in (
        b"",
        b"an ordinary message",
        b"TLDS\x00",  # a schedule header cut short
        encode_schedule(1, "app", 7, b"")[:-1],
        encode_dispatch(1, [b"\x01" * 16])[:-1],
        encode_cancel(b"\x03" * 16) + b"x",
        b"TLDS" + b"\x00" * 8 + b"\x00\x02\xff\xfe" + b"\x00" * 8,  # reference not UTF-8
        encode_carry(5, b"\x04" * 16, 1, 0, False, b"")[:-1],  # a carry header cut short
        encode_carry(5, b"\x04" * 16, 1, 0, False, b"")[:-1] + b"\x02",  # unknown flags
        encode_checkpoint(5, 8, 2) + b"x",
        encode_checkpoint(5, 0, 2),  # next publishing id 0
    ):
        with pytest.raises(ForeignRecordError):
            check_system_record(foreign)


async def _submit(submit: object, batch: PublishBatch, reference: str | None) -> int:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    submit(batch, reference, future.set_result)  # type: ignore[operator]
    return await asyncio.wait_for(future, 10)


async def test_the_client_path_refuses_reserved_streams_and_references(server: Server) -> None:
    broker = server.broker
    assert broker is not None
    handle = await broker.create_stream("/", "orders", StreamSettings())
    system = await broker.create_stream("/", system_stream_name("orders"), StreamSettings())

    def batch(*bodies: bytes) -> PublishBatch:
        return PublishBatch(
            1, 1, list(range(1, len(bodies) + 1)), [simple_entry(b) for b in bodies], len(bodies)
        )

    assert await _submit(handle.submit_publish, batch(b"x"), DISPATCHER_REFERENCE) == (
        ResponseCode.ACCESS_REFUSED
    )
    assert await _submit(system.submit_publish, batch(b"x"), "app") == ResponseCode.ACCESS_REFUSED
    assert await _submit(system.submit_publish, batch(b"x"), None) == ResponseCode.ACCESS_REFUSED
    assert system.log.commit_point().next_offset == 0
    assert handle.log.producer_sequence(DISPATCHER_REFERENCE) is None
    # an ordinary publish, and the internal path under the reserved reference, go through
    assert await _submit(handle.submit_publish, batch(b"y"), "app") == ResponseCode.OK
    assert await _submit(handle.submit_internal, batch(b"z"), DISPATCHER_REFERENCE) == (
        ResponseCode.OK
    )
    assert handle.log.producer_sequence(DISPATCHER_REFERENCE) == 1


async def test_the_internal_path_refuses_a_foreign_record(server: Server) -> None:
    broker = server.broker
    assert broker is not None
    await broker.create_stream("/", "jobs", StreamSettings())
    system = await broker.create_stream("/", system_stream_name("jobs"), StreamSettings())
    port = HandlePort(broker, "/", "jobs")
    good = encode_cancel(b"\x05" * 16)
    with pytest.raises(ForeignRecordError):
        await port.append_system([good, b"an ordinary message"])
    assert system.log.commit_point().next_offset == 0  # nothing of the batch appended
    assert await port.append_system([good])
    checkpoint = [encode_carry(1, b"\x06" * 16, 9, 0, False, b"m"), encode_checkpoint(1, 2, 1)]
    assert await port.append_system(checkpoint)  # the scheduler's checkpoint gets in
    records, _ = port.read_system(0)
    assert [r for _o, r in records] == [good, *checkpoint]
