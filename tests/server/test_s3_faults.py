"""``tierlog serve`` on S3 behind the fault proxy, as an operator runs it: starts that ride
out 40 % faults (and leave no probe object), and publish + tiering + remote reads at 10 %
faults with a SIGKILL mid-run: every confirmed message read back once, in order, and tiering
catching up once the faults stop."""

from __future__ import annotations

import itertools
import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import ConsumerOffsetSpecification, OffsetType

from tests.plugins.s3_fault_proxy import FaultProxy, wait_for
from tests.plugins.seaweed import SeaweedServer, _s3_client
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.test_e2e import admin, consume, producer, publish
from tests.support.streams import TIERED_AWAY
from tierlog.storage.s3_object_store import PROBE_PREFIX

pytestmark = pytest.mark.s3

RESTART_CYCLES = int(os.environ.get("TIERLOG_FAULT_RESTARTS", "20"))
STREAM_ARGS = {**TIERED_AWAY, "x-tierlog-max-fragment-age": "0.5s"}


def server_config(seaweed: SeaweedServer, proxy: FaultProxy, prefix: str) -> str:
    uri = f"s3://{seaweed.bucket}/{prefix}?endpoint={proxy.endpoint}&region={seaweed.region}"
    return f"""
[storage]
object_store = "{uri}"

[store]
max_attempts = 8
base_delay_seconds = 0.02
max_delay_seconds = 0.5
startup_deadline_seconds = 60

[tier]
delete_grace_seconds = 0.0
retention_interval_seconds = 0.5
local_retention_interval_seconds = 0.2
"""


@pytest.fixture
def s3_server(
    tmp_path: Path, seaweed: SeaweedServer, s3_fault_proxy: FaultProxy
) -> Iterator[tuple[TierlogServerProcess, str]]:
    prefix = f"serve/{uuid.uuid4().hex}"
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


def probe_objects(seaweed: SeaweedServer, prefix: str) -> list[str]:
    client = _s3_client(seaweed.endpoint)
    listed = client.list_objects_v2(Bucket=seaweed.bucket, Prefix=f"{prefix}/{PROBE_PREFIX}")
    return [o["Key"] for o in listed.get("Contents", [])]


def metrics_text(server: TierlogServerProcess) -> str:
    with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=10) as r:
        return r.read().decode()


def stream_status(server: TierlogServerProcess, name: str) -> dict[str, Any]:
    status: dict[str, Any] = admin(server, f"/api/streams/{name}")
    return status


async def create_stream(server: TierlogServerProcess, name: str) -> None:
    async with producer(server) as p:
        await p.create_stream(name, arguments=STREAM_ARGS)


async def test_every_start_rides_out_forty_percent_faults(
    s3_server: tuple[TierlogServerProcess, str],
    seaweed: SeaweedServer,
    s3_fault_proxy: FaultProxy,
) -> None:
    server, prefix = s3_server
    server.start()
    await create_stream(server, "restarts")
    await publish(server, "restarts", [[b"m%d" % i for i in range(50)]], name="p")
    s3_fault_proxy.configure(rate=0.40, delay_s=(0.01, 0.2))
    took: list[float] = []
    for _ in range(RESTART_CYCLES):
        server.kill()
        started = time.monotonic()
        server.start()  # raises if the process exits or does not listen in time
        took.append(time.monotonic() - started)
    injected = s3_fault_proxy.total_injected()
    s3_fault_proxy.off()
    assert injected >= RESTART_CYCLES, "the faults did not reach the starts"
    log = server.log_tail(200_000)
    assert "event=object_store_retry" in log  # retried faults are visible
    server.stop()
    assert probe_objects(seaweed, prefix) == []
    print(f"starts at 40% faults: max {max(took):.1f}s mean {sum(took) / len(took):.1f}s")


async def test_publish_tier_and_read_under_ten_percent_faults_with_a_crash(
    s3_server: tuple[TierlogServerProcess, str], s3_fault_proxy: FaultProxy
) -> None:
    server, _prefix = s3_server
    server.start()
    await create_stream(server, "faulty")
    s3_fault_proxy.configure(rate=0.10, delay_s=(0.01, 0.3))
    for kind in ("503", "reset"):  # some faults whatever the draw
        s3_fault_proxy.inject_next(kind)
    sent = 0
    for _ in range(4):
        batch = [b"msg-%06d" % (sent + i) + b"x" * 2000 for i in range(200)]
        await publish(server, "faulty", [batch], name="w")
        sent += len(batch)
    server.kill()  # a crash mid-run, faults still on
    started = time.monotonic()
    server.start()
    listen_s = time.monotonic() - started
    assert listen_s < 5, f"restart under faults took {listen_s:.1f}s to listen"
    for _ in range(2):
        batch = [b"msg-%06d" % (sent + i) + b"x" * 2000 for i in range(200)]
        await publish(server, "faulty", [batch], name="w")
        sent += len(batch)
    got = await consume(
        server, "faulty", ConsumerOffsetSpecification(OffsetType.FIRST), sent, timeout=60
    )
    assert [body[:10] for _, body in got] == [b"msg-%06d" % i for i in range(sent)]
    offsets = [offset for offset, _ in got]  # tracking chunks take offsets too: gaps allowed
    assert offsets[0] == 0 and all(a < b for a, b in itertools.pairwise(offsets))
    assert s3_fault_proxy.total_injected() > 0
    s3_fault_proxy.off()
    stopped = time.monotonic()

    def caught_up() -> bool:
        s = stream_status(server, "faulty")
        return s["remote"]["tiered_offset"] == s["local"]["next_offset"] and s["remote"][
            "tiering"
        ] in ("running",)

    assert wait_for(caught_up, timeout=30), stream_status(server, "faulty")
    print(f"restart listened in {listen_s:.1f}s; caught up {time.monotonic() - stopped:.1f}s")


