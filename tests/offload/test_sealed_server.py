"""An encrypted segment-mode stream end to end: a real server (filesystem store and
SeaweedFS), the rstream client, publish, offload, local copies freed, every message read back
exactly once and in order from the sealed segments; nothing of the stream's content in its
objects or their keys; scrub clean; a tampered object is a typed error for the cross-tier
reader and a problem for scrub, and the rstream consumer never gets wrong data; key rotation:
segments sealed under a key the process no longer holds are refused naming that key."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from tests.server.test_offload import (
    FRAMES,
    SEGMENTS,
    TOTAL,
    Running,
    consume_all_from_first,
    expected_bodies,
    running,  # noqa: F401 - the server fixture (filesystem and SeaweedFS)
    wait_for,
)
from tests.support.keyring import process_keyring
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.log.offset_spec import OffsetSpec
from tierlog.read.errors import RemoteDataCorruptError
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.committed import CatalogCommittedManifest
from tierlog.remote.encryption import Keyring, set_process_keyring
from tierlog.remote.sealing import is_sealed
from tierlog.spark.jobs.scrub import check_fragment

K1 = ("k1", bytes(range(32)))
K2 = ("k2", bytes(range(32, 64)))
ENCRYPTED = {**SEGMENTS, "x-tierlog-encryption": "true"}


@pytest.fixture(autouse=True)
def keyring() -> Iterator[Keyring]:
    with process_keyring(K1) as ring:
        yield ring


def manifest_source(srv: Running, incarnation: str) -> ManifestSource:
    tiering = srv.server.tiering
    assert tiering is not None
    committed = CatalogCommittedManifest(
        tiering.catalog, tiering.store, tiering.tier.prefix, incarnation
    )
    return ManifestSource(committed)


def read_in_process(srv: Running, incarnation: str, start: int = 0) -> list[bytes]:
    source = manifest_source(srv, incarnation)
    with TieredReader(None, source, OffsetSpec.offset(start)) as reader:
        return [bytes(body) for _, body in reader.records()]


async def consume_for(port: int, name: str, seconds: float) -> list[tuple[int, bytes]]:
    """What a consumer from ``first`` receives within ``seconds`` (it may stop early)."""
    from rstream import ConsumerOffsetSpecification, OffsetType
    from rstream.consumer import Consumer, MessageContext

    got: list[tuple[int, bytes]] = []

    async def on_message(msg: object, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))  # type: ignore[call-overload]

    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(
            name,
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        await asyncio.sleep(seconds)
    finally:
        await consumer.close()
    return got


async def offload_everything(srv: Running, name: str, before: int) -> int:
    code, body = await srv.http("PUT", f"/{name}/offload", {"before": before})
    assert code == 202, body

    async def done() -> bool:
        _, body = await srv.http("GET", f"/{name}/offload")
        return bool(body["status"] == "success")

    await wait_for(done)
    _, body = await srv.http("GET", f"/{name}/offload")
    first: int = body["first_unoffloaded_offset"]

    async def freed() -> bool:
        s = await srv.status(name)
        return bool(s["local"]["first_offset"] == first)

    await wait_for(freed)
    return first


async def test_encrypted_segment_stream_end_to_end(running: Running) -> None:  # noqa: F811
    assert await running.create("enc", ENCRYPTED) == ResponseCode.OK
    assert (await running.status("enc"))["settings"]["encryption"] == "aes-256-gcm"
    await running.publish("enc")
    first_local = await offload_everything(running, "enc", TOTAL)
    assert first_local > 0
    await consume_all_from_first(running.server.stream_port, "enc")
    incarnation = (await running.status("enc"))["incarnation"]
    assert read_in_process(running, incarnation)[:first_local] == expected_bodies()[:first_local]

    # every object sealed; keys: the stream directory, offsets and uids, nothing else
    keys = running.keys(incarnation)
    data_keys = [k for k in keys if k.endswith(".data")]
    assert data_keys and len([k for k in keys if k.endswith(".index")]) == len(data_keys)
    shape = re.compile(
        rf"stream/{re.escape(incarnation)}/(segments/\d{{20}}\.[0-9a-f]{{32}}\.(data|index)"
        r"|metadata/root\.[0-9a-f]{32}\.manifest)"
    )
    for key in keys:
        assert shape.fullmatch(key), key
        stored = running.store.get(key)
        assert stored[:4] == b"TLSD" if key.endswith(".data") else is_sealed(stored)
        for k in range(FRAMES):  # the bodies are runs of one byte value
            assert bytes([k]) * 64 not in stored

    # scrub: clean
    source = manifest_source(running, incarnation)
    entries = [loc.entry for loc in source.tree().iter_fragments(running.store.get)]
    assert entries and all(e.is_segment for e in entries)
    assert [check_fragment(running.store, e) for e in entries] == [None] * len(entries)

    # tampered: one byte in the middle of the second segment's data object
    victim = entries[1]
    data = running.store.get(victim.key)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x01
    running.store.put(victim.key, bytes(bad))
    with pytest.raises(RemoteDataCorruptError):
        read_in_process(running, incarnation)
    problem = check_fragment(running.store, victim)
    assert problem is not None and problem["kind"] == "corrupt-fragment"
    got = await consume_for(running.server.stream_port, "enc", 3.0)
    assert len(got) < TOTAL  # stops at the damage (or before: reads run ahead) ...
    assert [b for _, b in got] == expected_bodies()[: len(got)]  # ... never wrong data
    assert [o for o, _ in got] == list(range(len(got)))
    running.store.put(victim.key, data)

    # rotation: k2 becomes current; segments offloaded from now on are sealed under it
    set_process_keyring(Keyring([K2, K1]))
    await running.publish("enc", FRAMES)
    second_local = await offload_everything(running, "enc", 2 * TOTAL)
    assert second_local > first_local
    everything = expected_bodies() + expected_bodies()
    assert read_in_process(running, incarnation)[:second_local] == everything[:second_local]
    # k1 dropped: the old segments are refused naming it, the new ones still read
    set_process_keyring(Keyring([K2]))
    with pytest.raises(RemoteDataCorruptError, match="'k1'"):
        read_in_process(running, incarnation)
    tree = manifest_source(running, incarnation).tree()
    new_entries = [loc.entry for loc in tree.iter_fragments(running.store.get)]
    new_first = next(e.first_offset for e in new_entries if e.first_offset >= first_local)
    got_new = read_in_process(running, incarnation, new_first)
    assert got_new[: second_local - new_first] == everything[new_first:second_local]
    problem = check_fragment(running.store, entries[0])
    assert problem is not None and problem["kind"] == "undecodable-fragment"
    assert "'k1'" in problem["detail"]
