"""Delayed streams losing their node's disk, shared by ``tests/delayed/test_disk_loss.py``
and ``scripts/delayed_campaign.py --disk-loss``: one ``tierlog serve`` on SeaweedFS + etcd,
a delayed stream (``ack = remote``, or an ordinary tiered one), scheduled messages published
with the real ``rstream`` client, then ``wipes`` times: SIGKILL, the data directory deleted
(the object store and the MetaStore are elsewhere and stay), started again empty. The
checkpoint interval is small, so checkpoints and the retention floor (fragments of the
system stream trimmed) happen before the disk goes.

Oracle: every confirmed scheduled message is appended to the stream exactly once, never
before its due time.

An ordinary (``ack = replicas``) stream keeps only what was tiered when the disk went: the
runner waits until both the stream and its system stream are tiered before each wipe, and
no message is due around the wipe (a dispatch tiered in the stream but not yet in the
system stream would be sent again: docs/delayed.md, Limits).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import random
import shutil
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tests.delayed.test_process import QUIET, body_of, consume_all, publish, wait_scheduler
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tierlog.server.delayed_intake import system_stream_name

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()

KINDS: dict[str, dict[str, str]] = {
    "ack-remote": {"x-tierlog-delayed": "true", "x-tierlog-ack": "remote"},
    "tiered": {
        "x-tierlog-delayed": "true",
        "x-tierlog-max-fragment-age": "1s",
        "x-tierlog-debounce-seconds": "0.2",
        "stream-max-segment-size-bytes": "65536",
    },
}


def server_config(seaweed: SeaweedServer, etcd: str, prefix: str, checkpoint_records: int) -> str:
    uri = f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}&region={seaweed.region}"
    return f"""
[server]
delayed_checkpoint_records = {checkpoint_records}

[storage]
object_store = "{uri}"
meta_store = "etcd://{etcd}/{prefix}"

[tier]
remote_ack_interval_seconds = 0.2
retention_interval_seconds = 0.5
local_retention_interval_seconds = 0.5
"""


def s3_env(seaweed: SeaweedServer) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": seaweed.access_key, "AWS_SECRET_ACCESS_KEY": seaweed.secret_key}


def _get(server: TierlogServerProcess, path: str) -> Any:
    req = urllib.request.Request(f"{server.admin_url}{path}")
    req.add_header("Authorization", AUTH)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _create(server: TierlogServerProcess, name: str, arguments: dict[str, str]) -> None:
    data = json.dumps({"name": name, "arguments": arguments}).encode()
    req = urllib.request.Request(f"{server.admin_url}/api/streams", data=data, method="POST")
    req.add_header("Authorization", AUTH)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10):
        pass


def _tiered(server: TierlogServerProcess, name: str) -> bool:
    """Whether ``name`` is tiered up to its end; a system stream (a reserved name, which
    the stream routes refuse) through its delayed stream's status."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        if name.startswith("__tierlog_delayed."):
            parent = name.removeprefix("__tierlog_delayed.")
            body = _get(server, f"/api/streams/{urllib.parse.quote(parent, safe='')}/delayed")
            section = body["system_stream"]
            tiered, end = section["tiered_offset"], section["next_offset"]
        else:
            status = _get(server, f"/api/streams/{urllib.parse.quote(name, safe='')}")
            tiered, end = status["remote"]["tiered_offset"], status["local"]["next_offset"]
        return tiered is not None and tiered >= end
    return False


async def wait_tiered(server: TierlogServerProcess, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(_tiered(server, n) for n in names):
        if time.monotonic() > deadline:
            raise AssertionError(f"{names} not tiered in {timeout} s:\n{server.log_tail()}")
        await asyncio.sleep(0.2)


async def wait_pending(
    server: TierlogServerProcess, stream: str, left: int, timeout: float
) -> None:
    """Until the scheduler holds exactly ``left`` messages (the others delivered)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            status = _get(server, f"/api/streams/{stream}/delayed")
            if status["scheduled"] == left and status["in_flight"] == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"scheduled is not {left} after {timeout} s")
        await asyncio.sleep(0.1)


@dataclass
class DiskLossResult:
    kind: str
    confirmed: int = 0
    appended: int = 0
    missing: int = 0
    duplicates: int = 0
    early: int = 0
    wipes: int = 0
    checkpoints_before_wipe: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


async def run_disk_loss(
    server: TierlogServerProcess,
    kind: str,
    *,
    stream: str = "timers",
    wipes: int = 1,
    early_messages: int = 60,
    late_messages: int = 40,
    seed: int = 1,
) -> DiskLossResult:
    """Each round: ``early_messages`` due within 2 s (delivered before the wipe, filling the
    system stream with delivered history and checkpoints), ``late_messages`` due 12-16 s
    after publishing (still scheduled when the disk goes), then the wipe."""
    rng = random.Random(seed)
    result = DiskLossResult(kind)
    _create(server, stream, KINDS[kind])
    due_of: dict[bytes, int] = {}
    pid = 0
    for _round in range(wipes):
        if due_of:  # the previous round's messages are all due first: none around this wipe
            await asyncio.sleep(max(0.0, (max(due_of.values()) - time.time() * 1000) / 1000 + 1))
        now = int(time.time() * 1000)
        early = {pid + k: now + rng.randint(200, 2000) for k in range(1, early_messages + 1)}
        pid += early_messages
        late = {pid + k: now + rng.randint(12_000, 16_000) for k in range(1, late_messages + 1)}
        pid += late_messages
        messages = {p: (f"msg-{p:05d}".encode(), due) for p, due in {**early, **late}.items()}
        pending = dict(messages)
        for _ in range(3):  # resends are deduplicated by publishing id
            confirmed = await publish(server, stream, pending)
            pending = {p: m for p, m in pending.items() if p not in confirmed}
            if not pending:
                break
        if pending:
            result.problems.append(f"{len(pending)} messages never confirmed")
        due_of.update((b, d) for p, (b, d) in messages.items() if p not in pending)
        waiting = sum(1 for b, d in due_of.items() if d > now + 5000)
        await wait_pending(server, stream, waiting, timeout=20)
        status = _get(server, f"/api/streams/{stream}/delayed")
        result.checkpoints_before_wipe.append(int(status["checkpoint_through"]))
        await wait_tiered(server, [stream, system_stream_name(stream)], timeout=30)
        killed = int(time.time() * 1000)
        if killed > min(late.values()) - 500:
            result.problems.append("the wipe came too late: a message was due around it")
        server.kill()
        shutil.rmtree(server.data_dir)  # the node's disk is gone; S3 and etcd are not
        server.start()
        wait_scheduler(server, stream)
        result.wipes += 1
    result.confirmed = len(due_of)
    last_due = max(due_of.values())
    await asyncio.sleep(max(0.0, (last_due - time.time() * 1000 + 2000) / 1000))
    got = await consume_all(server, stream, len(due_of), timeout=8, quiet=QUIET)
    counts = collections.Counter(body_of(raw) for _ts, raw in got)
    result.appended = len(got)
    result.missing = len(set(due_of) - set(counts))
    result.duplicates = sum(c - 1 for c in counts.values())
    result.early = sum(1 for ts, raw in got if ts < due_of.get(body_of(raw), 0))
    return result
