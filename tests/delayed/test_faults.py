"""The delayed file kinds of the fault registry x {bit flip, truncation, zero-filled page,
deleted}: on a world with messages in the working set, in parked timer objects and in pulled
hours, the damaged state is repaired from the system stream on restart or when read; every
accepted message is still appended exactly once and never before it is due."""

from __future__ import annotations

import collections
import os
import random
from pathlib import Path

import pytest

from tests.delayed.campaign import HOUR, T0
from tests.delayed.fault_kinds import KINDS, TIMER_MANIFEST
from tests.delayed.world import INCARNATION, World
from tests.faults.registry import DAMAGES, Target
from tierlog.delayed.timers import manifest_key

PAGE = 4096
OUTCOMES: collections.Counter[str] = collections.Counter()


async def build(root: str, rng: random.Random) -> tuple[World, dict[bytes, int]]:
    world = World(root, T0)
    due: dict[bytes, int] = {}
    scheduler = world.new_scheduler()
    await scheduler.rebuild()
    for pid in range(1, 301):
        body = f"msg-{pid}".encode()
        delay = rng.choice((rng.randint(0, 120_000), rng.randint(0, 4 * HOUR)))
        due[body] = world.publish("app", pid, delay, body)
    for _ in range(3):  # place (working set, parked objects), deliver the first ones
        world.clock.now += 30_000
        await scheduler.tick()
    return world, due


def damage(world: World, target: Target, how: str, rng: random.Random) -> None:
    if target.path == TIMER_MANIFEST:
        key = manifest_key(INCARNATION)
        stored = world.meta.get(key)
        assert stored is not None
        if how == "delete":
            world.meta.delete(key)
            return
        value = bytearray(stored.value)
        if how == "bitflip":
            value[rng.randrange(len(value))] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            value = value[: rng.randrange(len(value))]
        else:
            value = bytearray(len(value))
        world.meta.put_if(key, bytes(value), stored.version, 1)
        return
    if how == "delete":
        os.unlink(target.path)
        return
    size = os.path.getsize(target.path)
    pos = rng.randrange(target.start, max(target.start + 1, min(target.end, size)))
    if how == "truncate":
        os.truncate(target.path, pos)
        return
    with open(target.path, "r+b") as f:
        if how == "bitflip":
            f.seek(pos)
            byte = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        else:
            page = pos - pos % PAGE
            f.seek(page)
            f.write(bytes(min(PAGE, size - page)))


@pytest.mark.parametrize("example", range(int(os.environ.get("DELAYED_FAULT_EXAMPLES", "2"))))
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
async def test_delayed_state_damage_is_repaired(
    tmp_path: Path, kind: object, how: str, example: int
) -> None:
    rng = random.Random(f"{getattr(kind, 'name', '')}/{how}/{example}")
    world, due = await build(str(tmp_path), rng)
    targets = kind.locate(world)  # type: ignore[attr-defined]
    assert targets, f"no {kind} in the world"
    target = rng.choice(targets)
    repairs_before = sum(
        world.metrics.value("tierlog_delayed_repairs_total", kind=k)
        for k in ("working_set", "timer_object", "timer_manifest")
    )
    world.crash()  # damage found by a restarted scheduler (or when the object is read)
    damage(world, target, how, rng)
    scheduler = world.new_scheduler()
    await scheduler.rebuild()
    end = max(due.values()) + 2 * 300_000
    while world.clock.now <= end:
        world.clock.now += 300_000
        await scheduler.tick()
    bodies = world.target_bodies()
    counts = collections.Counter(bodies)
    assert set(counts) == set(due), "a message was lost"
    assert max(counts.values()) == 1, "a message was appended twice"
    for at, body in world.appended:
        assert at >= due[body], "appended before its due time"
    repairs = sum(
        world.metrics.value("tierlog_delayed_repairs_total", kind=k)
        for k in ("working_set", "timer_object", "timer_manifest")
    )
    OUTCOMES["repaired" if repairs > repairs_before else "intact"] += 1
    world.close()


def test_faults_were_repaired_not_ignored() -> None:
    """Runs after the matrix: some damage must have been found and repaired (a matrix whose
    damage never reached the scheduler would pass without testing anything)."""
    if not OUTCOMES:
        pytest.skip("run together with the matrix")
    print(dict(OUTCOMES))
    assert OUTCOMES["repaired"] >= OUTCOMES["intact"], dict(OUTCOMES)
