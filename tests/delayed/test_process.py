"""Delayed delivery in a ``tierlog serve`` process with the real ``rstream`` client: kill -9
at random moments while messages are scheduled and due (every message appended exactly once,
none before its due time, lateness p99 <= 1 s outside the downtime), and the node's clock
stepped by one hour either way with Debian's ``faketime``: nothing is delivered early, the
skew is reported (metric), and delivery resumes at the due time once the clock is right."""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.consumer import Consumer, MessageContext
from rstream.exceptions import StreamNotAvailable
from rstream.producer import ConfirmationStatus

from tests.plugins.tierlog_server import TierlogServerProcess

HOST = "127.0.0.1"
SUBSCRIBE_RETRY_SECONDS = 15.0
QUIET = 2.0
"""Seconds of no new message after the expected count before a read-back ends: an
extra (twice appended) message is in the stream by then and arrives with the rest."""
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def admin(server: TierlogServerProcess, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{server.admin_url}{path}", data=data, method=method)
    req.add_header("Authorization", AUTH)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()


def wait_scheduler(server: TierlogServerProcess, stream: str) -> None:
    """Until the stream's scheduler runs again (rebuilt after the restart)."""
    for _ in range(200):
        with contextlib.suppress(OSError, ValueError):
            admin(server, "GET", f"/api/streams/{stream}/delayed")
            return
        time.sleep(0.05)
    raise AssertionError(f"the scheduler of {stream} did not start:\n{server.log_tail()}")


def create_delayed(server: TierlogServerProcess, name: str) -> None:
    admin(
        server, "POST", "/api/streams", {"name": name, "arguments": {"x-tierlog-delayed": "true"}}
    )


async def publish(
    server: TierlogServerProcess, stream: str, messages: dict[int, tuple[bytes, int]]
) -> set[int]:
    """Publish (publishing id -> (body, x-deliver-at)) as producer "app"; the confirmed ids
    (a connection lost to a kill leaves the rest unconfirmed)."""
    confirmed: set[int] = set()

    async def on_confirm(status: ConfirmationStatus) -> None:
        if status.is_confirmed:
            confirmed.add(status.message_id)

    with contextlib.suppress(Exception):
        async with Producer(HOST, port=server.stream_port, username="guest", password="guest") as p:
            batch = []
            for pid, (body, due) in sorted(messages.items()):
                message = AMQPMessage(body=body, application_properties={"x-deliver-at": due})
                message.publishing_id = pid  # a resend keeps its id (deduplication)
                batch.append(message)
            for k in range(0, len(batch), 100):
                await p.send_batch(
                    stream, batch[k : k + 100], publisher_name="app", on_publish_confirm=on_confirm
                )
            for _ in range(100):
                if len(confirmed) >= len(messages):
                    break
                await asyncio.sleep(0.05)
    return confirmed


async def consume_all(
    server: TierlogServerProcess,
    stream: str,
    count: int,
    timeout: float,
    quiet: float | None = None,
) -> list[tuple[int, bytes]]:
    """(chunk timestamp, raw message) of the stream from its first offset: until
    ``count`` arrived, or ``timeout``. With ``quiet``: until ``count`` arrived and then
    nothing more for ``quiet`` seconds (a message appended twice arrives with the rest
    and is returned too), instead of waiting the whole ``timeout`` for one too many."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()
    last = [time.monotonic()]

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append((ctx.timestamp, bytes(msg)))
        last[0] = time.monotonic()
        if len(got) >= count and quiet is None:
            done.set()

    async def settled() -> None:
        assert quiet is not None
        while len(got) < count or time.monotonic() - last[0] < quiet:
            await asyncio.sleep(0.05)
        done.set()

    consumer = Consumer(HOST, port=server.stream_port, username="guest", password="guest")
    async with consumer:
        deadline = time.monotonic() + SUBSCRIBE_RETRY_SECONDS
        while True:
            try:
                await consumer.subscribe(
                    stream,
                    on_message,
                    offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                )
                break
            except StreamNotAvailable:
                # retriable, as for any client: in a cluster the node rstream picked (a
                # replica Metadata listed) may not be serving the stream yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        watcher = None if quiet is None else asyncio.create_task(settled())
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        finally:
            if watcher is not None:
                watcher.cancel()
    return got


def body_of(raw: bytes) -> bytes:
    """The data section of an AMQP message rstream encoded (``msg-<n>`` bodies)."""
    start = raw.find(b"msg-")
    return raw[start:]


async def test_kill9_while_scheduled_exactly_once_never_early(tmp_path: Path) -> None:
    rng = random.Random(5)
    server = TierlogServerProcess(tmp_path / "data").start()
    try:
        create_delayed(server, "jobs")
        start = int(time.time() * 1000)
        messages = {
            pid: (f"msg-{pid:05d}".encode(), start + rng.randint(0, 8000)) for pid in range(1, 801)
        }
        downtime: list[tuple[int, int]] = []
        pending = dict(messages)
        for _kill in range(3):  # publish (the rest), then kill at a random moment
            confirmed = await publish(server, "jobs", pending)
            pending = {pid: m for pid, m in pending.items() if pid not in confirmed}
            await asyncio.sleep(rng.uniform(0.5, 2.5))
            # a message due just before the kill may not have gone yet: its lateness is
            # the downtime's too (the bound checked is 1 s)
            killed = int(time.time() * 1000) - 1000
            server.kill()
            server.start()
            wait_scheduler(server, "jobs")
            downtime.append((killed, int(time.time() * 1000)))
        for _ in range(3):  # resend whatever was not confirmed (deduplicated if accepted)
            if not pending:
                break
            confirmed = await publish(server, "jobs", pending)
            pending = {pid: m for pid, m in pending.items() if pid not in confirmed}
        assert not pending
        wait = max(due for _b, due in messages.values()) - int(time.time() * 1000) + 2000
        await asyncio.sleep(max(0, wait) / 1000)
        got = await consume_all(server, "jobs", len(messages), timeout=8, quiet=QUIET)
    finally:
        server.stop()
        server.kill()
    due_of = {body: due for body, due in messages.values()}
    counts = collections.Counter(body_of(raw) for _ts, raw in got)
    assert set(counts) == set(due_of), f"missing {len(set(due_of) - set(counts))}"
    assert max(counts.values()) == 1, "appended twice"
    lateness = []
    for ts, raw in got:
        due = due_of[body_of(raw)]
        assert ts >= due, f"{body_of(raw)!r} appended {due - ts} ms early"
        if not any(lo <= due <= hi for lo, hi in downtime):
            lateness.append(ts - due)
    lateness.sort()
    p99 = lateness[int(len(lateness) * 0.99) - 1]
    print(
        f"kill -9 x3: {len(got)} messages, {len(lateness)} outside downtime, p99 {p99} ms, "
        f"max {lateness[-1]} ms, downtime {[hi - lo for lo, hi in downtime]} ms"
    )
    assert p99 <= 1000


def faked(hours: int) -> dict[str, str]:
    return {
        "LD_PRELOAD": FAKETIME_LIB,
        "FAKETIME": f"{hours:+d}h",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


async def test_clock_stepped_an_hour_never_delivers_early(tmp_path: Path) -> None:
    assert Path(FAKETIME_LIB).exists(), "apt-get install faketime (dev.py does)"
    data = tmp_path / "data"
    dues: dict[bytes, int] = {}
    for hours in (+1, -1):
        server = TierlogServerProcess(data, env=faked(hours)).start()
        try:
            if hours > 0:
                create_delayed(server, "timers")
            now = int(time.time() * 1000)
            due = now + 4000
            body = f"msg-{hours:+d}".encode()
            dues[body] = due
            pid = 1 if hours > 0 else 2  # one producer: ids go up
            assert await publish(server, "timers", {pid: (body, due)}) == {pid}
            wait_scheduler(server, "timers")
            if hours > 0:  # the node thinks the message is an hour overdue: it must wait
                for _ in range(200):
                    status = admin(server, "GET", "/api/streams/timers/delayed")
                    if status["dispatch_halted"]:
                        break
                    await asyncio.sleep(0.05)
                assert status["dispatch_halted"] is True
                metrics = admin(server, "GET", "/metrics")
                assert 'tierlog_delayed_dispatch_halted{stream="timers",vhost="/"} 1.0' in metrics
            else:
                await asyncio.sleep(1.0)
            got = await consume_all(server, "timers", 1, timeout=1.0)
            delivered = [body_of(raw) for _ts, raw in got]
            assert body not in delivered, "delivered while the node's clock was skewed"
            assert "delayed_dispatch_halted_clock_skew" in server.log_tail(200_000) or hours < 0
        finally:
            server.stop()
            server.kill()
    server = TierlogServerProcess(data).start()  # the clock is right again
    try:
        await asyncio.sleep(max(0, max(dues.values()) - int(time.time() * 1000)) / 1000 + 1.5)
        got = await consume_all(server, "timers", 2, timeout=5)
    finally:
        server.stop()
        server.kill()
    bodies = sorted(body_of(raw) for _ts, raw in got)
    assert bodies == sorted([b"msg-+1", b"msg--1"]), bodies
    for ts, raw in got:
        assert ts >= dues[body_of(raw)], "appended before its due time"
