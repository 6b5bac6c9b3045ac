"""The timer manifest is fenced like the stream manifest: by the stream's writer epoch.

Two writers of one stream's timer manifest, epochs 1 and 2: once epoch 2 committed, every
commit (and load) of epoch 1 is refused with ``EpochFencedError`` — whether its version is
stale or current — and changes nothing; a scheduler of epoch 1 stops (deposed). On a single
node the timer store's epoch is the stream log's epoch."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rstream import AMQPMessage, Producer

from tests.delayed.world import INCARNATION, LogPort, World
from tierlog.delayed.scheduler import Scheduler, SchedulerConfig
from tierlog.delayed.timers import TimerManifest, TimerStore, manifest_key
from tierlog.server.app import Server
from tierlog.storage.errors import EpochFencedError

HOUR_MS = 3_600_000
NOW_MS = 1_000 * HOUR_MS + 1_000


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(str(tmp_path), NOW_MS, horizon_ms=60_000)
    try:
        yield w
    finally:
        w.close()


def store(world: World, epoch: int) -> TimerStore:
    return TimerStore(world.objects, world.meta, "", INCARNATION, epoch, settings=world.settings)


def scheduler(world: World, epoch: int) -> Scheduler:
    return Scheduler(
        "/",
        "orders",
        INCARNATION,
        LogPort(world),
        os.path.join(world.root, f"working-{epoch}"),
        world.metrics,
        config=SchedulerConfig(
            horizon_ms=world.horizon_ms,
            batch_limit=200,
            tick_seconds=0.01,
            park_interval_seconds=0,
            housekeeping_seconds=0,
        ),
        timers=store(world, epoch),
        clock=world.clock,
        reference=world.clock,
    )


def test_lower_epoch_commit_after_a_higher_one_is_refused_and_changes_nothing(
    world: World,
) -> None:
    old, new = store(world, 1), store(world, 2)
    mine = old.commit(TimerManifest(hours={1_005: ["a"]}, parked_through=3))
    theirs = new.load_manifest()
    theirs.hours[1_006] = ["b"]
    theirs = new.commit(theirs)
    before = world.meta.get(manifest_key(INCARNATION))
    assert before is not None and before.epoch == 2

    mine.hours[1_007] = ["c"]
    with pytest.raises(EpochFencedError):  # stale version: still the epoch decides
        old.commit(mine)
    current = TimerManifest(hours={1_007: ["c"]}, version=theirs.version)
    with pytest.raises(EpochFencedError):  # current version: the MetaStore's epoch check
        old.commit(current)
    with pytest.raises(EpochFencedError):  # creating it again is refused the same way
        old.commit(TimerManifest(hours={1_007: ["c"]}))
    with pytest.raises(EpochFencedError):  # a deposed writer does not adopt the new one's
        old.load_manifest()
    assert world.meta.get(manifest_key(INCARNATION)) == before

    theirs.hours[1_008] = ["d"]
    assert new.commit(theirs).version > before.version  # the newer epoch goes on


async def test_scheduler_of_a_lower_epoch_stops_when_fenced(world: World) -> None:
    world.publish("p", 1, 3 * HOUR_MS, b"first")  # due beyond the horizon: parked
    first = scheduler(world, 1)
    await first.rebuild()
    await first.tick()
    committed = first.timers.load_manifest() if first.timers else None
    assert committed is not None and committed.hours  # epoch 1 committed its manifest

    second = scheduler(world, 2)  # the stream's next leader
    await second.rebuild()
    world.publish("p", 2, 4 * HOUR_MS, b"second")
    await second.tick()
    after_second = world.meta.get(manifest_key(INCARNATION))
    assert after_second is not None and after_second.epoch == 2

    world.publish("p", 3, 5 * HOUR_MS, b"third")  # epoch 1 would park it: a commit
    first.start()
    assert first._task is not None
    await asyncio.wait_for(asyncio.shield(first._task), 5)  # its rounds end by themselves
    assert first.deposed is not None and "EpochFencedError" in first.deposed
    assert first.status()["deposed"] == first.deposed
    assert world.meta.get(manifest_key(INCARNATION)) == after_second

    await second.tick()  # the leader parks the third message itself
    manifest = world.meta.get(manifest_key(INCARNATION))
    assert manifest is not None and manifest.epoch == 2
    assert manifest.version > after_second.version
    await first.stop()
    await second.stop()


async def test_single_node_timer_epoch_is_the_stream_logs_epoch(tmp_path: Path) -> None:
    """The log's epoch (3, set in config) differs from ``tier.epoch`` (1): the timer store
    follows the log, like the stream manifest's committer."""
    from tests.delayed.test_server_inprocess import _config

    config = _config(tmp_path)
    config = replace(config, log=replace(config.log, epoch=3))
    assert config.tier.epoch == 1
    server = Server(config)
    await server.start()
    await server.streams_opened(10)
    try:
        p = Producer("127.0.0.1", port=server.stream_port, username="guest", password="guest")
        async with p:
            await p.create_stream("orders", arguments={"x-tierlog-delayed": "true"})
            await p.send_wait(
                "orders", AMQPMessage(body=b"late", application_properties={"x-delay": 7_200_000})
            )
        assert server.delayed is not None and server.broker is not None
        handle = server.broker.get("/", "orders")
        assert handle is not None
        for _ in range(200):
            sched = server.delayed.schedulers.get(("/", "orders"))
            stored = server.delayed.meta.get(manifest_key(handle.record.incarnation))
            if sched is not None and stored is not None:
                break
            await asyncio.sleep(0.05)
        assert sched is not None and sched.timers is not None and stored is not None
        assert sched.timers.epoch == handle.log.max_epoch == 3
        assert stored.epoch == 3
    finally:
        await server.stop()
