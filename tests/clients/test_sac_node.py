"""Single active consumer with the official Node.js client (rabbitmq-stream-js-client):
two consumer processes of one group, only the active one receives; its process is
killed and the other takes over at the group's stored offset, no offset reaching both."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from rstream import AMQPMessage, Consumer, Producer

from tests.clients.sac_rstream import stored_offset
from tests.plugins.node_client import NODE_DIR, node_executable
from tests.plugins.tierlog_server import (  # noqa: F401
    TierlogServerProcess,
    session_tierlog_server,
)

DEADLINE_S = 20.0


class NodeConsumer:
    """``sac.mjs`` in its own process; its handled offsets, read as they come."""

    def __init__(self, modules: Path, server: TierlogServerProcess, stream: str) -> None:
        env = dict(os.environ, TIERLOG_NODE_MODULES=str(modules))
        command = [node_executable(), str(NODE_DIR / "sac.mjs"), server.host]
        command += [str(server.stream_port), stream, "grp"]
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        self.offsets: list[int] = []
        self.subscribed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "subscribed":
                self.subscribed.set()
            elif line.strip():
                self.offsets.append(int(line))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _publish(server: TierlogServerProcess, stream: str, count: int, create: bool) -> None:
    async def main() -> None:
        async with Producer(
            host=server.host, port=server.stream_port, username="guest", password="guest"
        ) as producer:
            if create:
                await producer.create_stream(stream)
            # AMQP 1.0 messages: the Node.js client decodes every body as one
            messages = [AMQPMessage(body=b"m%d" % i) for i in range(count)]
            await producer.send_batch(stream, messages)  # type: ignore[arg-type]

    asyncio.run(main())


def _stored(server: TierlogServerProcess, stream: str) -> int | None:
    async def main() -> int | None:
        consumer = Consumer(
            host=server.host, port=server.stream_port, username="guest", password="guest"
        )
        await consumer.start()
        try:
            return await stored_offset(consumer, stream, "grp")
        finally:
            await consumer.close()

    return asyncio.run(main())


def test_node_sac_killed_active_process_hands_over_at_the_stored_offset(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
    node_client_modules: Path,
) -> None:
    server, stream = session_tierlog_server, "sac-node-kill"
    _publish(server, stream, 50, create=True)
    a = NodeConsumer(node_client_modules, server, stream)
    b: NodeConsumer | None = None
    try:
        assert a.subscribed.wait(DEADLINE_S)
        _until(lambda: len(a.offsets) >= 50, "a: the first 50")
        b = NodeConsumer(node_client_modules, server, stream)
        assert b.subscribed.wait(DEADLINE_S)
        _publish(server, stream, 20, create=False)
        _until(lambda: len(a.offsets) >= 70, "a: 70")
        _until(lambda: _stored(server, stream) == a.offsets[-1], "a's offsets stored")
        assert b.offsets == []  # waiting, silent
        a.kill()
        _publish(server, stream, 30, create=False)
        _until(lambda: b is not None and len(b.offsets) >= 30, "b: the 30 after the kill")
        time.sleep(0.3)
    finally:
        a.kill()
        if b is not None:
            b.kill()
    assert len(a.offsets) == 70 and a.offsets == sorted(set(a.offsets))
    assert len(b.offsets) == 30 and b.offsets == sorted(set(b.offsets))
    assert min(b.offsets) > max(a.offsets)  # from the stored offset + 1, nothing twice
