"""``ack = remote`` survives the loss of the node's disk: a single-replica stream on
SeaweedFS + etcd, ``tierlog serve`` killed with SIGKILL mid-publish, its data directory
deleted (only that: the object store and the MetaStore are elsewhere), restarted empty.
Every confirmed message is read back exactly once, in order, and the named producer's
sequence survives, so its resends are deduplicated."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.remote_ack_run import Published, check_oracle, create, publish_for, read_all
from tests.server.test_inprocess import AsyncRawClient
from tierlog.formats.protocol import commands as c

pytestmark = [pytest.mark.s3, pytest.mark.etcd]

STREAM = "remote-acked"
PRODUCER = "disk-loss-producer"
STREAM_ARGS = {
    "x-tierlog-ack": "remote",
    "x-tierlog-fragment-bytes": str(1 << 20),
    "stream-max-segment-size-bytes": "262144",
}


def remote_config(seaweed: SeaweedServer, etcd: str, prefix: str, extra: str = "") -> str:
    uri = f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}&region={seaweed.region}"
    return f"""
[storage]
object_store = "{uri}"
meta_store = "etcd://{etcd}/{prefix}"

[tier]
remote_ack_interval_seconds = 0.2
{extra}
"""


def s3_env(seaweed: SeaweedServer) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": seaweed.access_key, "AWS_SECRET_ACCESS_KEY": seaweed.secret_key}


@pytest.fixture
def remote_server(
    tmp_path: Path, seaweed: SeaweedServer, etcd_server: str
) -> Iterator[TierlogServerProcess]:
    prefix = f"ack-{uuid.uuid4().hex}"
    server = TierlogServerProcess(
        tmp_path / "node-data",
        config_text=remote_config(seaweed, etcd_server, prefix),
        env=s3_env(seaweed),
    )
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.kill()


async def test_confirmed_messages_survive_losing_the_data_directory(
    remote_server: TierlogServerProcess,
) -> None:
    server = remote_server.start()
    await create(server.stream_port, STREAM, STREAM_ARGS)
    published = Published()
    publishing = asyncio.create_task(
        publish_for(server.stream_port, STREAM, 10.0, producer=PRODUCER, state=published)
    )
    await asyncio.sleep(3.0)
    server.kill()  # mid-publish: the unconfirmed tail may or may not have been written
    await publishing
    assert len(published.confirmed) > 100
    last_confirmed = max(published.confirmed)

    shutil.rmtree(server.data_dir)  # the node's disk is gone; S3 and etcd are not
    assert not server.data_dir.exists()
    server.start()

    client = await AsyncRawClient.connect(server.stream_port)
    try:
        stored = await client.request(
            c.QueryPublisherSequenceRequest(client.next_corr(), PRODUCER, STREAM),
            c.QueryPublisherSequenceResponse,
        )
    finally:
        client.close()
    assert stored.sequence >= last_confirmed  # producer state came back from the remote tier

    # the producer resumes after its stored sequence; resends are deduplicated
    published.next_seq = int(stored.sequence) + 1
    await publish_for(server.stream_port, STREAM, 1.0, producer=PRODUCER, state=published)
    got = await read_all(server.stream_port, STREAM, quiet=2.0)
    assert check_oracle(published.confirmed, got) == []
    assert len(got) >= len(published.confirmed)
    print(f"remote-ack confirms: {len(published.confirmed)}, p99 {published.p99_ms():.0f} ms")
    assert published.p99_ms() < 5000
