"""Two ``tierlog serve`` nodes with every outbound and node-to-node connection secured:
replication links under mutual TLS (certificates of the cluster's own CA, on top of the
secret's proof) and the MetaStore on an etcd that speaks TLS only, wants a client
certificate and has authentication on. A stream replicated on both is published with
confirms and read back, exactly once and in order, through each node; the links are up
and nothing was refused."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import (
    STREAM_ARGS,
    Cluster,
    Publisher,
    create_replicated,
    oracle,
    read_stream,
    running_cluster,
)
from tests.plugins.etcd import etcd_tls_uri
from tests.plugins.seaweed import SeaweedServer
from tests.server.certificates import make_node_certificates

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

STREAM = "secured"


@pytest.fixture
def cluster(tmp_path: Path, etcd_tls_server, seaweed: SeaweedServer) -> Iterator[Cluster]:
    endpoint, etcd_tls = etcd_tls_server
    certs = make_node_certificates(tmp_path / "node-certs", ("n1", "n2"))

    def node_config(name: str) -> str:
        cert, key = certs.nodes[name]
        return f'tls_certfile = "{cert}"\ntls_keyfile = "{key}"\ntls_cafile = "{certs.ca}"\n'

    with running_cluster(
        tmp_path,
        endpoint,
        seaweed,
        names=("n1", "n2"),
        replicated=True,
        meta_uri=lambda ep, namespace: etcd_tls_uri(ep, etcd_tls, namespace),
        node_config=node_config,
    ) as cluster:
        yield cluster


def _metric(cluster: Cluster, node: str, name: str) -> list[str]:
    request = urllib.request.Request(
        cluster.node(node).process.admin_url + "/metrics",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(name)]


async def test_replication_under_mutual_tls_with_etcd_over_tls_and_auth(cluster: Cluster):
    await create_replicated(cluster, STREAM, {**STREAM_ARGS, "x-initial-cluster-size": "2"})
    assert set(cluster.members_of(STREAM)) == {"n1", "n2"}
    publisher = Publisher(cluster, STREAM)
    await asyncio.wait_for(publisher.run(lambda: False, limit=300), 60)
    assert len(publisher.confirmed) >= 300
    for node in ("n1", "n2"):
        port = cluster.node(node).process.stream_port
        got = await read_stream(port, STREAM, len(publisher.confirmed), pinned=True)
        assert oracle(publisher.confirmed, got) == [], node
    deadline = time.monotonic() + 10
    while True:
        up = _metric(cluster, "n1", "tierlog_cluster_link_up")
        if any(line.endswith(" 1.0") for line in up) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert any('peer="n2"' in line and line.endswith(" 1.0") for line in up), up
    for node in ("n1", "n2"):
        refused = _metric(cluster, node, "tierlog_cluster_link_refusals_total")
        assert refused and all(line.endswith(" 0.0") for line in refused), refused
