"""Process-level faults of ``tierlog serve``: a failed fdatasync makes the stream reopen
(recovery) before it accepts more; a second server on the same data directory refuses
to start."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.faults.test_local_damage import consume_all_n
from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import config, wait_for
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import PublishConfirm, PublishError, encode_publish
from tierlog.server.app import Server
from tierlog.server.errors import DataDirLockedError


async def test_second_server_on_the_same_data_directory_refuses_to_start(
    tmp_path: Path,
) -> None:
    first = Server(config(tmp_path))
    await first.start()
    try:
        second = Server(config(tmp_path))
        with pytest.raises(DataDirLockedError, match=str(os.getpid())):
            await second.start()
    finally:
        await first.stop()
    third = Server(config(tmp_path))  # released on stop (and by the kernel on a crash)
    await third.start()
    await third.stop()


async def test_failed_fdatasync_reopens_the_stream_before_accepting_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tierlog.log.writer as writer_module

    server = Server(config(tmp_path))
    await server.start()
    await server.streams_opened()  # streams open in the background
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        response = await client.request(c.CreateRequest(client.next_corr(), "fs", {}))
        assert response.response_code == ResponseCode.OK
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "fs"))
        client.send(encode_publish(1, [(1, b"one")]))
        await client.expect(PublishConfirm)
        assert server.broker is not None
        before = server.broker.get("/", "fs")
        assert before is not None
        real = os.fdatasync
        failures = [0]

        def failing(fd: int) -> None:
            if failures[0] == 0:
                failures[0] += 1
                raise OSError(errno.EIO, "injected write-back error")
            real(fd)

        monkeypatch.setattr(writer_module.os, "fdatasync", failing)
        client.send(encode_publish(1, [(2, b"two")]))
        error = await client.expect(PublishError)
        assert {code for _, code in error.errors} == {ResponseCode.STREAM_NOT_AVAILABLE}

        async def reopened() -> bool:
            assert server.broker is not None
            handle = server.broker.get("/", "fs")
            return handle is not None and handle is not before and handle.unavailable is None

        await wait_for(reopened)
        client.close()
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "fs"))
        client.send(encode_publish(1, [(3, b"three")]))
        await client.expect(PublishConfirm)
        client.close()
        got = await consume_all_n(server, "fs", 2)
        bodies = [b for _, b in got]
        assert bodies[0] == b"one" and bodies[-1] == b"three"
        assert len([o for o, _ in got]) == len({o for o, _ in got})
    finally:
        await server.stop()
