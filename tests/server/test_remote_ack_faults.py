"""``ack = remote`` while the object store misbehaves (``tierlog serve`` behind the S3
fault proxy, etcd as MetaStore): confirms keep coming through transient faults, stop
while the store refuses everything and resume once it answers again; then the node's
data directory is lost and every confirmed message is still there."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

import pytest

from tests.plugins.s3_fault_proxy import FaultProxy
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.remote_ack_run import Published, body, check_oracle, create, publish_for, read_all
from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_remote_ack_disk_loss import s3_env
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish

pytestmark = [pytest.mark.s3, pytest.mark.etcd]

STREAM = "remote-acked-faults"
PRODUCER = "faults-producer"


def proxied_config(seaweed: SeaweedServer, proxy: FaultProxy, etcd: str, prefix: str) -> str:
    uri = f"s3://{seaweed.bucket}/{prefix}?endpoint={proxy.endpoint}&region={seaweed.region}"
    return f"""
[storage]
object_store = "{uri}"
meta_store = "etcd://{etcd}/{prefix}"

[store]
max_attempts = 4
base_delay_seconds = 0.02
max_delay_seconds = 0.2
startup_deadline_seconds = 60

[tier]
remote_ack_interval_seconds = 0.2
"""


async def test_confirms_follow_the_object_store(
    tmp_path: Path, seaweed: SeaweedServer, s3_fault_proxy: FaultProxy, etcd_server: str
) -> None:
    prefix = f"ackfault-{uuid.uuid4().hex}"
    server = TierlogServerProcess(
        tmp_path / "node-data",
        config_text=proxied_config(seaweed, s3_fault_proxy, etcd_server, prefix),
        env=s3_env(seaweed),
    )
    try:
        server.start()
        await create(server.stream_port, STREAM, {"x-tierlog-ack": "remote"})
        published = Published()
        # transient faults of every kind: slower, but confirms keep coming
        s3_fault_proxy.configure(
            rate=0.3,
            kinds={"500": 1, "503": 1, "reset": 1, "lost_reply": 1, "delay": 1},
            delay_s=(0.1, 0.4),
        )
        for kind in ("500", "lost_reply"):  # some faults whatever the draw
            s3_fault_proxy.inject_next(kind)
        await publish_for(server.stream_port, STREAM, 2.0, producer=PRODUCER, state=published)
        assert len(published.confirmed) > 50
        assert s3_fault_proxy.total_injected() > 0

        # the store refuses everything: a publish is written locally but not confirmed
        s3_fault_proxy.configure(rate=1.0, kinds={"503": 1})
        await asyncio.sleep(1.0)  # commits already in flight finish or fail
        client = await AsyncRawClient.connect(server.stream_port)
        try:
            await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, PRODUCER, STREAM))
            pid = published.next_seq
            published.next_seq += 1
            client.send(encode_publish(1, [(pid, body(pid))]))
            with pytest.raises(TimeoutError):
                await client.expect(PublishConfirm, timeout=2.0)
            s3_fault_proxy.off()
            started = time.monotonic()
            confirm = await client.expect(PublishConfirm, timeout=40.0)
            assert list(confirm.publishing_ids) == [pid]
            published.confirmed.add(pid)
            print(f"confirm came {time.monotonic() - started:.1f} s after the store recovered")
        finally:
            client.close()

        server.kill()
        shutil.rmtree(server.data_dir)  # only the node's disk
        server.start()
        got = await read_all(server.stream_port, STREAM, quiet=2.0)
        assert check_oracle(published.confirmed, got) == []
    finally:
        s3_fault_proxy.off()
        try:
            server.stop()
        finally:
            server.kill()
