"""A stream from before the cluster: a single node (no ``[cluster]`` table) wrote and
confirmed messages, crashed before tiering them (its untiered tail is only on its disk),
and is then brought back as a node of a cluster whose other node started first.

The node that holds the stream's local log leads it first: the new node, which has no
copy, neither opens the stream nor registers it (it never continues past the remote
tail while another node holds an untiered tail), and clients get a retriable refusal
until the original node joins. Oracle: every message the single node confirmed is read
back through the new node once the original leads.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    TTL,
    Cluster,
    Publisher,
    oracle,
    read_stream,
    wait_for,
)
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tierlog.cluster.membership import ClusterDirectory

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "legacy"
ARGS = {  # nothing is tiered before the crash: one fragment per 64 MiB or per hour
    "x-tierlog-fragment-bytes": str(64 << 20),
    "x-tierlog-max-fragment-age": "3600s",
}


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: str, seaweed: SeaweedServer) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_server, seaweed, names=("n1", "n2"))
    try:
        yield cluster
    finally:
        cluster.close()


async def test_the_node_holding_a_pre_cluster_streams_log_leads_it_first(
    cluster: Cluster,
) -> None:
    n1, n2 = cluster.node("n1"), cluster.node("n2")
    # n1 as the single node it was: the same stores and data directory, no [cluster]
    single = TierlogServerProcess(
        n1.process.data_dir,
        config_text=n1.process.config_text.split("[cluster]")[0],
        env=cluster.env,
    )
    single.start()
    try:
        n1.process.stream_port = single.stream_port  # the publisher finds it "live"
        n1.process.proc = single.proc
        from rstream import Producer

        async with Producer(
            "127.0.0.1", port=single.stream_port, username="guest", password="guest"
        ) as producer:
            await producer.create_stream(STREAM, arguments=ARGS)
        publisher = Publisher(cluster, STREAM)
        await asyncio.wait_for(publisher.run(lambda: len(publisher.confirmed) >= 200), 60)
        os.kill(single.proc.pid, signal.SIGKILL)  # before any tiering
    finally:
        single.kill()
        n1.process.proc = None
    incarnation = cluster.incarnation(STREAM)
    directory = ClusterDirectory(cluster.meta)
    # the cluster starts with the new node: it must not take the stream
    n2.process.start()
    await asyncio.sleep(4 * 0.3 + 1.0)  # start-up opening and a few directory scans
    assert directory.stream(incarnation) is None, "n2 registered a stream it does not hold"
    assert not (n2.process.data_dir / "streams" / incarnation).exists()
    assert n2.log_events("cluster_stream_awaits_its_local_log")
    # the original node joins: it leads, from its own log, the untiered tail included
    n1.process.start()
    await wait_for(lambda: cluster.leader_of(STREAM)[0] == "n1", 3 * TTL, "n1 leads its stream")
    read = await read_stream(n2.process.stream_port, STREAM, len(publisher.confirmed))
    assert oracle(publisher.confirmed, read) == []
    assert directory.require_stream(incarnation).membership.voters == ("n1",)
