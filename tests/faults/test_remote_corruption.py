"""Corrupt data at the tier boundary: a local chunk that fails its CRC is never uploaded
(tiering halts with an alarm), and a corrupt remote fragment ends a subscription visibly
(MetadataUpdate, error log, metric), never silently."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.plugins.tiering_world import LOG, World
from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import STREAM_ARGS, config, publish, status, wait_for
from tierlog.formats.chunk import HEADER_SIZE
from tierlog.formats.fragment import decode_trailer
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import Catalog
from tierlog.remote.keys import data_prefix
from tierlog.server.app import Server
from tierlog.storage.errors import StorageError, TransientError


def test_chunk_failing_its_crc_is_never_uploaded(world: World) -> None:
    world.append(40)
    segments = world.log.list_segments()
    assert len(segments) >= 2 and segments[0].sealed
    with LogReader(world.log, OffsetSpec.first(), user_only=False) as reader:
        chunks = [
            (c.header.chunk_id, c.position)
            for c in reader.chunks()
            if c.segment_path == segments[0].segment_path and c.header.chunk_type == 0
        ]
    victim_id, victim_pos = chunks[len(chunks) // 4]
    with open(segments[0].segment_path, "r+b") as f:  # bit rot in a sealed segment
        f.seek(victim_pos + HEADER_SIZE + 10)
        byte = f.read(1)[0]
        f.seek(victim_pos + HEADER_SIZE + 10)
        f.write(bytes([byte ^ 0x01]))
    tierer = world.tierer()
    tierer.start()
    deadline = time.monotonic() + 20
    while tierer.halted is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tierer.halted is not None and "CRC" in tierer.halted
    assert f"chunk {victim_id}" in tierer.halted
    prefix = data_prefix("", world.record.incarnation)
    for meta in world.store.list(prefix):
        trailer = decode_trailer(world.store.get_suffix(meta.key, 96))
        assert not trailer.first_offset <= victim_id < trailer.next_offset, meta.key
    assert tierer.durable_next <= victim_id


async def test_corrupt_remote_fragment_ends_the_subscription_visibly(tmp_path: Path) -> None:
    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        response = await client.request(c.CreateRequest(client.next_corr(), "rot", STREAM_ARGS))
        assert response.response_code == ResponseCode.OK
        await publish(client, "rot", 30)

        async def freed() -> bool:
            s = await status(server, "rot")
            return (
                s["remote"]["tiered_offset"] == s["local"]["next_offset"]
                and s["local"]["first_offset"] > 0
            )

        await wait_for(freed)
        fragments = sorted(glob.glob(str(tmp_path / "**" / "*.fragment*"), recursive=True))
        assert fragments
        first = fragments[0]
        with open(first, "r+b") as f:  # one flipped bit in the first fragment's chunk data
            f.seek(8 + HEADER_SIZE + 100)
            byte = f.read(1)[0]
            f.seek(8 + HEADER_SIZE + 100)
            f.write(bytes([byte ^ 0x10]))
        spec = c.WireOffsetSpec(OffsetType.FIRST)
        sub = c.SubscribeRequest(client.next_corr(), 7, "rot", spec, 10)
        assert (await client.request(sub)).response_code == ResponseCode.OK
        update = await client.expect(c.MetadataUpdate)
        assert update.code == ResponseCode.STREAM_NOT_AVAILABLE and update.stream == "rot"
        unreadable = "tierlog_subscription_unreadable_data_total"
        assert server.metrics.value(unreadable, kind="remote") == 1
        assert os.path.exists(first)
        client.close()
    finally:
        await server.stop()


def test_timestamps_stay_monotonic_across_a_restart_at_the_remote_tail(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote tail's clock ran ahead (or this host's clock went back): the restarted
    local log stamps no chunk below the remote tail's newest timestamp."""
    import tierlog.log.writer as writer_module

    ahead_ms = 3_600_000
    real = time.time_ns
    monkeypatch.setattr(writer_module.time, "time_ns", lambda: real() + ahead_ms * 1_000_000)
    tierer = world.tierer()
    tierer.start()
    world.append(5)
    assert tierer.flush()
    tierer.stop(flush=False)
    remote_max = tierer.committer.tree.header().max_timestamp
    monkeypatch.setattr(writer_module.time, "time_ns", real)
    stream_dir = world.log.stream_dir
    world.log.close()
    shutil.rmtree(stream_dir)
    world.log = StreamLog.create(
        world.data_dir, "/", "orders", LOG, created_ns=world.record.created_ns
    )
    fresh = world.tierer(epoch=1)
    assert fresh.start().restarted_local
    world.append(2)
    with LogReader(world.log, OffsetSpec.first(), user_only=False) as reader:
        stamps = [c.header.timestamp for c in reader.chunks()]
    assert stamps and min(stamps) >= remote_max


class LateApplyingMeta:
    """A MetaStore whose first pointer put times out without applying yet, then applies
    later (on the second call after it): an ambiguous conditional put, as on etcd."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self._late: tuple[str, bytes, int, int] | None = None
        self._calls_after = 0
        self.armed = True

    def _maybe_apply_late(self) -> None:
        if self._late is not None:
            self._calls_after += 1
            if self._calls_after >= 2:
                late, self._late = self._late, None
                with contextlib.suppress(StorageError):
                    self._inner.put_if(*late)  # type: ignore[attr-defined]

    def get(self, key: str) -> object:
        self._maybe_apply_late()
        return self._inner.get(key)  # type: ignore[attr-defined]

    def put_if(self, key: str, value: bytes, expected_version: int, epoch: int) -> object:
        self._maybe_apply_late()
        if self.armed and key.startswith("pointer/"):
            self.armed = False
            self._late = (key, value, expected_version, epoch)
            raise TransientError("put_if timed out (outcome unknown)")
        return self._inner.put_if(key, value, expected_version, epoch)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_ambiguous_pointer_put_never_orphans_the_published_root(world: World) -> None:
    tierer = world.tierer()
    tierer.start()
    world.append(5)
    assert tierer.flush()
    tierer.stop(flush=False)
    late = LateApplyingMeta(world.meta)
    tierer = world.tierer(meta=late)  # type: ignore[arg-type]
    tierer.start()  # the fencing commit's pointer put is ambiguous and applies late
    world.append(5)
    assert tierer.flush(timeout=20)
    tierer.stop(flush=False)
    pointer = Catalog(world.meta).read_pointer(world.record.incarnation)
    assert pointer is not None and pointer.root_uid is not None
    root = world.store.get(tierer.remote.root_key(bytes.fromhex(pointer.root_uid)))
    assert root  # the published root exists: nothing unpublished-looking was deleted
    fresh = world.tierer()
    fresh.start()
    assert fresh.durable_next == world.log.commit_point().next_offset
