"""Single active consumer with rstream against ``tierlog serve``: of two consumers of one
group only the active one receives; when it is closed, or its process killed, the other
takes over at the group's stored offset, and no offset reaches both."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rstream import Consumer, Producer

from tests.clients.sac_rstream import sac_consumer, stored_offset
from tests.plugins.tierlog_server import (  # noqa: F401
    TierlogServerProcess,
    session_tierlog_server,
)

DEADLINE_S = 20.0


async def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _publish(server: TierlogServerProcess, stream: str, count: int, create: bool) -> None:
    async with Producer(
        host=server.host, port=server.stream_port, username="guest", password="guest"
    ) as producer:
        if create:
            await producer.create_stream(stream)
        await producer.send_batch(stream, [b"m%d" % i for i in range(count)])


async def _stored(server: TierlogServerProcess, stream: str, name: str) -> int | None:
    consumer = Consumer(
        host=server.host, port=server.stream_port, username="guest", password="guest"
    )
    await consumer.start()
    try:
        return await stored_offset(consumer, stream, name)
    finally:
        await consumer.close()


def test_closed_active_consumer_hands_over_at_the_stored_offset(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    server = session_tierlog_server
    stream, name = "sac-rstream-close", "grp"

    async def main() -> tuple[list[int], list[int]]:
        await _publish(server, stream, 100, create=True)
        got_a: list[int] = []
        got_b: list[int] = []
        a = await sac_consumer(server.host, server.stream_port, stream, name, got_a.append)
        await _until(lambda: len(got_a) >= 100, "a: the first 100")
        b = await sac_consumer(server.host, server.stream_port, stream, name, got_b.append)
        await _publish(server, stream, 50, create=False)
        await _until(lambda: len(got_a) >= 150, "a: 150")
        await asyncio.sleep(0.5)
        assert got_b == []  # waiting, silent
        await a.close()
        await _publish(server, stream, 30, create=False)
        await _until(lambda: len(got_b) >= 30, "b: the 30 after the hand-over")
        await asyncio.sleep(0.3)
        await b.close()
        return got_a, got_b

    got_a, got_b = asyncio.run(main())
    _check_hand_over(got_a, 150, got_b, 30)


def _check_hand_over(got_a: list[int], count_a: int, got_b: list[int], count_b: int) -> None:
    """Each got its messages once, in order, B only those after A's last one (offsets are
    not dense: each StoreOffset is a tracking chunk of the stream's log)."""
    assert len(got_a) == count_a and got_a == sorted(set(got_a))
    assert len(got_b) == count_b and got_b == sorted(set(got_b))
    assert min(got_b) > max(got_a)  # from a's stored offset + 1, nothing twice


def test_killed_active_consumer_process_hands_over_at_the_stored_offset(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    server = session_tierlog_server
    stream, name = "sac-rstream-kill", "grp"
    out = tmp_path / "a.offsets"
    out.touch()

    def handled_by_a() -> list[int]:
        return [int(line) for line in out.read_text().split()]

    async def main() -> list[int]:
        await _publish(server, stream, 100, create=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        command = [sys.executable, "-m", "tests.clients.sac_rstream"]
        args = [server.host, str(server.stream_port), stream, name, str(out)]
        proc = subprocess.Popen([*command, *args], env=env, stdout=subprocess.PIPE)
        try:
            await _until(lambda: len(handled_by_a()) >= 100, "the process: the first 100")
            got_b: list[int] = []
            b = await sac_consumer(server.host, server.stream_port, stream, name, got_b.append)
            await _publish(server, stream, 20, create=False)
            await _until(lambda: len(handled_by_a()) >= 120, "the process: 120")
            # its last StoreOffset reached the server before the kill (no frame lost in it)
            deadline = time.monotonic() + DEADLINE_S
            while await _stored(server, stream, name) != max(handled_by_a()):
                assert time.monotonic() < deadline, "the process's offsets were not stored"
                await asyncio.sleep(0.05)
            assert got_b == []
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            await _publish(server, stream, 30, create=False)
            await _until(lambda: len(got_b) >= 30, "b: the 30 after the kill")
            await asyncio.sleep(0.3)
            await b.close()
            return got_b
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    got_b = asyncio.run(main())
    _check_hand_over(handled_by_a(), 120, got_b, 30)
