"""One soak run: the world started, the streams created, producers, consumers, the
resource sampler and (long profile) the Spark streaming query running while faults from
the seeded schedule come one after another; then the end-of-run oracle. Every failure is
collected into the result (by oracle, with the fault it came with) rather than raised, so
one run reports all it found. ``run_soak`` leaves nothing running or mounted."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster.nodes import create_replicated, free_port
from tests.plugins.seaweed import SeaweedServer
from tests.soak import checks
from tests.soak.consumers import SoakConsumer, read_all
from tests.soak.faults import FAULT_STEPS, FaultContext, FaultRecord, schedule
from tests.soak.producers import SoakProducer
from tests.soak.profile import Profile
from tests.soak.report import SoakResult
from tests.soak.resources import ResourceSampler
from tests.soak.spark_reader import StreamingRead, batch_read
from tests.soak.streams import StreamSpec, build_streams
from tests.soak.world import NAMES, SoakWorld

FAULT_TIMEOUT_S = 400.0
GROWTH_FLOOR = {"disk": 2 << 20, "rss": 32 << 20, "fds": 32, "threads": 8}
"""A ratio over the bound fails only with an absolute growth above this too: a client's
connections moving between nodes changes a few dozen fds, a leak keeps growing."""
END_RESERVE_S = 15.0  # no fault starts this close to the end


def consumer_roles(spec: StreamSpec) -> tuple[str, ...]:
    if spec.retained:
        return ()
    if spec.delayed:
        return ("leader",)
    if spec.replicas == 1:
        return ("leader", "non-member")
    if spec.kind == "rf3":
        return ("leader", "member")
    return ("member",)


async def run_soak(
    profile: Profile,
    workdir: Path,
    etcd_endpoint: str,
    seaweed: SeaweedServer,
    spark_factory: Callable[[], Any] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[SoakResult, str]:
    """The result and its text (table, failures, final line)."""
    result = SoakResult(catchup_bound_s=profile.catchup_bound_s)
    rng = random.Random(profile.seed)
    specs = build_streams(profile)
    result.streams = len(specs)
    started = time.time()
    world = SoakWorld(workdir, etcd_endpoint, seaweed, profile)
    if world.stale_mounts:
        progress(f"unmounted stale soak mounts: {world.stale_mounts}")
    sampler = ResourceSampler(world.cluster, world.mounts)
    stop_clients = False
    streaming: StreamingRead | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        for node in world.cluster.nodes.values():  # stable ports across restarts
            node.process.extra_env["TIERLOG_SERVER_PORT"] = str(free_port())
        await asyncio.to_thread(world.start)
        world.s3_errors("s3-errors" in profile.faults)
        single = ("n1", "n2")  # one-copy streams never on n3: it can always be wiped
        await asyncio.gather(  # each waits for the nodes to know each other: all at once
            *(
                create_replicated(
                    world.cluster,
                    spec.name,
                    spec.create_arguments,
                    on=single[i % 2] if spec.replicas == 1 else NAMES[i % 3],
                )
                for i, spec in enumerate(specs)
            )
        )
        progress(f"{len(specs)} streams created; faults {','.join(profile.faults)}")
        producers = {
            s.name: SoakProducer(world.cluster, s, random.Random(rng.random())) for s in specs
        }
        consumers = [
            SoakConsumer(
                world.cluster, s, role, random.Random(rng.random()), profile.consumer_restart_s
            )
            for s in specs
            for role in consumer_roles(s)
        ]
        for producer in producers.values():
            tasks.append(asyncio.create_task(producer.run(lambda: stop_clients)))
        consumers_stop = [False]
        for consumer in consumers:
            tasks.append(asyncio.create_task(consumer.run(lambda: consumers_stop[0])))
        sampler.start()
        spark = (  # off the loop: a JVM start takes seconds
            await asyncio.to_thread(spark_factory)
            if spark_factory and profile.spark != "off"
            else None
        )
        if spark is not None and profile.spark == "streaming":
            streaming = StreamingRead(spark, world, specs[0].name, workdir / "spark-checkpoint")
            streaming.start()
        ctx = FaultContext(world, specs, sampler, profile, rng)
        crashes = asyncio.create_task(_watch_crashes(ctx, result))
        windows: list[checks.Window] = []
        next_kind = schedule(rng, profile.faults)
        end = started + profile.seconds
        await asyncio.sleep(min(20.0, profile.seconds * 0.1))  # warm up before the first fault
        scheduled = {k for k in profile.faults if k in FAULT_STEPS}
        while scheduled and (
            time.time() < end - END_RESERVE_S
            or (profile.every_kind_once and scheduled - {f.kind for f in result.faults})
        ):
            record = FaultRecord(next_kind(), started=time.time())
            progress(f"{time.time() - started:5.0f}s {record.kind} starts")
            try:
                await asyncio.wait_for(FAULT_STEPS[record.kind](ctx, record), FAULT_TIMEOUT_S)
            except Exception as exc:
                record.problems.append(f"did not play out: {exc!r}"[:400])
            record.healed = time.time()
            windows.append(checks.Window(record.kind, record.started, record.healed))
            result.faults.append(record)
            if streaming is not None:
                streaming.poll()
            if not record.skipped:
                catchup, behind = await checks.measure_catchup(
                    world.cluster, specs, profile.catchup_bound_s
                )
                record.catchup_s = catchup
                if catchup is None:
                    record.problems.append(
                        f"not caught up in {profile.catchup_bound_s:.0f} s: {behind[:4]}"
                    )
            for problem in record.problems:
                result.fail(
                    "faults" if "did not play out" in problem else "catch-up",
                    f"{record.kind} on {record.target}: {problem}",
                )
            progress(
                f"{time.time() - started:5.0f}s {record.kind} on {record.target}:"
                f" catch-up {record.catchup_s} {record.skipped or record.problems or 'ok'}"
            )
            await asyncio.sleep(rng.uniform(*profile.fault_gap_s))
        while time.time() < end:
            await asyncio.sleep(1.0)
            if streaming is not None:
                streaming.poll()
        # -- the end: clients stop, faults off, everything read back ---------------------
        stop_clients = True
        stopped_at = time.time()
        world.s3_errors(False)
        crashes.cancel()
        await asyncio.sleep(3.0)
        # whole-stream retention (60 s) must not age the last messages out before the read
        retained_reads = await _read_everywhere(
            world, [s for s in specs if s.retained], producers, profile.read_timeout_s
        )
        last_due = max((max(p.due_ms.values(), default=0) for p in producers.values()), default=0)
        deadline = time.time() + profile.drain_s
        while time.time() < max(deadline, last_due / 1000 + 10):
            if all(_consumer_done(c, producers[c.spec.name]) for c in consumers):
                break
            await asyncio.sleep(1.0)
        consumers_stop[0] = True
        await asyncio.gather(*tasks, return_exceptions=True)
        catchup, behind = await checks.measure_catchup(
            world.cluster, specs, profile.catchup_bound_s
        )
        if catchup is None:
            result.fail("catch-up", f"at the end: {behind[:6]}")
        sampler.stop()
        await _final_reads(
            world,
            specs,
            producers,
            consumers,
            result,
            progress,
            retained_reads,
            windows,
            profile.read_timeout_s,
        )
        if spark is not None:
            await asyncio.to_thread(
                _spark_checks, spark, world, specs, producers, streaming, result, progress
            )
        result.growth = sampler.growth(started, stopped_at, profile.warmup_fraction)
        for metric, per_node in result.growth.items():
            for name, ratio in per_node.items():
                if (
                    ratio > profile.max_growth
                    and sampler.grew_by(metric, name) > GROWTH_FLOOR[metric]
                ):
                    result.fail(
                        "resources", f"{metric} on {name} grew {ratio:.2f}x (last ÷ first quarter)"
                    )
        if not any(result.growth.get(m) for m in ("disk", "rss")):
            result.fail("resources", "too few samples to judge growth")
        if "s3-errors" in profile.faults:  # first: a fault window of its own wins
            windows.insert(0, checks.Window("s3-errors", started, stopped_at))
        result.logs = checks.scan_logs(world.cluster, windows, started)
        for line in result.logs.stalls:
            result.fail("watchdog", line)
        for event, lines in checks.by_event(result.logs.unexplained).items():
            result.fail("errors", f"no fault explains {event} x{len(lines)}, first: {lines[0]}")
        await _orphan_check(world, profile, windows, started, stopped_at, result, progress)
        result.counts.update(
            published=sum(p.next_id - 1 for p in producers.values()),
            producer_sessions=sum(p.sessions for p in producers.values()),
            refused_publishes=sum(p.refused for p in producers.values()),
            consumer_sessions=sum(c.sessions for c in consumers),
            consumer_resumes_checked=sum(c.resumes_checked for c in consumers),
            retention_dropped=result.tally.retention_dropped,
            s3_requests=world.proxy.requests,
            s3_faults_injected=dict(world.proxy.injected),
            peak_rss_mb={n: v >> 20 for n, v in sampler.peak("rss").items()},
            peak_disk_mb={n: v >> 20 for n, v in sampler.peak("disk").items()},
            growth={m: {n: round(v, 2) for n, v in d.items()} for m, d in result.growth.items()},
        )
    finally:
        stop_clients = True
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        if streaming is not None:
            with contextlib.suppress(Exception):
                streaming.stop()
        sampler.stop()
        await asyncio.to_thread(world.close)
    result.seconds = time.time() - started
    return result, result.text(started)


def _consumer_done(consumer: SoakConsumer, producer: SoakProducer) -> bool:
    top = max(producer.confirmed, default=0)
    seen = max((d.id for d in consumer.deliveries), default=0)
    if consumer.spec.delayed:
        return len({d.id for d in consumer.deliveries}) >= len(producer.confirmed)
    return seen >= top


async def _watch_crashes(ctx: FaultContext, result: SoakResult) -> None:
    """A node process that exits by itself is a finding; it is restarted so the run goes on."""
    while True:
        await asyncio.sleep(1.0)
        for node in ctx.cluster.nodes.values():
            proc = node.process.proc
            if proc is not None and proc.poll() is not None:
                tail = node.process.log_tail(600).replace("\n", " | ")
                result.fail("crashes", f"{node.name} exited with {proc.returncode}: {tail}")
                node.process.proc = None
                with contextlib.suppress(Exception):
                    await ctx.start_node(node)


async def _final_reads(
    world: SoakWorld,
    specs: list[StreamSpec],
    producers: dict[str, SoakProducer],
    consumers: list[SoakConsumer],
    result: SoakResult,
    progress: Callable[[str], None],
    already: dict[str, list[Any]],
    windows: list[checks.Window],
    read_timeout: float,
) -> None:
    """Every stream read whole through every node (members and not), and every live
    consumer's deliveries, against what its producer had confirmed."""

    rest = [s for s in specs if s.name not in already]
    reads_of = {**already, **await _read_everywhere(world, rest, producers, read_timeout)}
    for spec in specs:
        producer = producers[spec.name]
        reads = reads_of[spec.name]
        by_reader: dict[str, Any] = {}
        for node, got in zip(NAMES, reads, strict=True):
            if isinstance(got, Exception):
                result.fail("messages", f"{spec.name}: reading through {node}: {got!r}"[:300])
            elif spec.kind == "seg" and node not in world.cluster.members_of(spec.name):
                # a non-member serves a segment-mode stream from the remote tier, which
                # holds sealed segments once over the offload threshold: a prefix
                top = max((d.id for d in got), default=0)
                by_reader[f"read on {node} (non-member, offloaded part)"] = got
                result.counts[f"{spec.name}_not_offloaded_on_{node}"] = sum(
                    1 for i in producer.confirmed if i > top
                )
            else:
                by_reader[f"read on {node}"] = got
        for consumer in consumers:
            if consumer.spec is spec:
                by_reader_c = {f"consumer {consumer.role}": consumer.deliveries}
                gaps = checks.consumer_gaps(spec, producer, consumer.deliveries)
                if gaps:
                    result.fail("consumers", f"{consumer.reference}: {gaps} confirmed ids skipped")
                for problem in consumer.problems[:5]:
                    result.fail("consumers", f"{consumer.reference}: {_during(problem, windows)}")
                if spec.delayed:
                    by_reader.update(by_reader_c)
        tally = checks.tally(spec, producer, by_reader)
        tally.confirmed = len(producer.confirmed)
        result.tally.add(tally)
        for problem in tally.problems:
            result.fail("delayed" if spec.delayed else "messages", problem)
        progress(f"{spec.name}: confirmed {tally.confirmed}, read through {sorted(by_reader)}")


