"""A creation whose partition fails is rolled back (RabbitMQ's rollback operations): the
partitions made by it and the catalog entry go, and the same creation then succeeds. Run
on an in-process server whose broker refuses one partition (an injected disk error)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tierlog.remote.settings import StreamSettings
from tierlog.remote.super_streams import READY, SuperStreamDefinition
from tierlog.server.app import Server
from tierlog.server.broker import StreamHandle
from tierlog.server.config import ServerConfig, ServerSection, StorageSection
from tierlog.server.super_streams import super_streams_of

PARTS = ("rb-0", "rb-1", "rb-2")
DEFINITION = SuperStreamDefinition("/", "rb", PARTS, ("0", "1", "2"), {"max-age": "1h"})


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


async def test_a_failing_partition_rolls_the_creation_back(server: Server) -> None:
    broker = server.broker
    real = broker.create_stream
    made: list[str] = []

    async def disk_full_on_the_last(
        vhost: str, name: str, settings: StreamSettings
    ) -> StreamHandle:
        if name == PARTS[-1]:
            raise OSError(28, "No space left on device (injected)")
        made.append(name)
        return await real(vhost, name, settings)

    broker.create_stream = disk_full_on_the_last  # type: ignore[method-assign]
    super_streams = super_streams_of(broker)
    with pytest.raises(OSError):
        await super_streams.create(DEFINITION)
    assert made == list(PARTS[:2])  # two were made before the failure ...
    for partition in PARTS:  # ... and deleted again
        assert not await broker.exists("/", partition)
    assert await super_streams.get("/", "rb") is None  # the entry too: the name is free

    broker.create_stream = real  # type: ignore[method-assign]
    record = await super_streams.create(DEFINITION)
    assert (record.state, record.partitions) == (READY, PARTS)
    for partition in PARTS:
        assert await broker.exists("/", partition)
    assert broker.get("/", "rb-1") is not None
    assert broker.catalog.require("/", "rb-1").settings.max_age_seconds == 3600
