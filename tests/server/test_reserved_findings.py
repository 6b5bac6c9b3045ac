"""The three attacks of issue 30 (items 1, 2 and 5) against a real ``tierlog serve`` with
real clients (rstream, urllib), each a test that fails where the attack works:

1. a write-only user declares the delayed dispatcher's producer reference and raises its
   sequence: confirmed scheduled messages of other producers must still be delivered;
2. a write-only user publishes an ordinary record into a delayed stream's system stream:
   delivery must go on (and a foreign record that is in the file anyway — written
   straight into the system stream's log — is skipped, logged and counted, never a stall);
5. a user barred from ``prod-*`` streams by ``^(?!prod-).*`` (which matches the empty
   name) must not retire a node; the ``administrator`` tag is what node routes need.
"""

from __future__ import annotations

import contextlib
import glob
import time
from pathlib import Path

from rstream import AMQPMessage
from rstream.exceptions import AccessRefused, PreconditionFailed, ServerError

from tests.plugins.tierlog_server import TierlogServerProcess, running_server
from tests.server.reserved_clients import (
    USERS_TOML,
    admin,
    create_delayed,
    delivered,
    producer,
    schedule,
    scrape,
    wait_scheduler,
)
from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog
from tierlog.server.delayed_intake import DISPATCHER_REFERENCE, system_stream_name

DELIVERY_TIMEOUT = 15.0


async def _attack_publish(
    server: TierlogServerProcess, stream: str, reference: str | None, publishing_id: int
) -> str:
    """Publish one ordinary message as the write-only user: declare the publisher (the
    answer's code is the outcome when refused), then ``send_wait`` (declares its own and
    waits for the confirm); "confirmed", or the refusal's class name."""
    message = AMQPMessage(body=b"attack")
    message.publishing_id = publishing_id
    async with producer(server, "writer") as p:
        client = await p.default_client
        try:
            await client.declare_publisher(stream, reference, publisher_id=200)
            await p.send_wait(stream, message, publisher_name=reference)
        except ServerError as exc:
            return type(exc).__name__
    return "confirmed"


async def test_a_writer_cannot_make_scheduled_messages_vanish_through_the_dispatcher_reference(
    tmp_path: Path,
) -> None:
    with running_server(tmp_path / "data", config_text=USERS_TOML) as server:
        create_delayed(server, "orders")
        wait_scheduler(server, "orders")
        # the attack: the dispatcher's reference, far ahead of any id the scheduler uses
        attack = await _attack_publish(server, "orders", DISPATCHER_REFERENCE, 1_000_000)
        bodies = [b"due-soon-1", b"due-soon-2"]
        await schedule(server, "orders", bodies, delay_ms=300)
        got = await delivered(server, "orders", bodies, DELIVERY_TIMEOUT)
        assert got == bodies, f"confirmed scheduled messages vanished (attack: {attack})"
        assert attack == PreconditionFailed.__name__
        status, body = admin(server, "GET", "/api/streams/orders/delayed")
        assert status == 200 and body["scheduled"] == 0


