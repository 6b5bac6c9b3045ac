"""The long randomized version of the cluster fault tests: three ``tierlog serve`` nodes
(each reaching etcd through its own proxy), one stream led by ``n1``, an ``rstream``
named producer publishing throughout, and one fault per cycle at a random moment:
SIGKILL of the leader, SIGSTOP of the leader past its lease, the leader cut from etcd
past its lease, or SIGKILL of a node that does not lead the stream. After each cycle the
leader must lead again in a higher epoch; at the end the oracle of ``tests/cluster/nodes``
checks every confirmed message (exactly once, in order), the manifest pointer (never
back), and that no confirm arrived while the leader could have been deposed.

Used by ``scripts/cluster_nodes_campaign.py``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rstream import Producer

from tests.cluster.nodes import (
    DRIFT,
    HOST,
    STREAM_ARGS,
    TTL,
    Cluster,
    PointerWatch,
    Publisher,
    oracle,
    read_stream,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer

STREAM = "campaign"
FAULTS = ("kill-leader", "pause-leader", "cut-leader-from-etcd", "kill-other-node")


@dataclass
class NodesCampaignResult:
    cycles: int = 0
    faults: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FAULTS})
    confirmed: int = 0
    read_back: int = 0
    member_reads: int = 0  # whole-stream reads pinned to one member (three-member mode)
    refused_publishes: int = 0
    publisher_sessions: int = 0
    epochs: int = 0
    pointer_samples: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


async def run_nodes_campaign(
    workdir: Path, etcd_endpoint: str, s3: SeaweedServer, cycles: int, seed: int
) -> NodesCampaignResult:
    rng = random.Random(seed)
    result = NodesCampaignResult()
    started = time.monotonic()
    cluster = Cluster(workdir, etcd_endpoint, s3, proxied_etcd=True).start()
    try:
        port = cluster.node("n1").process.stream_port
        async with Producer(HOST, port=port, username="guest", password="guest") as producer:
            await producer.create_stream(STREAM, arguments=STREAM_ARGS)
        watch = PointerWatch(cluster.meta, cluster.incarnation(STREAM))
        publisher = Publisher(cluster, STREAM)
        no_confirm_windows: list[tuple[float, float]] = []
        for _ in range(cycles):
            fault = rng.choice(FAULTS)
            _, epoch = cluster.leader_of(STREAM)
            await _publish_for(publisher, rng.uniform(0.3, 1.5))
            n1 = cluster.node("n1")
            fault_done = asyncio.Event()
            if fault == "kill-leader":
                n1.process.kill()
                await asyncio.sleep(rng.uniform(0.0, TTL))
                n1.process.start()
            elif fault == "kill-other-node":
                other = cluster.node(rng.choice(("n2", "n3")))
                other.process.kill()
                await _publish_for(publisher, rng.uniform(0.5, 2.0))
                other.process.start()
            elif fault == "pause-leader":
                os.kill(n1.pid, signal.SIGSTOP)
                await _publish_until(publisher, fault_done, TTL + rng.uniform(0.5, 3.0))
                woke = time.time()
                os.kill(n1.pid, signal.SIGCONT)
                no_confirm_windows.append((woke, await _led_again(cluster, epoch)))
            else:
                proxy = n1.etcd_proxy
                assert proxy is not None
                cut = time.time()
                proxy.cut()
                await _publish_until(publisher, fault_done, TTL + rng.uniform(0.5, 3.0))
                proxy.heal()
                no_confirm_windows.append(
                    (cut + TTL - DRIFT + 0.5, await _led_again(cluster, epoch))
                )
            if fault != "kill-other-node":
                await _led_again(cluster, epoch)
            result.faults[fault] += 1
            result.cycles += 1
        total = len(publisher.confirmed) + 100
        await asyncio.wait_for(publisher.run(lambda: False, limit=total), 120)
        port = cluster.node("n1").process.stream_port  # n1 was restarted (new port)
        read = await read_stream(port, STREAM, total, timeout=60)
        watch.stop()
        result.problems += oracle(publisher.confirmed, read)
        result.problems += watch.regressions()
        for start, end in no_confirm_windows:
            late = [i for i, t in publisher.confirm_times.items() if start <= t < end]
            if late:
                result.problems.append(f"{len(late)} confirms while deposed in {start}..{end}")
        result.confirmed = len(publisher.confirmed)
        result.read_back = len(read)
        result.refused_publishes = publisher.refused
        result.publisher_sessions = publisher.sessions
        result.epochs = cluster.leader_of(STREAM)[1]
        result.pointer_samples = len(watch.samples)
    finally:
        cluster.close()
    result.seconds = time.monotonic() - started
    return result


async def _publish_for(publisher: Publisher, seconds: float) -> None:
    end = time.monotonic() + seconds
    await asyncio.wait_for(publisher.run(lambda: time.monotonic() > end), seconds + 30)


async def _publish_until(publisher: Publisher, done: asyncio.Event, seconds: float) -> None:
    await _publish_for(publisher, seconds)
    done.set()


async def _led_again(cluster: Cluster, epoch: int) -> float:
    """Wait until n1 leads in an epoch above ``epoch``; the wall time it was seen."""

    def led() -> bool:
        leader, now_epoch = cluster.leader_of(STREAM)
        return leader == "n1" and now_epoch > epoch

    await wait_for(led, 6 * TTL, "n1 leads again in a higher epoch")
    return time.time()
