"""Timer objects of an encrypted stream are sealed like every object the stream owns; one
that cannot be opened (a key the process does not hold) is repaired from the system stream."""

from __future__ import annotations

import collections
import glob
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.delayed.campaign import HOUR, T0
from tests.delayed.world import World
from tests.support.keyring import process_keyring
from tierlog.formats.encryption import SEALED_MAGIC
from tierlog.remote.encryption import Keyring, set_process_keyring
from tierlog.remote.settings import StreamSettings


@pytest.fixture
def keyring() -> Iterator[Keyring]:
    with process_keyring() as ring:
        yield ring


async def test_timer_objects_sealed_and_repaired_when_unopenable(
    tmp_path: Path, keyring: None
) -> None:
    world = World(str(tmp_path), T0)
    world.settings = StreamSettings(encryption="aes-256-gcm")
    scheduler = world.new_scheduler()
    await scheduler.rebuild()
    due = {}
    for pid in range(1, 41):
        body = f"secret-{pid}".encode()
        due[body] = world.publish("app", pid, 2 * HOUR + pid * 1000, body)
    world.clock.now += 1000
    await scheduler.tick()
    paths = glob.glob(os.path.join(str(tmp_path), "objects", "**", "*.timer*"), recursive=True)
    assert paths
    for path in paths:
        data = Path(path).read_bytes()
        assert data[:4] == SEALED_MAGIC and b"secret-" not in data
    set_process_keyring(Keyring([("other", bytes(32))]))  # the objects' key is gone
    while world.clock.now <= max(due.values()) + 60_000:
        world.clock.now += 60_000
        await scheduler.tick()
    counts = collections.Counter(world.target_bodies())
    assert set(counts) == set(due) and max(counts.values()) == 1
    assert world.metrics.value("tierlog_delayed_repairs_total", kind="timer_object") >= 1
    world.close()
