"""The leak test of issue 33 item 4: a real ``tierlog serve`` on SeaweedFS behind the fault
proxy goes through the fault sequences that leave objects nobody references, and after
one garbage collection past the grace period the bucket holds exactly what manifests,
catalogs and in-flight work reference.

Fault sequences:

* failed and ambiguous commits: 500 / 503 / reset / lost replies on every request while
  streams publish and commit;
* kill -9 during an upload: a manifest root PUT held by the proxy lands after the
  server died (the crash between writing a root and moving the pointer);
* deletion racing an upload: a fragment PUT held by the proxy while the stream is deleted
  (it may land after the stream cleanup listed the incarnation), then the stream
  re-created under the same name (a new incarnation);
* retention racing uploads: streams whose remote retention trims while they publish (one
  of fragments, one of whole offloaded segments: multipart uploads under faults);
* an offload multipart upload abandoned midway (initiated, one part, never completed or
  aborted: a node that died mid-offload and never came back).

The garbage-collection settings are short (grace 4 s, a collection every second), so the
test runs in seconds.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.s3_fault_proxy import FaultProxy, wait_for
from tests.plugins.seaweed import SeaweedServer, _open_s3, _s3_client
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_e2e import admin, producer, publish
from tierlog.remote import keys
from tierlog.remote.catalog import Catalog
from tierlog.remote.manifest_check import walk_manifest
from tierlog.storage.errors import NotFoundError
from tierlog.storage.meta_store import open_meta_store
from tierlog.storage.object_store import ObjectStore
from tierlog.tiering.deletion import DeletionQueue

pytestmark = pytest.mark.s3

GRACE_S = 4.0
HOLD_S = 2.5  # how long the proxy holds the request a crash or a deletion races
STREAM_ARGS = {
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "0.2s",
    "x-tierlog-debounce-seconds": "0.05",
    "stream-max-segment-size-bytes": "65536",
}
SEGMENT_ARGS = {  # whole-segment offload (multipart uploads), retention trimming it
    "x-tierlog-tier-mode": "segments",
    "stream-max-segment-size-bytes": "65536",
    "x-tierlog-offload-deletion-lag": "0",
    "x-tierlog-offload-threshold-bytes": "0",
    "max-length-bytes": "300000",
}


def server_config(seaweed: SeaweedServer, proxy: FaultProxy, prefix: str) -> str:
    uri = f"s3://{seaweed.bucket}/{prefix}?endpoint={proxy.endpoint}&region={seaweed.region}"
    return f"""
[storage]
object_store = "{uri}"

[store]
max_attempts = 8
base_delay_seconds = 0.02
max_delay_seconds = 0.5
task_stall_seconds = 1.5