def _during(problem: str, windows: list[checks.Window]) -> str:
    """``problem`` with the faults whose windows (or the 30 s after) hold its ``at=``
    times."""
    kinds = [
        w.kind
        for t in re.findall(r"at=([0-9.]+)", problem)
        for w in windows
        if w.start - 1 <= float(t) <= w.end + 30
    ]
    return f"{problem} [faults around: {', '.join(dict.fromkeys(kinds)) or 'none'}]"


async def _read_everywhere(
    world: SoakWorld,
    specs: list[StreamSpec],
    producers: dict[str, SoakProducer],
    timeout: float,
) -> dict[str, list[Any]]:
    """stream -> what reading it whole through each node returned (or the error), all
    streams and nodes at once."""

    async def one(spec: StreamSpec, node: str) -> Any:
        confirmed = producers[spec.name].confirmed
        at_least = 0 if spec.retained else len(confirmed)
        through = max(confirmed, default=0) if spec.retained else 0
        try:
            return await read_all(
                world.cluster, node, spec.name, at_least, timeout=timeout, through_id=through
            )
        except Exception as exc:
            return exc

    every = await asyncio.gather(*(one(spec, n) for spec in specs for n in NAMES))
    return {
        spec.name: list(every[k * len(NAMES) : (k + 1) * len(NAMES)])
        for k, spec in enumerate(specs)
    }


