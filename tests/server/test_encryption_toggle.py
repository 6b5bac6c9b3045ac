"""No setting change can make committed data unreadable (issue 30, item 9).

A stream created encrypted has a sealed manifest pointer: readers refuse a plaintext
object it names. Encryption turned off and on again (two PATCHes by a ``configure``
user) between a fragment's upload and its commit used to commit that plaintext fragment
under the sealed pointer, and every reader then refused it. Here the real server on S3
(SeaweedFS behind the fault proxy, which holds the fragment's PUT while the PATCHes
land), the admin API and rstream; then the node's disk is lost, so a consumer from the
first offset reads everything from the remote tier.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import ConsumerOffsetSpecification, OffsetType

from tests.plugins.s3_fault_proxy import FaultProxy, wait_for
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import RawClient, TierlogServerProcess
from tests.server.test_e2e import admin, consume, producer, publish
from tests.server.test_s3_faults import server_config
from tierlog.formats.protocol import commands as c

pytestmark = pytest.mark.s3

KEY = base64.b64encode(bytes(range(32))).decode()
STREAM_ARGS = {
    "x-tierlog-encryption": "true",
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "0.3s",
    "x-tierlog-debounce-seconds": "0.05",
}
HOLD_S = 4.0


@pytest.fixture
def server(
    tmp_path: Path, seaweed: SeaweedServer, s3_fault_proxy: FaultProxy
) -> Iterator[TierlogServerProcess]:
    config = server_config(seaweed, s3_fault_proxy, f"toggle/{uuid.uuid4().hex}")
    config += f'\n[encryption]\nkeys = {{ k1 = "base64:{KEY}" }}\n'
    process = TierlogServerProcess(
        tmp_path / "data",
        config_text=config,
        env={
            "AWS_ACCESS_KEY_ID": seaweed.access_key,
            "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
        },
    )
    try:
        yield process
    finally:
        s3_fault_proxy.off()
        try:
            process.stop()
        finally:
            process.kill()


def patch(server: TierlogServerProcess, stream: str, arguments: dict[str, str]) -> Any:
    request = urllib.request.Request(
        f"{server.admin_url}/api/streams/{stream}",
        data=json.dumps({"arguments": arguments}).encode(),
        method="PATCH",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def all_tiered(server: TierlogServerProcess, stream: str) -> bool:
    status = admin(server, f"/api/streams/{stream}")
    return bool(status["remote"]["tiered_offset"] == status["local"]["next_offset"])


async def test_encryption_off_and_on_between_upload_and_commit(
    server: TierlogServerProcess, s3_fault_proxy: FaultProxy
) -> None:
    server.start()
    async with producer(server) as p:
        await p.create_stream("toggled", arguments=STREAM_ARGS)
    first = [[b"sealed-%d" % i for i in range(50)]]
    await publish(server, "toggled", first, name="a")
    assert wait_for(lambda: all_tiered(server, "toggled"), 30)
    # encryption off; the next fragment is coded plaintext, and its PUT is held while
    # encryption is turned on again, so its commit runs under the sealed pointer
    patch(server, "toggled", {"x-tierlog-encryption": "false"})
    s3_fault_proxy.configure(delay_s=(HOLD_S, HOLD_S))
    s3_fault_proxy.inject_next("delay", lambda m, p: m == "PUT" and p.endswith(".fragment"))
    second = [[b"plain-%d" % i for i in range(50)]]
    await publish(server, "toggled", second, name="b")
    held = time.monotonic()
    assert wait_for(lambda: s3_fault_proxy.pending_one_shots() == 0, 10)
    patch(server, "toggled", {"x-tierlog-encryption": "true"})
    assert time.monotonic() - held < HOLD_S, "the PATCH came after the upload"
    assert wait_for(lambda: all_tiered(server, "toggled"), 30)
    # the node's disk is lost: everything is read back from the remote tier
    server.stop()
    shutil.rmtree(server.data_dir / "streams")
    server.start()
    spec = ConsumerOffsetSpecification(OffsetType.FIRST)
    got = await consume(server, "toggled", spec, 100, timeout=30)
    assert [body for _, body in got] == [m for b in first + second for m in b]
    assert "event=manifest_seal_dropped" in server.log_tail(1_000_000)


async def test_disk_loss_of_an_encrypted_stream(server: TierlogServerProcess) -> None:
    """Found on the way: after a disk loss, resolution replays the tracking state from the
    remote tail's fragments, and read a v2 (sealed or compressed) fragment's stored bytes
    as chunks (BadMagicError: tiering never started and the stream took no publishes)."""
    server.start()
    async with producer(server) as p:
        await p.create_stream("lost", arguments=STREAM_ARGS)
    batches = [[b"m-%d-%d" % (k, i) for i in range(20)] for k in range(3)]
    await publish(server, "lost", batches, name="w", pause=0.4)
    assert wait_for(lambda: all_tiered(server, "lost"), 30)
    server.stop()
    shutil.rmtree(server.data_dir / "streams")
    server.start()
    assert wait_for(
        lambda: admin(server, "/api/streams/lost")["remote"]["tiering"] == "running", 20
    )
    # the publisher's sequence came back with the tracking state: a resend is a duplicate
    client = RawClient(server.host, server.stream_port)
    try:
        assert client.handshake() == 1
        client.send(c.QueryPublisherSequenceRequest(client.next_corr(), "w", "lost").encode())
        answer = client.expect(c.QueryPublisherSequenceResponse)
        assert isinstance(answer, c.QueryPublisherSequenceResponse)
        assert answer.sequence == 60
    finally:
        client.close()
    await publish(server, "lost", [[b"after"]], name="w2")
    spec = ConsumerOffsetSpecification(OffsetType.FIRST)
    got = await consume(server, "lost", spec, 61, timeout=30)
    assert [body for _, body in got] == [m for b in batches for m in b] + [b"after"]
