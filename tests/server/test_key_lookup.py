"""Key lookup surfaces on a live server: records published with rstream (AMQP message-ids),
tiered, indexed into the key-index manifest, then found through the admin API
(``GET /api/streams/{s}/messages?key=``, guest:guest basic auth) and ``tierlog lookup``;
both return the records themselves, exactly the ones with that key."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import aiohttp
import pytest

from tests.server.test_tiering import STREAM_ARGS, config, status, wait_for
from tierlog.cli import main
from tierlog.formats.amqp import encode_message
from tierlog.remote.key_index_build import index_stream
from tierlog.server.app import Server
from tierlog.storage.meta_store import open_meta_store
from tierlog.storage.object_store import open_object_store

AUTH = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"}


def message(n: int) -> bytes:
    key = "hot" if n % 20 == 0 else f"id-{n}"
    return encode_message(b"body-%d" % n, properties={"message_id": key})


async def test_admin_and_cli_lookups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rstream import Producer

    cfg = config(tmp_path)
    server = Server(cfg)
    await server.start()
    storage = cfg.storage.resolved()
    try:
        async with Producer(
            "127.0.0.1", port=server.stream_port, username="guest", password="guest"
        ) as producer:
            await producer.create_stream("keyed", arguments=STREAM_ARGS)
            for rnd in range(6):  # several 150 ms windows
                await producer.send_batch(
                    "keyed", [message(n) for n in range(rnd * 50, rnd * 50 + 50)]
                )
                await asyncio.sleep(0.2)

        async def tiered() -> bool:
            return bool((await status(server, "keyed"))["remote"]["tiered_offset"] == 300)

        await wait_for(tiered, 60)
        with (
            open_meta_store(storage.meta_store) as meta,
            open_object_store(storage.object_store) as store,
        ):
            committed, built, _ = await asyncio.to_thread(
                index_stream, meta, store, cfg.tier.prefix, "/", "keyed", 150, lambda keys: None
            )
        assert built >= 3 and len(committed.manifest.windows) == built

        async with aiohttp.ClientSession(headers=AUTH) as http:
            base = f"http://127.0.0.1:{server.admin_port}/api/streams/keyed/messages"
            async with http.get(base, params={"key": "hot"}) as response:
                assert response.status == 200
                hot = await response.json()
            async with http.get(base, params={"key": "id-7"}) as response:
                one = await response.json()
            async with http.get(base) as response:
                assert response.status == 400  # no key
            async with http.get(base, params={"key": "x", "from": "yesterday"}) as response:
                assert response.status == 400
                assert "ISO-8601" in (await response.json())["error"]
            missing = f"http://127.0.0.1:{server.admin_port}/api/streams/nope/messages"
            async with http.get(missing, params={"key": "x"}) as response:
                assert response.status == 404
            async with (
                aiohttp.ClientSession() as anonymous,
                anonymous.get(base, params={"key": "hot"}) as response,
            ):
                assert response.status == 401
        assert hot["windows"] == built
        hot_bodies = [base64.b64decode(m["body"]) for m in hot["messages"]]
        hot_offsets = [m["offset"] for m in hot["messages"]]
        # every hot record of the complete (indexed) windows: the first rounds for sure
        assert hot_offsets == sorted(hot_offsets) and {0, 20, 40} <= set(hot_offsets)
        assert set(hot_offsets) <= set(range(0, 300, 20))
        assert hot_bodies == [message(o) for o in hot_offsets]  # the records themselves
        assert [m["offset"] for m in one["messages"]] == [7]
        assert base64.b64decode(one["messages"][0]["body"]) == message(7)

        code = await asyncio.to_thread(
            main,
            [
                "lookup",
                "keyed",
                "hot",
                "--object-store",
                storage.object_store,
                "--meta-store",
                storage.meta_store,
                "--prefix",
                cfg.tier.prefix,
            ],
        )
        assert code == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert lines == hot["messages"]
        code = await asyncio.to_thread(
            main,
            [
                "lookup",
                "keyed",
                "hot",
                "--from",
                "1970-01-01T00:00:00",
                "--to",
                "0",
                "--object-store",
                storage.object_store,
                "--meta-store",
                storage.meta_store,
            ],
        )
        assert code == 0 and capsys.readouterr().out == ""  # nothing in that range
    finally:
        await server.stop()