def test_start_gives_up_after_the_deadline_with_one_line(
    tmp_path: Path, seaweed: SeaweedServer, s3_fault_proxy: FaultProxy
) -> None:
    import subprocess
    import sys

    prefix = f"serve/{uuid.uuid4().hex}"
    config = tmp_path / "server.toml"
    config.write_text(
        server_config(seaweed, s3_fault_proxy, prefix).replace(
            "startup_deadline_seconds = 60", "startup_deadline_seconds = 2"
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERLOG_")}
    env.update(
        AWS_ACCESS_KEY_ID=seaweed.access_key,
        AWS_SECRET_ACCESS_KEY=seaweed.secret_key,
        TIERLOG_STORAGE_DATA_DIR=str(tmp_path / "data"),
        TIERLOG_SERVER_PORT="0",
        TIERLOG_SERVER_ADMIN_PORT="0",
    )
    s3_fault_proxy.configure(rate=1.0, kinds={"503": 1, "reset": 1})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tierlog", "serve", "--config", str(config)],
        env=env,
        capture_output=True,
        timeout=60,
        text=True,
    )
    took = time.monotonic() - started
    assert done.returncode == 5  # the object store could not be reached
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert f"cannot open the object store s3://{seaweed.bucket}/{prefix}" in errors[0]
    assert "(storage.object_store)" in errors[0]
    assert "still unusable after 2 s" in errors[0]
    assert "event=object_store_retry" in done.stderr  # the retries were visible meanwhile
    assert took < 30


def probe(server: TierlogServerProcess, path: str) -> tuple[int, Any]:
    """An unauthenticated GET, as a systemd or Kubernetes probe makes it."""
    try:
        with urllib.request.urlopen(server.admin_url + path, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_admin_shows_degraded_tier_during_an_outage_and_clears_after(
    s3_server: tuple[TierlogServerProcess, str], s3_fault_proxy: FaultProxy
) -> None:
    server, _prefix = s3_server
    server.start()
    assert probe(server, "/api/health/ready") == (200, {"status": "ready"})
    await create_stream(server, "outage")
    await publish(server, "outage", [[b"a" * 1000 for _ in range(20)]], name="o")
    assert wait_for(lambda: stream_status(server, "outage")["remote"]["tiered_offset"] > 0, 20)
    s3_fault_proxy.configure(rate=1.0, kinds={"503": 1, "500": 1, "reset": 1})
    await publish(server, "outage", [[b"b" * 1000 for _ in range(20)]], name="o")  # confirmed
    assert wait_for(lambda: stream_status(server, "outage")["remote"]["tiering"] == "degraded", 20)
    remote = stream_status(server, "outage")["remote"]
    assert remote["degraded_since"] is not None and remote["last_error"]
    metrics = metrics_text(server)
    assert re.search(r"^tierlog_tier_degraded\{[^}]*\} 1(\.0)?$", metrics, re.M), metrics
    assert re.search(
        r'^tierlog_object_store_retries_total\{(?=[^}]*op="\w+")(?=[^}]*kind="\w+")[^}]*\} [1-9]',
        metrics,
        re.M,
    )
    lags = re.findall(r"^tierlog_tier_lag_seconds\{[^}]*\} (\S+)$", metrics, re.M)
    assert lags and float(lags[0]) > 0
    # the node is not ready (the body says why, naming no stream) and health says degraded
    status, body = probe(server, "/api/health/ready")
    assert status == 503 and body["status"] == "not ready", body
    assert any("tiering degraded" in reason for reason in body["reasons"]), body
    assert "outage" not in json.dumps(body)
    assert probe(server, "/api/health/live") == (200, {"status": "live"})
    health = admin(server, "/api/health")
    assert health["status"] == "degraded", health
    expected = [{"vhost": "/", "stream": "outage", "tiering": "degraded"}]
    assert health["tiering_degraded"] == expected, health
    s3_fault_proxy.off()

    def recovered() -> bool:
        s = stream_status(server, "outage")
        return s["remote"]["tiering"] == "running" and (
            s["remote"]["tiered_offset"] == s["local"]["next_offset"]
        )

    assert wait_for(recovered, 30), stream_status(server, "outage")
    assert stream_status(server, "outage")["remote"]["last_error"] is None
    assert probe(server, "/api/health/ready") == (200, {"status": "ready"})
    assert admin(server, "/api/health")["status"] == "ok"
