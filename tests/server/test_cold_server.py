"""End to end on the server with real rstream clients: a stream created with compression, a
dictionary and encryption is published to, tiered as v2 fragments, its local segments freed,
and consumed from the first offset: every body comes back, in order, exactly once."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.server.test_tiering import STREAM_ARGS, config, rstream_consume, status, wait_for
from tests.tiering.test_cold import KEK, event_bodies
from tierlog.formats.fragment import TRAILER_SIZE
from tierlog.formats.fragment_v2 import FragmentTrailerV2, decode_trailer
from tierlog.remote.encryption import Keyring, reset_process_keyring, set_process_keyring
from tierlog.server.app import Server
from tierlog.storage.object_store import open_object_store

COLD_ARGS = {
    **STREAM_ARGS,
    "x-tierlog-compression": "zstd",
    "x-tierlog-compression-level": "5",
    "x-tierlog-dictionary": "true",
    "x-tierlog-encryption": "true",
}


async def test_rstream_round_trip_through_compressed_encrypted_fragments(tmp_path: Path) -> None:
    from rstream import ConsumerOffsetSpecification, OffsetType, Producer

    set_process_keyring(Keyring([("k1", KEK)]))
    cfg = config(tmp_path)
    server = Server(cfg)
    await server.start()
    try:
        bodies = event_bodies(random.Random(11), 3000)
        async with Producer(
            "127.0.0.1", port=server.stream_port, username="guest", password="guest"
        ) as producer:
            await producer.create_stream("cold", arguments=COLD_ARGS)
            for i in range(0, len(bodies), 250):  # rounds: several chunks and segments
                await producer.send_batch("cold", list(bodies[i : i + 250]))
                await asyncio.sleep(0.15)

        async def freed() -> bool:
            s = await status(server, "cold")
            return (
                s["remote"]["tiered_offset"] == s["local"]["next_offset"] == len(bodies)
                and s["local"]["first_offset"] > 0
            )

        await wait_for(freed, 60)
        got = await rstream_consume(
            server.stream_port, "cold", ConsumerOffsetSpecification(OffsetType.FIRST), len(bodies)
        )
        assert [o for o, _ in got] == list(range(len(bodies)))
        assert [b for _, b in got] == bodies
        store = open_object_store(cfg.storage.resolved().object_store)
        keys = [m.key for m in store.list() if m.key.endswith(".fragment")]
        assert keys
        for key in keys:
            assert isinstance(
                decode_trailer(store.get_suffix(key, TRAILER_SIZE)), FragmentTrailerV2
            )
            assert b"page_view" not in store.get(key)  # sealed
        stored = sum(store.head(k).size for k in keys)
        assert stored < sum(len(b) for b in bodies) / 2
        # the compression metrics say the same: bytes in, bytes out, ratio, trainings
        text, _ = server.metrics.exposition()
        samples = {
            line.split("{")[0]: float(line.split()[-1])
            for line in text.decode().splitlines()
            if line.startswith("tierlog_cold_") and 'stream="cold"' in line
        }
        chunk_in = samples["tierlog_cold_chunk_bytes_total"]
        stored_out = samples["tierlog_cold_stored_bytes_total"]
        assert chunk_in >= sum(len(b) for b in bodies) and 0 < stored_out < chunk_in / 2
        assert samples["tierlog_cold_compression_ratio"] == pytest.approx(chunk_in / stored_out)
        assert samples["tierlog_cold_dictionary_trainings_total"] >= 1
    finally:
        await server.stop()
        reset_process_keyring()


async def test_encrypted_stream_needs_a_configured_key(tmp_path: Path) -> None:
    from rstream import Producer
    from rstream.exceptions import PreconditionFailed

    set_process_keyring(None)
    server = Server(config(tmp_path))
    await server.start()
    try:
        async with Producer(
            "127.0.0.1", port=server.stream_port, username="guest", password="guest"
        ) as producer:
            with pytest.raises(PreconditionFailed):  # no key-encryption key configured
                await producer.create_stream("enc", arguments={"x-tierlog-encryption": "true"})
            with pytest.raises(PreconditionFailed):
                await producer.create_stream("bad", arguments={"x-tierlog-compression": "lzma"})
            with pytest.raises(PreconditionFailed):  # a dictionary needs zstd
                await producer.create_stream("bad", arguments={"x-tierlog-dictionary": "true"})
    finally:
        await server.stop()
        reset_process_keyring()
