"""Three ``tierlog serve`` nodes with replication (one etcd, one SeaweedFS): the members
of a segment-offload stream (``tier_mode = segments``) free their disk too.

The leader offloads sealed segments whole and publishes its offloaded position to its
members (``TIERED``); each member deletes its local segments that the bucket holds as
offloaded segments once the stream's deletion lag has passed since it learned so (never
the segment holding its tail, never at or past the commit it learned). Published to
well past its local limit, every node's stream directory stays bounded throughout and
settles within the limit; every confirmed message still reads back, in order, through
each member and the leader (most of it from the bucket).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    STREAM_ARGS,
    TTL,
    Cluster,
    Publisher,
    ResumingReader,
    body,
    create_replicated,
    running_cluster,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

SEGMENT = int(STREAM_ARGS["stream-max-segment-size-bytes"])
THRESHOLD = SEGMENT
"""``offload_threshold_bytes``: the local bytes not offloaded yet that trigger an
offload (the open segment included)."""
LAG = 1.0
ARGS = {
    **STREAM_ARGS,
    "x-initial-cluster-size": "3",
    "x-tierlog-tier-mode": "segments",
    "x-tierlog-offload-threshold-bytes": str(THRESHOLD),
    "x-tierlog-offload-deletion-lag": f"{LAG:g}s",
}
ALLOWANCE = 768 << 10
"""Bytes a node may hold beyond the threshold and the open segment while publishing
runs: segments sealed but not offloaded yet (a pass every 0.2 s, one upload each), and
those offloaded within the last deletion lag (1 s of publishing) plus the time a member
takes to hear of an offload (a heartbeat) on a loaded machine."""
BOUND = THRESHOLD + SEGMENT + ALLOWANCE
SETTLED = THRESHOLD + 2 * SEGMENT
"""Once publishing stopped and the lag passed: what is not offloaded (at most the
threshold), the open segment, and the segment holding a member's tail."""
WRITTEN = 4 * BOUND


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    with running_cluster(tmp_path, etcd_server, seaweed, replicated=True) as cluster:
        yield cluster


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.exists() else 0


async def read_all(cluster: Cluster, node: str, stream: str, last: int) -> list[int]:
    """Ids read through ``node`` itself (pinned) from the stream's first offset."""
    reader = ResumingReader(cluster.node(node).process.stream_port, stream)
    await reader.run(lambda: last in reader.ids)
    return reader.ids


async def test_members_of_a_segment_offload_stream_free_their_offloaded_segments(
    cluster: Cluster,
) -> None:
    stream = "offloaded-everywhere"
    await create_replicated(cluster, stream, ARGS)
    incarnation = cluster.incarnation(stream)
    assert cluster.leader_of(stream)[0] == "n1"
    dirs = {n: cluster.node(n).process.data_dir / "streams" / incarnation for n in cluster.nodes}
    publisher = Publisher(cluster, stream, batch=100)
    largest = dict.fromkeys(cluster.nodes, 0)

    def written() -> int:
        return len(publisher.confirmed) * len(body(1))

    while written() < WRITTEN:
        target = len(publisher.confirmed) + 1000
        await asyncio.wait_for(
            publisher.run(lambda target=target: len(publisher.confirmed) >= target),  # type: ignore[misc]
            30,
        )
        for name, path in dirs.items():
            largest[name] = max(largest[name], dir_bytes(path))
    assert all(size <= BOUND for size in largest.values()), (largest, written(), BOUND)
    assert all(path.exists() for path in dirs.values())

    last = max(publisher.confirmed)
    assert sorted(publisher.confirmed) == list(range(1, last + 1))
    started = time.monotonic()
    reads = await asyncio.wait_for(
        asyncio.gather(*(read_all(cluster, n, stream, last) for n in sorted(cluster.nodes))),
        3 * TTL,
    )
    for name, got in zip(sorted(cluster.nodes), reads, strict=True):
        assert got == list(range(1, last + 1)), name  # every confirmed one, in order
    read_seconds = time.monotonic() - started

    def settled() -> bool:
        return all(dir_bytes(path) <= SETTLED for path in dirs.values())

    await wait_for(settled, 3 * TTL, f"every node within {SETTLED} bytes")
    for name in ("n2", "n3"):
        freed = cluster.node(name).log_events("member_local_segments_freed")
        assert freed, name
        assert all(e.get("mode") == "segments" for e in freed), name
    print(
        f"written={written()} largest={largest} bound={BOUND} settled<={SETTLED} "
        f"read_all_three_s={read_seconds:.1f}"
    )
