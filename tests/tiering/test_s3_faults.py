"""Tiering through the S3 fault proxy: lost replies on a fragment upload and on a manifest
root put are resolved as our own writes; the stream shows as degraded while commits keep
failing and recovers on its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.s3_fault_proxy import FaultProxy
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tiering_world import World
from tests.tiering.test_tierer import assert_manifest_matches_log
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.retry import RetryPolicy
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore
from tierlog.tiering.tierer import StreamTierer

pytestmark = pytest.mark.s3


@pytest.fixture
def proxied(seaweed: SeaweedServer, s3_fault_proxy: FaultProxy) -> Iterator[S3ObjectStore]:
    config = S3Config(
        bucket=seaweed.bucket,
        prefix=f"tierfaults/{uuid.uuid4().hex}",
        endpoint=s3_fault_proxy.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key,
        secret_access_key=seaweed.secret_key,
        request_timeout_s=5.0,
    )
    store = S3ObjectStore(
        config, retry=RetryPolicy(max_attempts=8, base_delay_s=0.01, max_delay_s=0.1)
    )
    yield store
    store.close()


@pytest.fixture
def s3_world(tmp_path: Path, proxied: S3ObjectStore, meta: MetaStore) -> Iterator[World]:
    w = World(tmp_path, proxied, meta)
    yield w
    w.close()


def _started(world: World) -> StreamTierer:
    tierer = world.tierer()
    tierer.start()
    return tierer


def test_lost_reply_on_a_fragment_upload_is_our_own_write(
    s3_world: World, proxied: S3ObjectStore, s3_fault_proxy: FaultProxy
) -> None:
    tierer = _started(s3_world)
    s3_fault_proxy.inject_next("lost_reply", lambda m, p: m == "PUT" and ".fragment" in p)
    s3_world.append(20)
    assert tierer.flush(timeout=20)
    assert s3_fault_proxy.injected["lost_reply"] == 1
    assert proxied.resolved_creates == 1
    assert tierer.status()["upload_failures"] == 0  # resolved inside the store call
    assert_manifest_matches_log(s3_world, tierer)


def test_lost_reply_on_a_manifest_root_put_is_our_own_write(
    s3_world: World, proxied: S3ObjectStore, s3_fault_proxy: FaultProxy
) -> None:
    tierer = _started(s3_world)
    s3_world.append(5)
    assert tierer.flush(timeout=20)
    s3_fault_proxy.inject_next("lost_reply", lambda m, p: m == "PUT" and "/root." in p)
    s3_world.append(20)
    assert tierer.flush(timeout=20)
    assert s3_fault_proxy.injected["lost_reply"] == 1
    assert proxied.resolved_creates == 1
    assert tierer.status()["commit_failures"] == 0
    assert_manifest_matches_log(s3_world, tierer)
    # and a restart resolves to the same manifest
    tierer.stop(flush=False)
    again = s3_world.tierer()
    assert again.start().next_offset == tierer.durable_next


def test_tiering_under_ten_percent_faults_loses_nothing(
    s3_world: World, s3_fault_proxy: FaultProxy
) -> None:
    tierer = _started(s3_world)
    s3_fault_proxy.configure(rate=0.10, delay_s=(0.01, 0.1))
    # a few PUTs only may meet no random fault: the first three requests always do
    # (each failed one is retried, so all three are used)
    for kind in ("503", "lost_reply", "reset"):
        s3_fault_proxy.inject_next(kind)
    s3_world.append(60)
    tierer.flush(timeout=5)
    s3_fault_proxy.off()
    assert tierer.flush(timeout=30)
    assert tierer.halted is None
    assert s3_fault_proxy.pending_one_shots() == 0
    assert s3_fault_proxy.total_injected() >= 3
    assert_manifest_matches_log(s3_world, tierer)


def test_degraded_during_an_outage_clears_after(
    s3_world: World, s3_fault_proxy: FaultProxy
) -> None:
    tierer = _started(s3_world)
    s3_world.append(3)
    assert tierer.flush(timeout=20)
    s3_fault_proxy.configure(rate=1.0, kinds={"503": 1, "reset": 1})
    s3_world.append(10)
    assert not tierer.flush(timeout=2.0)
    status = tierer.status()
    assert status["degraded"] is True and status["last_error"]
    s3_fault_proxy.off()
    assert tierer.flush(timeout=30)
    assert tierer.status()["degraded"] is False
    assert_manifest_matches_log(s3_world, tierer)
