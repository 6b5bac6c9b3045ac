"""Delayed delivery's state is bounded by what is pending, through a running server with
the real ``rstream`` client: the system stream carries checkpoints, a restart replays only
what came since the last one, retention drops the records below it (local segments freed),
the delivered-id set is cleared at each checkpoint; and a stream whose name is as long as a
stream name may be gets a (hashed) system stream and delivers its scheduled messages."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rstream import AMQPMessage
from rstream.producer import ConfirmationStatus

from tests.delayed.test_server_inprocess import admin_async, collect, producer
from tierlog.delayed.records import Carry, Checkpoint, decode_system_record
from tierlog.log.errors import InvalidStreamNameError
from tierlog.log.names import MAX_DIR_NAME_BYTES, stream_dir_name
from tierlog.log.offset_spec import OffsetSpec
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection, TierSection
from tierlog.server.delayed_intake import (
    HASHED_SYSTEM_PREFIX,
    SYSTEM_PREFIX,
    is_system_stream,
    system_stream_name,
)
from tierlog.storage.object_store import MAX_SEGMENT_BYTES


def _config(tmp_path: Path, checkpoint_records: int, tiered: bool) -> ServerConfig:
    return replace(
        ServerConfig(),
        tier=replace(
            TierSection(),
            enabled=tiered,
            retention_interval_seconds=0.2,
            local_retention_interval_seconds=0.2,
        ),
        server=replace(
            ServerSection(),
            port=0,
            admin_port=0,
            heartbeat=0,
            delayed_checkpoint_records=checkpoint_records,
        ),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
    )


async def _started(
    tmp_path: Path, checkpoint_records: int = 100_000, tiered: bool = True
) -> Server:
    server = Server(_config(tmp_path, checkpoint_records, tiered))
    await server.start()
    await server.streams_opened(10)
    return server


async def _send(server: Server, stream: str, dues: list[int], first_pid: int) -> set[int]:
    confirmed: set[int] = set()

    async def on_confirm(status: ConfirmationStatus) -> None:
        if status.is_confirmed:
            confirmed.add(status.message_id)

    async with producer(server) as p:
        batch = []
        for k, due in enumerate(dues):
            message = AMQPMessage(
                body=f"msg-{first_pid + k}".encode(), application_properties={"x-deliver-at": due}
            )
            message.publishing_id = first_pid + k
            batch.append(message)
        for k in range(0, len(batch), 200):
            await p.send_batch(
                stream, batch[k : k + 200], publisher_name="app", on_publish_confirm=on_confirm
            )
        for _ in range(200):
            if len(confirmed) >= len(dues):
                break
            await asyncio.sleep(0.05)
    return confirmed


async def _status(server: Server, stream: str) -> dict[str, object]:
    code, body = await admin_async(server, "GET", f"/api/streams/{stream}/delayed")
    assert code == 200, body
    assert isinstance(body, dict)
    return body


async def _wait_scheduler(server: Server, stream: str) -> dict[str, object]:
    """The scheduler's status once it runs (rebuilt by the service's reconcile pass)."""
    for _ in range(200):
        code, body = await admin_async(server, "GET", f"/api/streams/{stream}/delayed")
        if code == 200:
            assert isinstance(body, dict)
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"the scheduler of {stream} did not start")


async def _wait_delivered(server: Server, stream: str, scheduled: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await _status(server, stream)
        if status["scheduled"] == scheduled and status["in_flight"] == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still scheduled: {await _status(server, stream)}")


def _system_records(server: Server, stream: str) -> list[tuple[int, object]]:
    assert server.broker is not None
    handle = server.broker.get("/", system_stream_name(stream))
    assert handle is not None
    with handle.log.reader(OffsetSpec.first()) as reader:
        return [(o, decode_system_record(r)) for o, r in reader.records()]


@pytest.mark.parametrize("tiered", [False, True], ids=["local", "tiered"])
async def test_checkpoints_bound_restart_and_retention_frees_the_system_stream(
    tmp_path: Path, tiered: bool
) -> None:
    """Without a remote tier the sealed local segments below the floor go; with one, the
    fragments below it are trimmed and the local segments below the new remote start
    follow (as for any trim)."""
    stream = "bounded"
    server = await _started(tmp_path, checkpoint_records=300, tiered=tiered)
    try:
        async with producer(server) as p:
            await p.create_stream(
                stream,
                arguments={
                    "x-tierlog-delayed": "true",
                    "stream-max-segment-size-bytes": "16384",
                    "x-tierlog-max-fragment-age": "1s",
                },
            )
        now = int(time.time() * 1000)
        pending_due = now + 3_600_000  # still pending at the end
        confirmed = await _send(server, stream, [pending_due] * 50, 1)
        assert len(confirmed) == 50
        for round_ in range(4):  # 4 x 400 due at once: delivered, checkpoints follow
            now = int(time.time() * 1000)
            first = 51 + 400 * round_
            assert len(await _send(server, stream, [now] * 400, first)) == 400
            await _wait_delivered(server, stream, 50, timeout=20)
        status = await _status(server, stream)
        assert int(str(status["checkpoint_through"])) > 0, status
        # the delivered-id set holds only what came since the last checkpoint
        assert int(str(status["finished_since_checkpoint"])) < 1600, status
        assert server.broker is not None
        system = server.broker.get("/", system_stream_name(stream))
        assert system is not None
        deadline = time.monotonic() + 20
        while system.log.segment_refs()[0].first_offset == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # retention frees segments below the floor
        first = system.log.segment_refs()[0].first_offset
        assert 0 < first <= int(str(status["checkpoint_through"]))
        records = _system_records(server, stream)
        assert any(isinstance(r, Checkpoint) for _o, r in records)
        assert sum(isinstance(r, Carry) for _o, r in records) >= 50
    finally:
        await server.stop()

    # a restart replays from the first offset left: the 50 pending ones are all there
    server = await _started(tmp_path, checkpoint_records=300, tiered=tiered)
    try:
        status = await _wait_scheduler(server, stream)
        assert status["scheduled"] == 50, status
        assert int(str(status["finished_since_checkpoint"])) < 1600
        got = await collect(server, stream, 1601, timeout=3)
        bodies = [b for _o, _t, b, _p in got]
        assert len(bodies) == len(set(bodies)) == 1600  # each delivered one once
    finally:
        await server.stop()


def _longest_name(vhost: str, dir_limit: int = MAX_DIR_NAME_BYTES) -> str:
    """The longest stream name that makes a legal stream directory in ``vhost`` of at most
    ``dir_limit`` bytes (a remote tier needs it to be a legal key segment too)."""
    name = "n" * MAX_DIR_NAME_BYTES
    while True:
        try:
            if len(stream_dir_name(vhost, name, time.time_ns())) <= dir_limit:
                return name
        except InvalidStreamNameError:
            pass
        name = name[:-1]


def test_every_legal_stream_name_has_a_system_stream() -> None:
    longest = _longest_name("/")
    hashed = system_stream_name(longest)
    assert hashed.startswith(HASHED_SYSTEM_PREFIX) and is_system_stream(hashed)
    stream_dir_name("/", hashed, time.time_ns())  # a legal stream name itself
    assert system_stream_name(longest[:-1]) != hashed
    # names that fit keep the name existing system streams have (upgrades find them)
    assert system_stream_name("orders") == SYSTEM_PREFIX + "orders"
    short = _longest_name("/", MAX_SEGMENT_BYTES)[: -len(SYSTEM_PREFIX)]
    assert system_stream_name(short) == SYSTEM_PREFIX + short
    assert system_stream_name(short + "x").startswith(HASHED_SYSTEM_PREFIX)


@pytest.mark.parametrize(
    ("tiered", "dir_limit"),
    [(False, MAX_DIR_NAME_BYTES), (True, MAX_SEGMENT_BYTES)],
    ids=["longest-legal-local", "longest-tierable"],
)
async def test_a_maximum_length_stream_name_schedules_and_delivers(
    tmp_path: Path, tiered: bool, dir_limit: int
) -> None:
    """Before hashed names, the system stream of such a stream could not be created (or, with
    a remote tier, not tiered): every scheduled publish was refused."""
    stream = _longest_name("/", dir_limit)
    assert system_stream_name(stream).startswith(HASHED_SYSTEM_PREFIX)
    server = await _started(tmp_path, tiered=tiered)
    try:
        async with producer(server) as p:
            await p.create_stream(stream, arguments={"x-tierlog-delayed": "true"})
        due = int(time.time() * 1000) + 1000
        confirmed = await _send(server, stream, [due, due], 1)
        assert confirmed == {1, 2}

        got = await collect(server, stream, 2, timeout=10)
        assert sorted(b for _o, _t, b, _p in got) == [b"msg-1", b"msg-2"]
        assert all(ts >= due for _o, ts, _b, _p in got)
        assert server.broker is not None
        assert server.broker.get("/", system_stream_name(stream)) is not None
        code, listing = await admin_async(server, "GET", "/api/streams")
        names = {s["name"] for s in listing["streams"]}
        assert stream in names and not any(is_system_stream(n) for n in names)
        code, _ = await admin_async(server, "DELETE", f"/api/streams/{stream}")
        assert code in (200, 204)
        deadline = time.monotonic() + 10
        while server.broker.get("/", system_stream_name(stream)) is not None:
            assert time.monotonic() < deadline, "the hashed system stream was not deleted"
            await asyncio.sleep(0.1)
    finally:
        await server.stop()