def _spark_checks(
    spark: Any,
    world: SoakWorld,
    specs: list[StreamSpec],
    producers: dict[str, SoakProducer],
    streaming: StreamingRead | None,
    result: SoakResult,
    progress: Callable[[str], None],
) -> None:
    """Spark's reads against the producers: a batch read (tier + tail) of an RF-3 and an
    encrypted stream, and the streaming query's rows."""
    chosen = [s for s in specs if s.kind in ("rf3", "enc", "dict")][:3]
    for spec in chosen:
        try:
            got = batch_read(spark, world, spec.name, "n1")
        except Exception as exc:
            text = str(exc).strip().splitlines()
            result.fail("spark", f"batch read of {spec.name}: {' | '.join(text[-3:])}"[:600])
            continue
        tally = checks.tally(spec, producers[spec.name], {"spark batch": got})
        for problem in tally.problems:
            result.fail("spark", problem)
        progress(f"spark batch read of {spec.name}: {len(got)} rows")
    if streaming is not None:
        spec = specs[0]
        deadline = time.time() + 120
        top = max(producers[spec.name].confirmed, default=0)
        while time.time() < deadline and streaming.caught_up_to() < top:
            streaming.poll()
            time.sleep(2)
        streaming.stop()
        tally = checks.tally(
            spec, producers[spec.name], {"spark streaming": streaming.deliveries()}
        )
        for problem in tally.problems:
            result.fail("spark", problem)
        result.counts["spark_streaming_restarts"] = streaming.restarts
        if streaming.errors:
            result.counts["spark_streaming_errors"] = streaming.errors[:3]
        progress(
            f"spark streaming query: {len(streaming.deliveries())} rows,"
            f" {streaming.restarts} restarts"
        )


