"""The stepped-clock campaign shared by the CI test and ``scripts/delayed_campaign.py``:
messages with delays from 0 to 3 h published while the clock steps forward, crashes at
random moments and at every registered crash point, then the oracle: every accepted message
appended to the stream exactly once, none before its due time."""

from __future__ import annotations

import collections
import random
import time
from dataclasses import dataclass, field

from tests.delayed.world import Crash, World
from tests.faults.registry import CrashPoint, register_crash_point

HOUR = 3_600_000
T0 = 1_800_000_123_456  # inside an hour, not at its start

CRASH_POINTS = [
    register_crash_point(CrashPoint(f"delayed:{name}", description))
    for name, description in (
        ("before_system_append", "before a dispatch intent / cancel reaches the system stream"),
        ("after_intent", "dispatch intent committed, the append to the stream not made"),
        ("after_target_append", "appended to the stream, working set not updated"),
        ("after_timer_object", "timer object written, timer manifest not committed"),
        ("before_manifest_commit", "working set written (pull / park), manifest not committed"),
        ("fail_target", "the append to the stream fails half way (no crash)"),
    )
]


@dataclass
class Result:
    published: int = 0
    appended: int = 0
    crashes: int = 0
    crash_points: collections.Counter[str] = field(default_factory=collections.Counter)
    duplicates: int = 0
    missing: int = 0
    early: int = 0
    lateness_ms: list[int] = field(default_factory=list, repr=False)
    timer_objects: int = 0
    checkpoints: int = 0
    freed_segments: int = 0
    seconds: float = 0.0

    def lateness_p99_ms(self) -> int:
        values = sorted(self.lateness_ms)
        return values[int(len(values) * 0.99) - 1] if values else 0


async def run(root: str, messages: int, seed: int, crash_rate: float = 0.03) -> Result:
    rng = random.Random(seed)
    started = time.monotonic()
    world = World(root, T0)
    result = Result()
    due_of: dict[bytes, int] = {}
    scheduler = world.new_scheduler()
    await scheduler.rebuild()
    pid = 0
    end = T0 + 3 * HOUR
    steps_ms = (100, 500, 1000, 5000, 20_000, 60_000)

    async def restart() -> None:
        while True:
            world.crash()
            try:
                await world.new_scheduler().rebuild()
                return
            except Crash:
                continue

    while pid < messages or world.clock.now <= end + 2 * 60_000:
        if pid < messages and world.clock.now < end:
            burst = rng.randint(0, 2 * (messages // 500 + 1))
            if world.clock.now > end - 10 * 60_000:
                burst = messages - pid  # the rest before the last due time
            for _ in range(min(burst, messages - pid)):
                pid += 1
                body = f"msg-{pid}".encode()
                delay = rng.choice((0, rng.randint(0, 2000), rng.randint(0, end - world.clock.now)))
                due_of[body] = world.publish("app", pid, delay, body)
                if rng.random() < 0.05:  # a producer resending an accepted message
                    world.publish("app", pid, delay, body)
        world.clock.now += rng.choice(steps_ms)
        if rng.random() < crash_rate:
            point = rng.choice(CRASH_POINTS).name.split(":", 1)[1]
            world.armed.points = {point: rng.randint(0, 2)}
            result.crash_points[point] += 1
        try:
            assert world.scheduler is not None
            await world.scheduler.tick()
        except Crash:
            result.crashes += 1
            await restart()
        world.apply_floor()  # retention below the last checkpoint
        if rng.random() < crash_rate / 3:  # killed at a random moment between rounds
            result.crashes += 1
            await restart()
        if pid >= messages and world.clock.now > end and not world.armed.points:
            assert world.scheduler is not None
            if world.scheduler.state.count() == 0:
                break
    bodies = world.target_bodies()
    counts = collections.Counter(bodies)
    result.published = len(due_of)
    result.appended = len(bodies)
    result.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    result.missing = len(set(due_of) - set(counts))
    first_append: dict[bytes, int] = {}
    for at, body in world.appended:
        first_append.setdefault(body, at)
    for body, at in first_append.items():
        if at < due_of[body]:
            result.early += 1
        result.lateness_ms.append(at - due_of[body])
    result.timer_objects = int(world.metrics.value("tierlog_delayed_timer_objects_total"))
    result.checkpoints = int(world.metrics.value("tierlog_delayed_checkpoints_total"))
    result.freed_segments = world.freed_segments
    result.seconds = time.monotonic() - started
    world.close()
    return result
