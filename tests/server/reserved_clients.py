"""Shared pieces of the reserved-name tests: a ``tierlog serve`` configuration with users of
limited permissions, admin calls as any user, and rstream producers and consumers of
scheduled messages."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.error
import urllib.request
from typing import Any

from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.consumer import Consumer, MessageContext
from rstream.producer import ConfirmationStatus

from tests.plugins.tierlog_server import TierlogServerProcess

HOST = "127.0.0.1"
PASSWORDS = {
    "guest": "guest",
    "writer": "writer-pw",
    "reader": "reader-pw",
    "limited": "limited-pw",
    "ops": "ops-pw",
}
"""guest: full access to ``/`` and the administrator tag (the default); writer: write
only; reader: read only; limited: everything but ``prod-*`` (a pattern that matches the
empty name); ops: the administrator tag and no stream permission at all."""

USERS_TOML = """
[auth]
users = { guest = "guest", writer = "writer-pw", reader = "reader-pw", limited = "limited-pw", ops = "ops-pw" }
loopback_users = ["guest"]
tags = { guest = ["administrator"], ops = ["administrator"] }

[auth.permissions.writer]
"/" = { configure = "", write = ".*", read = "" }

[auth.permissions.reader]
"/" = { configure = "", write = "", read = ".*" }

[auth.permissions.limited]
"/" = { configure = "^(?!prod-).*", write = "^(?!prod-).*", read = "^(?!prod-).*" }

[auth.permissions.ops]
"/" = { configure = "", write = "", read = "" }
"""  # noqa: E501 - one TOML line


def admin(
    server: TierlogServerProcess,
    method: str,
    path: str,
    body: Any = None,
    user: str = "guest",
) -> tuple[int, Any]:
    """(status, JSON body) of an admin request as ``user``."""
    data = None if body is None else json.dumps(body).encode()
    auth = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    headers = {"Authorization": f"Basic {auth}", "Content-Type": "application/json"}
    request = urllib.request.Request(
        f"{server.admin_url}{path}", data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def create_delayed(server: TierlogServerProcess, name: str) -> None:
    status, body = admin(
        server, "POST", "/api/streams", {"name": name, "arguments": {"x-tierlog-delayed": "true"}}
    )
    assert status == 201, body


def wait_scheduler(server: TierlogServerProcess, stream: str) -> None:
    """Until the stream's scheduler answers (started, or rebuilt after a restart)."""
    for _ in range(300):
        if admin(server, "GET", f"/api/streams/{stream}/delayed")[0] == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"the scheduler of {stream} did not start:\n{server.log_tail()}")


def producer(server: TierlogServerProcess, user: str = "guest") -> Producer:
    return Producer(HOST, port=server.stream_port, username=user, password=PASSWORDS[user])


def consumer(server: TierlogServerProcess, user: str = "guest") -> Consumer:
    return Consumer(HOST, port=server.stream_port, username=user, password=PASSWORDS[user])


async def schedule(
    server: TierlogServerProcess,
    stream: str,
    bodies: list[bytes],
    delay_ms: int,
    publisher_name: str = "app",
) -> None:
    """Publish ``bodies`` as scheduled messages (``x-delay``) from ``publisher_name`` and
    wait until every one is confirmed (accepted: durable in the system stream); rstream
    resumes the name's publishing ids from QueryPublisherSequence."""
    confirmed: list[int] = []

    async def on_confirm(status: ConfirmationStatus) -> None:
        assert status.is_confirmed, status
        confirmed.append(status.message_id)

    async with producer(server) as p:
        for body in bodies:
            message = AMQPMessage(body=body, application_properties={"x-delay": delay_ms})
            await p.send(
                stream, message, publisher_name=publisher_name, on_publish_confirm=on_confirm
            )
        for _ in range(200):
            if len(confirmed) == len(bodies):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"scheduled messages not confirmed: {confirmed}")


async def delivered(
    server: TierlogServerProcess, stream: str, want: list[bytes], timeout: float
) -> list[bytes]:
    """Which of ``want`` (message bodies) the stream holds within ``timeout`` seconds."""
    seen: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        raw = bytes(msg)
        seen.extend(body for body in want if body in raw)
        if all(body in seen for body in want):
            done.set()

    async with consumer(server) as c:
        await c.subscribe(
            stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)
    return [body for body in want if body in seen]


def scrape(server: TierlogServerProcess, name: str) -> float:
    """The value of an unlabelled metric on ``/metrics`` (0 when absent)."""
    with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=20) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