async def test_a_writer_cannot_poison_a_system_stream(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", config_text=USERS_TOML) as server:
        create_delayed(server, "jobs")
        wait_scheduler(server, "jobs")
        await schedule(server, "jobs", [b"before-attack"], delay_ms=1500)  # system stream made
        # the attack: an ordinary record into the hidden system stream (write is ".*")
        attack = await _attack_publish(server, system_stream_name("jobs"), "w", 1)
        await schedule(server, "jobs", [b"after-attack"], delay_ms=300, publisher_name="app2")
        bodies = [b"before-attack", b"after-attack"]
        got = await delivered(server, "jobs", bodies, DELIVERY_TIMEOUT)
        assert got == bodies, f"delivery stopped (attack: {attack})"
        assert attack == AccessRefused.__name__


def _system_stream_dir(server: TierlogServerProcess, stream: str) -> str:
    (found,) = glob.glob(str(server.data_dir / "streams" / f"*_{system_stream_name(stream)}_*"))
    return found


async def test_a_foreign_record_found_in_a_system_stream_is_skipped_logged_and_counted(
    tmp_path: Path,
) -> None:
    """A record no client can write any more, put straight into the system stream's log
    file while the server is down (a restored or damaged file): after the restart the
    scheduler skips it — logged, counted — and delivers everything scheduled."""
    server = TierlogServerProcess(tmp_path / "data", config_text=USERS_TOML).start()
    try:
        create_delayed(server, "jobs")
        wait_scheduler(server, "jobs")
        await schedule(server, "jobs", [b"scheduled-before"], delay_ms=2500)
        assert server.stop() == 0
        forged = StreamLog.open(
            _system_stream_dir(server, "jobs"), LogConfig(), adopt_disk_epoch=True
        )
        try:
            forged.append_records([b"not a delayed-delivery record", b"TLDD\x00"])
        finally:
            forged.close()
        server.start()
        wait_scheduler(server, "jobs")
        await schedule(server, "jobs", [b"scheduled-after"], delay_ms=300, publisher_name="app2")
        bodies = [b"scheduled-before", b"scheduled-after"]
        got = await delivered(server, "jobs", bodies, DELIVERY_TIMEOUT)
        assert got == bodies, server.log_tail()
        assert scrape(server, "tierlog_delayed_foreign_records_total") >= 2
        assert "delayed_foreign_record_skipped" in server.log_tail(200_000)
        status, body = admin(server, "GET", "/api/streams/jobs/delayed")
        assert status == 200 and body["failed"] is None and body["scheduled"] == 0
    finally:
        with contextlib.suppress(RuntimeError):
            server.stop()
        server.kill()


CLUSTER_TOML = """
[cluster]
node = "n1"
lease_ttl_seconds = 3.0
drift_seconds = 0.5
scan_interval_seconds = 0.2
"""


def _wait_registered(server: TierlogServerProcess) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, body = admin(server, "GET", "/api/nodes/n1")
        if status == 200 and body.get("live"):
            return
        time.sleep(0.1)
    raise AssertionError(f"node n1 did not register:\n{server.log_tail()}")


def test_node_routes_need_the_administrator_tag_not_a_stream_pattern(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", config_text=USERS_TOML + CLUSTER_TOML) as server:
        _wait_registered(server)
        for user in ("limited", "writer", "reader"):
            status, body = admin(server, "POST", "/api/nodes/n1/retire", {}, user=user)
            assert status == 403, (user, body)
            assert admin(server, "DELETE", "/api/nodes/n1/retire", user=user)[0] == 403
            for path in ("/api/nodes", "/api/nodes/n1", "/api/cluster"):
                assert admin(server, "GET", path, user=user)[0] == 403, (user, path)
        status, body = admin(server, "GET", "/api/nodes/n1")
        assert status == 200 and body["retiring"] is False, body
        # the tag, not a stream pattern: ops may not touch a single stream, and may these
        for path in ("/api/nodes", "/api/nodes/n1", "/api/cluster"):
            assert admin(server, "GET", path, user="ops")[0] == 200, path
        # a retirement nobody asked for is withdrawn with 404: the tag's write route works
        assert admin(server, "DELETE", "/api/nodes/n1/retire", user="ops")[0] == 404


async def test_a_producer_that_only_scheduled_resumes_after_its_scheduled_ids(
    tmp_path: Path,
) -> None:
    """Found beside issue 30: QueryPublisherSequence answered from the stream alone, so a
    producer whose messages were all scheduled (its ids are in the system stream) resumed
    at id 1 on its next connection, and its next scheduled messages were confirmed and then
    dropped as duplicates. rstream resumes from that answer, as every client does."""
    with running_server(tmp_path / "data", config_text=USERS_TOML) as server:
        create_delayed(server, "orders")
        wait_scheduler(server, "orders")
        first, second = [b"first-1", b"first-2"], [b"second-1", b"second-2"]
        await schedule(server, "orders", first, delay_ms=300, publisher_name="billing")
        await schedule(server, "orders", second, delay_ms=300, publisher_name="billing")
        got = await delivered(server, "orders", first + second, DELIVERY_TIMEOUT)
        assert got == first + second
