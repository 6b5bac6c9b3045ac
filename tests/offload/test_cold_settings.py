"""Segment mode and compression exclude each other: an offloaded segment holds the local
segment file's chunks as written, so compression or a dictionary on a ``segments`` stream
would be accepted and do nothing. They are refused with a typed error, at creation (stream
arguments) and when a stream's settings are changed. Encryption applies to segment streams
(their segments are offloaded sealed), at creation and turned on later."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.test_offload import SEGMENTS, Running, make_config
from tests.support.keyring import process_keyring
from tierlog.errors import ConfigError
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.remote.encryption import Keyring
from tierlog.remote.settings import StreamSettings
from tierlog.server.app import Server
from tierlog.server.arguments import settings_from_arguments
from tierlog.storage.object_store import open_object_store

CODINGS = [
    {"x-tierlog-compression": "zstd"},
    {"x-tierlog-compression-level": "9"},
    {"x-tierlog-compression": "zstd", "x-tierlog-dictionary": "true"},
    {"x-tierlog-encryption": "true", "x-tierlog-compression": "zstd"},
]


@pytest.fixture(autouse=True)
def keyring() -> Iterator[Keyring]:
    with process_keyring(("k1", bytes(32))) as ring:
        yield ring


@pytest.mark.parametrize("coding", CODINGS)
def test_segment_mode_refuses_every_coding_setting(coding: dict[str, str]) -> None:
    settings_from_arguments(coding)  # valid in fragments mode
    with pytest.raises(ConfigError, match="tier_mode 'fragments' only"):
        settings_from_arguments({**SEGMENTS, **coding})


def test_segment_mode_with_default_codings_is_accepted() -> None:
    s = settings_from_arguments({**SEGMENTS, "x-tierlog-compression": "none"})
    assert s.tier_mode == "segments" and not s.cold_coding
    encrypted = settings_from_arguments({**SEGMENTS, "x-tierlog-encryption": "true"})
    assert encrypted.encryption == "aes-256-gcm"
    assert StreamSettings(tier_mode="segments", encryption="aes-256-gcm").encryption != "none"


async def test_server_refuses_a_compressed_segment_stream_accepts_encryption(
    tmp_path: Path,
) -> None:
    server = Server(make_config(tmp_path))
    await server.start()
    store = open_object_store(f"file://{tmp_path / 'data' / 'objects'}")
    running = Running(server, store)
    try:
        code = await running.create("coded", {**SEGMENTS, "x-tierlog-compression": "zstd"})
        assert code == ResponseCode.PRECONDITION_FAILED
        assert await running.create("seg", SEGMENTS) == ResponseCode.OK
        code, body = await running.http(
            "PATCH", "/seg", {"arguments": {"x-tierlog-compression": "zstd"}}
        )
        assert code == 400 and "tier_mode 'fragments' only" in body["error"]
        assert (await running.status("seg"))["settings"]["compression"] == "none"
        code, body = await running.http(
            "PATCH", "/seg", {"arguments": {"x-tierlog-encryption": "true"}}
        )
        assert code == 200, body
        assert (await running.status("seg"))["settings"]["encryption"] == "aes-256-gcm"
    finally:
        await server.stop()
        store.close()
