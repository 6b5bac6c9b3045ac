"""The cluster parts of ``benches/cluster.py``: RF=3 ÷ RF=1 publish throughput and the
failover time, on three ``tierlog serve`` nodes of the multi-node test harness
(``tests/cluster/nodes.py``: one etcd namespace, one SeaweedFS prefix, loopback).

Both are measured or refused (``Refused``: the build has no harness, or the cluster will
not create a replicated stream); nothing is estimated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.plugins.seaweed import SeaweedServer
from tests.server.remote_ack_run import body, publish_for
from tests.server.test_inprocess import AsyncRawClient

from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish

METADATA_PERIOD = 0.1
"""The bench client re-queries Metadata this often while it has no leader."""


class Refused(Exception):
    """A part that cannot be measured in this build (the message says why)."""


def harness() -> ModuleType:
    try:
        from tests.cluster import nodes
    except ImportError as exc:
        raise Refused(f"the multi-node harness tests/cluster/nodes.py is not here ({exc})") from exc
    return nodes


async def leader_port(ports: list[int], stream: str) -> int | None:
    """The stream's leader's port as Metadata names it, asking each node in turn."""
    for port in ports:
        try:
            client = await AsyncRawClient.connect(port)
        except OSError:
            continue
        try:
            client.send(c.MetadataRequest(client.next_corr(), [stream]).encode())
            meta = await client.expect(c.MetadataResponse, timeout=2.0)
        except (OSError, ConnectionError, TimeoutError):
            continue
        finally:
            client.close()
        info = meta.streams[0]
        if info.response_code != ResponseCode.OK:
            continue
        for broker in meta.brokers:
            if broker.reference == info.leader_reference:
                return int(broker.port)
    return None


async def create(port: int, stream: str, arguments: dict[str, str], wait: float = 20.0) -> None:
    """Create a stream, retrying while the node does not know enough live nodes yet (each
    node learns the others from the directory scan after they start)."""
    deadline = time.monotonic() + wait
    while True:
        client = await AsyncRawClient.connect(port)
        try:
            response = await client.request(c.CreateRequest(client.next_corr(), stream, arguments))
        finally:
            client.close()
        if response.response_code == ResponseCode.OK:
            return
        if time.monotonic() > deadline:
            raise Refused(
                f"the cluster would not create {stream!r} with {arguments} "
                f"(response code {response.response_code})"
            )
        await asyncio.sleep(0.5)


def start_cluster(workdir: Path, etcd: str, seaweed: SeaweedServer) -> Any:
    nodes = harness()
    return nodes.Cluster(workdir, etcd, seaweed, replicated=True).start()


def ports_of(cluster: Any) -> list[int]:
    return [n.process.stream_port for n in cluster.live()]


async def rf3_ratio(
    workdir: Path, etcd: str, seaweed: SeaweedServer, seconds: float, in_flight: int
) -> tuple[float, list[str]]:
    """Median over alternating rounds of (RF=3 confirmed/s) ÷ (RF=1 confirmed/s), same
    client; with the per-round lines."""
    cluster = start_cluster(workdir / "rf", etcd, seaweed)
    try:
        ports = ports_of(cluster)
        await create(ports[0], "rf1", {"x-initial-cluster-size": "1"})
        await create(ports[0], "rf3", {"x-initial-cluster-size": "3"})
        rounds = 3
        ratios, lines = [], []
        for r in range(rounds):
            rates = {}
            for stream in ("rf1", "rf3") if r % 2 == 0 else ("rf3", "rf1"):
                port = await leader_port(ports, stream)
                if port is None:
                    raise Refused(f"no leader for {stream!r}")
                started = time.monotonic()
                published = await publish_for(
                    port, stream, seconds / rounds, producer=f"{stream}-{r}", in_flight=in_flight
                )
                rates[stream] = len(published.confirmed) / (time.monotonic() - started)
            ratios.append(rates["rf3"] / rates["rf1"])
            lines.append(
                f"round {r}: rf1 {rates['rf1']:.0f} msg/s, rf3 {rates['rf3']:.0f} msg/s, "
                f"ratio {ratios[-1]:.3f}"
            )
        return statistics.median(ratios), lines
    finally:
        cluster.close()


@dataclass
class _Confirms:
    by_port: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, port)


async def _publish_through_metadata(
    ports: list[int], stream: str, stop: asyncio.Event, confirms: _Confirms
) -> None:
    """A publisher that finds the leader through Metadata (every 100 ms while it has
    none) and resends what was not confirmed after each reconnect."""
    seq = 1
    while not stop.is_set():
        port = await leader_port(ports, stream)
        if port is None:
            await asyncio.sleep(METADATA_PERIOD)
            continue
        try:
            client = await AsyncRawClient.connect(port)
        except OSError:
            await asyncio.sleep(METADATA_PERIOD)
            continue
        try:
            client.send(
                c.DeclarePublisherRequest(client.next_corr(), 1, "failover-bench", stream).encode()
            )
            declared = await client.expect(c.SimpleResponse, timeout=2.0)
            if declared.response_code != ResponseCode.OK:
                raise ConnectionError(f"declare refused: {declared.response_code}")
            while not stop.is_set():
                ids = range(seq, seq + 10)
                client.send(encode_publish(1, [(i, body(i)) for i in ids]))
                frame = await client.expect(PublishConfirm, timeout=1.0)
                confirms.by_port.append((time.monotonic(), port))
                seq = max(seq, max(frame.publishing_ids) + 1)
        except (OSError, ConnectionError, TimeoutError):
            await asyncio.sleep(METADATA_PERIOD)
        finally:
            client.close()


async def failover_s(
    workdir: Path, etcd: str, seaweed: SeaweedServer
) -> tuple[float, float, list[str]]:
    """(seconds from SIGKILL of the leader to the first confirm from another node, the
    lease TTL, notes)."""
    nodes = harness()
    cluster = start_cluster(workdir / "failover", etcd, seaweed)
    try:
        ports = ports_of(cluster)
        await create(ports[0], "failover", {"x-initial-cluster-size": "3"})
        stop = asyncio.Event()
        confirms = _Confirms()
        task = asyncio.create_task(_publish_through_metadata(ports, "failover", stop, confirms))
        await asyncio.sleep(3.0)  # steady publishing first
        old_port = await leader_port(ports, "failover")
        victim = next(n for n in cluster.live() if n.process.stream_port == old_port)
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.kill()
        deadline = killed_at + 10 * nodes.TTL
        first = None
        while first is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            first = next((t for t, p in confirms.by_port if t > killed_at and p != old_port), None)
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        if first is None:
            raise Refused(f"no confirm from a new leader within {10 * nodes.TTL:.0f} s")
        notes = [f"leader on port {old_port} killed; confirms before: {len(confirms.by_port)}"]
        return first - killed_at, float(nodes.TTL), notes
    finally:
        cluster.close()


def _stream_bytes(directory: Path) -> int:
    """Bytes of a stream directory's segment and index files (0 when it has none)."""
    if not directory.is_dir():
        return 0
    return sum(p.stat().st_size for p in directory.iterdir() if p.suffix in (".segment", ".index"))