async def _orphan_check(
    world: SoakWorld,
    profile: Profile,
    windows: list[checks.Window],
    started: float,
    stopped_at: float,
    result: SoakResult,
    progress: Callable[[str], None],
) -> None:
    """Once the grace period passed, the bucket holds nothing no manifest references
    (polled for another grace period: deletions of the last faults may still be running)."""
    grace = profile.orphan_grace_s
    await asyncio.sleep(max(0.0, stopped_at + grace - time.time()))
    deadline = time.time() + grace + profile.orphan_poll_s
    while True:
        try:
            garbage, doubts = await asyncio.to_thread(
                checks.orphans, world.cluster, world.direct_object_uri, grace
            )
        except Exception as exc:
            result.fail("orphans", f"the bucket walk failed: {exc!r}"[:400])
            return
        if not garbage or time.time() > deadline:
            break
        await asyncio.sleep(5.0)
    result.orphans = [key for key, _ in garbage]
    for key, written in garbage[:10]:
        during = [w.kind for w in windows if w.start - 1 <= written <= w.end + 5]
        result.fail("orphans", f"{key} (written {written - started:.0f} s in, during {during})")
    for doubt in doubts:
        result.fail("orphans", f"manifest not walkable: {doubt}")
    progress(f"orphans: {len(garbage)}")