[tier]
delete_grace_seconds = 0.0
retention_interval_seconds = 0.3
local_retention_interval_seconds = 0.2
gc_interval_seconds = 1.0
gc_grace_seconds = {GRACE_S}
"""


@pytest.fixture
def leak_server(
    tmp_path: Path, seaweed: SeaweedServer, s3_fault_proxy: FaultProxy
) -> Iterator[tuple[TierlogServerProcess, str]]:
    prefix = f"gcleak/{uuid.uuid4().hex}"
    server = TierlogServerProcess(
        tmp_path / "data",
        config_text=server_config(seaweed, s3_fault_proxy, prefix),
        env={
            "AWS_ACCESS_KEY_ID": seaweed.access_key,
            "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
        },
    )
    try:
        yield server, prefix
    finally:
        s3_fault_proxy.off()
        try:
            server.stop()
        finally:
            server.kill()


def gc_metrics(server: TierlogServerProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tierlog_gc_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def caught_up(server: TierlogServerProcess, names: list[str]) -> bool:
    for name in names:
        s = admin(server, f"/api/streams/{name}")
        if s["remote"]["tiered_offset"] != s["local"]["next_offset"]:
            return False
        if s["remote"]["tiering"] != "running":
            return False
    return True


def segments_settled(server: TierlogServerProcess, name: str) -> bool:
    """No offload of a segment-mode stream is running (or failing)."""
    remote = admin(server, f"/api/streams/{name}")["remote"]
    return remote["offload"]["status"] in ("success", "not run")


def is_put(marker: str) -> object:
    return lambda method, path: method == "PUT" and marker in path and "uploadId" not in path


def exists(store: ObjectStore, key: str) -> bool:
    try:
        store.head(key)
    except NotFoundError:
        return False
    return True


def batch(tag: str, n: int = 100) -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() + b"x" * 1500 for i in range(n)]


def expected_objects(data_dir: Path, store: ObjectStore) -> tuple[set[str], set[str]]:
    """What manifests and catalogs reference (every live incarnation's committed tree),
    and what in-flight work does: fragments at or after a live incarnation's committed
    next offset (a restarting writer adopts them), objects pending deletion, objects of
    recorded offload attempts."""
    meta = open_meta_store(f"sqlite://{data_dir / 'meta.db'}")
    prefix = ""  # the server's tier prefix; the S3 URI's prefix is the store's own
    try:
        catalog = Catalog(meta)
        referenced: set[str] = set()
        in_flight: set[str] = set()
        for record in catalog.list():
            inc = record.incarnation
            walk = walk_manifest(store, catalog, prefix, inc)
            assert walk.complete, walk.problems
            referenced |= walk.referenced()
            for obj in store.list(keys.data_prefix(prefix, inc)):
                parsed = keys.parse_key(obj.key, prefix)
                if isinstance(parsed, keys.FragmentKey) and parsed.first_offset >= walk.next_offset:
                    in_flight.add(obj.key)
            for attempt in meta.list(keys.offload_attempts_prefix(inc)):
                name = attempt.key.rsplit("/", 1)[-1]
                for part in ("data", "index"):
                    in_flight.add(f"{keys.segments_prefix(prefix, inc)}{name}.{part}")
        in_flight |= {key for key, _due in DeletionQueue(meta).pending_keys()}
        return referenced, in_flight
    finally:
        meta.close()


async def test_after_one_collection_past_the_grace_the_bucket_holds_only_referenced_objects(
    leak_server: tuple[TierlogServerProcess, str],
    seaweed: SeaweedServer,
    s3_fault_proxy: FaultProxy,
) -> None:
    server, prefix = leak_server
    proxy = s3_fault_proxy
    server.start()
    async with producer(server) as p:
        await p.create_stream("gc-a", arguments=STREAM_ARGS)
        await p.create_stream("gc-c", arguments={**STREAM_ARGS, "max-length-bytes": "200000"})
        await p.create_stream("gc-d", arguments=SEGMENT_ARGS)

    # failed and ambiguous commits (retention of gc-c trimming as it goes)
    proxy.configure(rate=0.15, kinds={"500": 1, "503": 1, "reset": 1, "lost_reply": 3})
    for round_ in range(4):
        await publish(server, "gc-a", [batch(f"a{round_}")], name="pa", pause=0.3)
        await publish(server, "gc-c", [batch(f"c{round_}")], name="pc", pause=0.3)
        await publish(server, "gc-d", [batch(f"d{round_}")], name="pd", pause=0.3)
    proxy.off()
    assert proxy.injected["lost_reply"] > 0

    # kill -9 while a manifest root PUT is on its way: it lands after the crash
    proxy.configure(delay_s=(HOLD_S, HOLD_S))
    proxy.inject_next("delay", is_put("/metadata/root."))
    await publish(server, "gc-a", [batch("a-kill")], name="pa")
    assert wait_for(lambda: proxy.pending_one_shots() == 0, timeout=10)
    server.kill()
    await asyncio.sleep(HOLD_S + 0.5)
    server.start()

    # a stream deleted while its fragment upload is held, then re-created
    async with producer(server) as p:
        await p.create_stream("gc-b", arguments=STREAM_ARGS)
    await publish(server, "gc-b", [batch("b0")], name="pb")
    proxy.inject_next("delay", is_put(".fragment"))
    async with producer(server) as p:
        await p.send_batch("gc-b", batch("b1"), publisher_name="pb2")
        assert wait_for(lambda: proxy.pending_one_shots() == 0, timeout=10)
        await p.delete_stream("gc-b")
    await asyncio.sleep(HOLD_S + 0.5)
    async with producer(server) as p:
        await p.create_stream("gc-b", arguments=STREAM_ARGS)
    await publish(server, "gc-b", [batch("b2")], name="pb")

    # retention racing uploads, under faults again
    proxy.configure(rate=0.1, kinds={"500": 1, "lost_reply": 1}, delay_s=(0.05, 0.3))
    for round_ in range(3):
        await publish(server, "gc-c", [batch(f"c-late{round_}")], name="pc", pause=0.2)
    proxy.off()

    store = _open_s3(seaweed, prefix)  # the bucket without the proxy: the test's own view
    # an offload multipart upload abandoned midway, under a live stream
    inc = admin(server, "/api/streams/gc-a")["incarnation"]
    client = _s3_client(seaweed.endpoint)
    abandoned = f"{prefix}/" + keys.segment_data_key("", inc, 0, uuid.uuid4())
    upload = client.create_multipart_upload(Bucket=seaweed.bucket, Key=abandoned)
    client.upload_part(
        Bucket=seaweed.bucket,
        Key=abandoned,
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=b"p" * (5 << 20),
    )

    # quiet: everything tiered, then one collection that starts past the grace period
    names = ["gc-a", "gc-b", "gc-c"]
    assert wait_for(lambda: caught_up(server, names), timeout=60)
    assert wait_for(lambda: segments_settled(server, "gc-d"), timeout=60), admin(
        server, "/api/streams/gc-d"
    )["remote"]["offload"]
    quiet = time.time()
    await asyncio.sleep(GRACE_S)
    runs = gc_metrics(server).get('tierlog_gc_runs_total{outcome="ok"}', 0.0)
    assert wait_for(
        lambda: gc_metrics(server).get('tierlog_gc_runs_total{outcome="ok"}', 0.0) >= runs + 2,
        timeout=30,
    ), server.log_tail()
    assert caught_up(server, names) and segments_settled(server, "gc-d")  # all quiet

    listed = {obj.key for obj in store.list("stream/")}
    referenced, in_flight = expected_objects(server.data_dir, store)
    # an object pending deletion may go between the listing and the queue's read
    leaked = sorted(k for k in listed - referenced - in_flight if exists(store, k))
    assert not leaked, f"{len(leaked)} object(s) nobody references: {leaked[:10]}"
    assert referenced <= listed  # nothing a manifest references was deleted
    pending = list(store.list_multipart_uploads("stream/"))
    assert pending == [], pending
    metrics = gc_metrics(server)
    assert metrics["tierlog_gc_aborted_uploads_total"] >= 1
    assert metrics["tierlog_gc_last_run_timestamp_seconds"] >= quiet + GRACE_S
    print(
        f"gc: deleted {metrics['tierlog_gc_deleted_objects_total']:.0f} object(s) "
        f"({metrics['tierlog_gc_deleted_bytes_total']:.0f} bytes), aborted "
        f"{metrics['tierlog_gc_aborted_uploads_total']:.0f} upload(s); bucket holds {len(listed)}"
    )