async def catchup_chunks_per_s(
    workdir: Path, etcd: str, seaweed: SeaweedServer, chunks: int
) -> tuple[float, float, list[str]]:
    """(chunks/s a restarted member caught up ``chunks`` one-message chunks at, chunks/s
    the leader wrote them at, notes).

    A three-voter stream; one member (not the leader) is killed; the leader writes
    ``chunks`` one-message chunks (``tests/cluster/one_message_chunks.py``: producers
    with one message in flight each, so the log grows by one chunk per message at the
    leader's confirm rate); the member is restarted. Catch-up time runs from the
    member's ``cluster_stream_following`` log line (its log is open and it fetches) to
    the moment its segment and index files are as long as the leader's (checked every
    20 ms; compared byte for byte afterwards)."""
    from tests.cluster.one_message_chunks import publish_one_per_chunk

    nodes = harness()
    cluster = start_cluster(workdir / "catchup", etcd, seaweed)
    try:
        await nodes.create_replicated(cluster, "catchup", {"x-initial-cluster-size": "3"})
        leader, _ = cluster.leader_of("catchup")
        if leader is None:
            raise Refused("the catch-up stream has no leader")
        member = next(n for n in cluster.nodes if n != leader)
        port = cluster.node(leader).process.stream_port
        await publish_one_per_chunk(port, "catchup", 100, name="warm-up")
        incarnation = cluster.incarnation("catchup")
        theirs = cluster.node(leader).process.data_dir / "streams" / incarnation
        mine = cluster.node(member).process.data_dir / "streams" / incarnation
        deadline = time.monotonic() + 20
        while _stream_bytes(mine) != _stream_bytes(theirs) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        cluster.node(member).process.kill()
        written = await publish_one_per_chunk(port, "catchup", chunks, producers=32, name="away")
        target = _stream_bytes(theirs)
        cluster.node(member).process.start()
        deadline = time.monotonic() + max(120.0, 10 * written.seconds)
        while _stream_bytes(mine) < target and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        done = time.time()
        if _stream_bytes(mine) < target:
            raise Refused(f"the member did not catch up {chunks} chunks in time")
        following = [
            e
            for e in cluster.node(member).log_events("cluster_stream_following")
            if e.get("incarnation") == incarnation
        ]
        if not following:
            raise Refused("the member logged no cluster_stream_following")
        started = nodes.log_time(following[-1])
        if not nodes.same_files_as_leader(cluster, "catchup", member):
            raise Refused("the member's files differ from the leader's after catching up")
        seconds = done - started
        notes = [
            f"catchup: leader {leader} wrote {written.confirmed} one-message chunks in "
            f"{written.seconds:.1f} s ({written.per_second:.0f} chunks/s); member {member} "
            f"caught them up in {seconds:.2f} s ({chunks / seconds:.0f} chunks/s), "
            f"files byte-identical"
        ]
        return chunks / seconds, written.per_second, notes
    finally:
        cluster.close()
