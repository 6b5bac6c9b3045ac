"""``tierlog quickstart``: the whole product in one minute on embedded defaults.

Starts a tierlog server on loopback (data dir, filesystem object store and SQLite
metadata store under ``--data-dir``), publishes with the real ``rstream`` client,
shows the data reaching the remote tier and the local segments being freed, then
consumes everything from ``first`` — the oldest records now come back from the remote
tier — and stops the server cleanly (final manifest commit).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import replace
from typing import Any

from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection, TierSection

STREAM = "quickstart"
STREAM_ARGS = {
    "stream-max-segment-size-bytes": str(256 * 1024),
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.2",
    "x-tierlog-local-max-bytes": "1",  # keep only what is not yet tiered + the active segment
}


def _status(server: Server) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.admin_port}/api/streams/{STREAM}"
    guest = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}  # guest:guest, the default user
    with urllib.request.urlopen(urllib.request.Request(url, headers=guest), timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


async def _wait(server: Server, what: str, check: Any, timeout: float = 60.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        status = await loop.run_in_executor(None, _status, server)
        line = (
            f"  local: {status['local']['segments']} segment(s) from offset "
            f"{status['local']['first_offset']} | remote: {status['remote']['fragments']} "
            f"fragment(s), tiered up to {status['remote']['tiered_offset']}"
        )
        if line != last:
            print(line, flush=True)
            last = line
        if check(status):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def run(data_dir: str, messages: int) -> int:
    from rstream import ConsumerOffsetSpecification, OffsetType, Producer
    from rstream.consumer import Consumer, MessageContext

    config = replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0),
        storage=StorageSection(data_dir=data_dir),
        tier=replace(
            TierSection(), retention_interval_seconds=1.0, local_retention_interval_seconds=0.2
        ),
    )
    server = Server(config)
    await server.start()
    print(
        f"tierlog server on 127.0.0.1:{server.stream_port} (admin http://127.0.0.1:"
        f"{server.admin_port}), data in {data_dir}"
    )
    try:
        port = server.stream_port
        async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
            await p.create_stream(STREAM, arguments=STREAM_ARGS, exists_ok=True)
            loop = asyncio.get_running_loop()
            before = (await loop.run_in_executor(None, _status, server))["local"]["next_offset"]
            confirmed = 0

            async def on_confirm(status: Any) -> None:
                nonlocal confirmed
                confirmed += 1

            t0 = time.perf_counter()
            batch = 1000
            for start in range(0, messages, batch):
                n = min(batch, messages - start)
                body = [
                    b"quickstart message %08d " % (before + start + i) + b"." * 70 for i in range(n)
                ]
                await p.send_batch(STREAM, body, on_publish_confirm=on_confirm)
                while confirmed < start + n:  # one batch in flight: one chunk per batch
                    await asyncio.sleep(0.001)
            elapsed = time.perf_counter() - t0
        print(f"published {messages} messages with rstream, all confirmed ({elapsed:.2f} s)")

        print("waiting for the data to reach the remote tier and the local segments to go:")
        status = await _wait(
            server,
            "tiering",
            lambda s: (
                s["remote"]["tiered_offset"] == s["local"]["next_offset"]
                and s["local"]["segments"] == 1
            ),
        )
        local_first = status["local"]["first_offset"]
        total = status["local"]["next_offset"] - status["remote"]["first_offset"]
        print(
            f"offsets [{status['remote']['first_offset']}, {local_first}) now live only in the "
            f"object store ({status['remote']['bytes']} bytes in "
            f"{status['remote']['fragments']} fragments)"
        )

        got: list[tuple[int, bytes]] = []
        done = asyncio.Event()

        async def on_message(msg: Any, ctx: MessageContext) -> None:
            got.append((ctx.offset, bytes(msg)))
            if len(got) >= total:
                done.set()

        consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
        await consumer.start()
        try:
            t0 = time.perf_counter()
            await consumer.subscribe(
                STREAM,
                on_message,
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
            )
            await asyncio.wait_for(done.wait(), 60)
            elapsed = time.perf_counter() - t0
        finally:
            await consumer.close()
        remote = sum(1 for offset, _ in got if offset < local_first)
        print(
            f"consumed {len(got)} messages from 'first' with rstream in {elapsed:.2f} s: "
            f"{remote} from the remote tier, {len(got) - remote} from the local tier"
        )
        print(f"  first: offset {got[0][0]} {got[0][1][:28]!r}")
        print(f"  last:  offset {got[-1][0]} {got[-1][1][:28]!r}")
        ok = len(got) >= total and remote > 0
    finally:
        await server.stop()
    print("server stopped cleanly (final manifest commit done); run again to append more")
    return 0 if ok else 1


def main(data_dir: str, messages: int) -> int:
    return asyncio.run(run(data_dir, messages))
