"""Disk full: the local disk and the object store's disk (tmpfs mounts; needs root) fill up
mid-publish and mid-commit, then are freed. No confirmed message is lost, publishing
resumes, and tiering catches up on its own."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.test_server_inprocess import AsyncRawClient
from tests.test_server_tiering import STREAM_ARGS, config, status, wait_for
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish
from tierlog.server.app import Server
from tierlog.server.config import StorageSection

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting tmpfs needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Take every free byte of the file system holding ``directory``."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    block = b"\xff" * 4096
    try:
        while True:
            os.write(fd, block)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


RETRY_PAUSE = 0.05
"""Seconds a publisher waits after a retriable STREAM_NOT_AVAILABLE (the stream is
reopening through recovery, then resolving its remote tier)."""
RESUME_WITHIN = 20.0
"""Seconds within which publishing must resume once the disk has space again."""


class Publisher:
    """Publishes numbered messages; after the stream went away (it is reopened after an
    I/O error) it declares itself again, as clients do after a MetadataUpdate."""

    def __init__(self, client: AsyncRawClient) -> None:
        self.client = client
        self.publisher_id = 1
        self.next_id = 1
        self.confirmed: set[int] = set()
        self.refused = 0

    async def publish(self, frames: int) -> None:
        for _ in range(frames):
            ids = list(range(self.next_id, self.next_id + 10))
            self.next_id += 10
            batch = [(i, b"m%08d" % i + b"x" * 2000) for i in ids]
            self.client.send(encode_publish(self.publisher_id, batch))
            frame = await self.client.expect((PublishConfirm, PublishError))
            if isinstance(frame, PublishConfirm):
                self.confirmed.update(frame.publishing_ids)
                continue
            self.refused += len(frame.errors)
            codes = {code for _, code in frame.errors}
            if ResponseCode.STREAM_NOT_AVAILABLE in codes:
                await asyncio.sleep(RETRY_PAUSE)  # retriable: a client retries after a pause
            gone = {ResponseCode.STREAM_DOES_NOT_EXIST, ResponseCode.PUBLISHER_DOES_NOT_EXIST}
            if codes & gone:
                self.publisher_id += 1
                await self.client.request(
                    c.DeclarePublisherRequest(
                        self.client.next_corr(), self.publisher_id, "", "full"
                    )
                )


async def start_server(tmp_path: Path, local: Path, objects: Path) -> Server:
    cfg = replace(
        config(tmp_path),
        storage=StorageSection(
            data_dir=str(local / "data"),
            meta_store=f"sqlite://{tmp_path / 'meta.db'}",
            object_store=f"file://{objects / 'store'}",
        ),
    )
    server = Server(cfg)
    await server.start()
    await server.streams_opened()  # streams open in the background
    return server


async def open_publisher(server: Server) -> Publisher:
    client = await AsyncRawClient.connect(server.stream_port)
    response = await client.request(c.CreateRequest(client.next_corr(), "full", STREAM_ARGS))
    assert response.response_code == ResponseCode.OK
    await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "full"))
    pub = Publisher(client)
    await pub.publish(20)
    assert len(pub.confirmed) == 200
    return pub


async def check_all_confirmed_once(server: Server, pub: Publisher) -> None:
    got = await consume(server, max(pub.confirmed))
    ids = [int(body[1:9]) for _, body in got]
    assert ids == sorted(set(ids)), "duplicated or out of order"
    assert pub.confirmed <= set(ids), f"confirmed lost: {sorted(pub.confirmed - set(ids))[:5]}"


async def test_local_disk_full_mid_publish(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "local", "6m") as local, tmpfs(tmp_path / "objects", "64m") as objects:
        server = await start_server(tmp_path, local, objects)
        try:
            pub = await open_publisher(server)
            filler = fill(local)  # the local disk fills mid-publish
            await pub.publish(20)
            assert pub.refused > 0, "nothing can be confirmed on a full disk"
            filler.unlink()
            before = len(pub.confirmed)
            deadline = asyncio.get_running_loop().time() + RESUME_WITHIN
            # publishing resumes once the stream reopened (recovery) and resolved its tiers
            while asyncio.get_running_loop().time() < deadline:
                await pub.publish(1)
                if len(pub.confirmed) - before >= 100:
                    break
            assert len(pub.confirmed) - before >= 100, "publishing did not resume"
            pub.client.close()
            await check_all_confirmed_once(server, pub)
        finally:
            await server.stop()


async def test_object_store_disk_full_mid_commit(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "local", "64m") as local, tmpfs(tmp_path / "objects", "6m") as objects:
        server = await start_server(tmp_path, local, objects)
        try:
            pub = await open_publisher(server)
            store_filler = fill(objects)  # uploads and commits fail mid-flight
            await pub.publish(20)
            await asyncio.sleep(2.5)  # fragments are cut (age 1 s) and fail to upload/commit
            store_filler.unlink()

            async def tiered() -> bool:
                s = await status(server, "full")
                return s["remote"]["tiered_offset"] == s["local"]["next_offset"]

            await wait_for(tiered, timeout=15)  # tiering resumes on its own
            pub.client.close()
            await check_all_confirmed_once(server, pub)
        finally:
            await server.stop()


async def consume(server: Server, last_id: int) -> list[tuple[int, bytes]]:
    from rstream import ConsumerOffsetSpecification, OffsetType
    from rstream.consumer import Consumer, MessageContext

    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: object, ctx: MessageContext) -> None:
        body = bytes(msg)  # type: ignore[call-overload]
        got.append((ctx.offset, body))
        if int(body[1:9]) >= last_id:
            done.set()

    consumer = Consumer("127.0.0.1", port=server.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(
            "full", on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
        )
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await consumer.close()
    return got
