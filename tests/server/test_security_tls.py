"""TLS with real clients: rstream over the TLS listener (PLAIN and, with a client
certificate, SASL EXTERNAL taking the user from the CN), HTTPS admin API."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rstream import Consumer, Producer, SlasMechanism
from rstream.consumer import MessageContext
from rstream.exceptions import AccessRefused
from rstream.utils import RawMessage

from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.certificates import CertFiles, make_certificates
from tierlog.errors import ConfigError
from tierlog.server.app import Server
from tierlog.server.auth import parse_permissions
from tierlog.server.config import (
    AuthSection,
    ServerConfig,
    ServerSection,
    StorageSection,
    TlsSection,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_config(tmp_path: Path, certs: CertFiles, **tls: Any) -> ServerConfig:
    auth = AuthSection(
        users={"guest": "guest", "alice": "alice-pw"},
        permissions=parse_permissions(
            {"alice": {"/": {"configure": "alice-.*", "write": "alice-.*", "read": "alice-.*"}}}
        ),
    )
    section = TlsSection(
        certfile=str(certs.server_cert), keyfile=str(certs.server_key), port=0, **tls
    )
    return replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
        auth=auth,
        tls=section,
    ).validate()


def client_context(certs: CertFiles, with_cert: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if with_cert is not None:
        context.load_cert_chain(str(with_cert), str(with_cert.with_suffix(".key")))
    return context


@pytest.fixture
async def tls_server(tmp_path: Path, certs: CertFiles) -> AsyncIterator[Server]:
    server = Server(tls_config(tmp_path, certs))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def round_trip(producer: Producer, consumer: Consumer, stream: str) -> list[bytes]:
    await producer.create_stream(stream)
    for i in range(5):
        await producer.send_wait(stream, RawMessage(b"m%d" % i))
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append(bytes(msg))
        if len(got) == 5:
            done.set()

    await consumer.subscribe(stream, on_message)
    await asyncio.wait_for(done.wait(), 10)
    return got


async def test_rstream_over_tls_beside_plain(tls_server: Server, certs: CertFiles) -> None:
    assert tls_server.tls_port and tls_server.stream_port
    ctx = client_context(certs)
    kw: dict[str, Any] = {"port": tls_server.tls_port, "ssl_context": ctx}
    async with (
        Producer("localhost", username="guest", password="guest", **kw) as producer,
        Consumer("localhost", username="guest", password="guest", **kw) as consumer,
    ):
        got = await round_trip(producer, consumer, "over-tls")
    assert got == [b"m%d" % i for i in range(5)]
    # the plain listener still serves the same streams
    async with Producer(
        "127.0.0.1", port=tls_server.stream_port, username="guest", password="guest"
    ) as p:
        await p.send_wait("over-tls", RawMessage(b"plain"))


async def test_https_admin(tls_server: Server, certs: CertFiles) -> None:
    ctx = client_context(certs)
    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    url = f"https://localhost:{tls_server.admin_port}/api/health"
    async with aiohttp.ClientSession() as http:
        async with http.get(url, ssl=ctx, headers=auth) as r:
            assert r.status == 200
        async with http.get(url, ssl=ctx) as r:
            assert r.status == 401
        with pytest.raises(aiohttp.ClientError):
            plain = f"http://127.0.0.1:{tls_server.admin_port}/api/health"
            async with http.get(plain, headers=auth) as r:
                assert r.status != 200


async def test_mutual_tls_and_sasl_external(tmp_path: Path, certs: CertFiles) -> None:
    config = tls_config(
        tmp_path, certs, cafile=str(certs.ca), verify_client="required", plain_listener=False
    )
    server = Server(config)
    await server.start()
    try:
        assert server.stream_port == 0  # TLS only
        kw: dict[str, Any] = {
            "port": server.tls_port,
            "ssl_context": client_context(certs, certs.client_cert),
            "username": "",
            "password": "",
            "sasl_configuration_mechanism": SlasMechanism.MechanismExternal,
        }
        async with Producer("localhost", **kw) as producer, Consumer("localhost", **kw) as consumer:
            got = await round_trip(producer, consumer, "alice-mtls")
            assert len(got) == 5
            # the certificate's user is alice, whose permissions apply
            with pytest.raises(AccessRefused):
                await producer.create_stream("guest-stream")
        # no client certificate, or one from another CA: the TLS handshake fails
        for context in (
            client_context(certs),
            client_context(certs, certs.stranger_cert),
        ):
            with pytest.raises((ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError)):
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        "localhost", server.tls_port, ssl=context, server_hostname="localhost"
                    ),
                    5,
                )
                writer.write(b"\x00\x00\x00\x04\x00\x11\x00\x01")
                await writer.drain()
                data = await asyncio.wait_for(reader.read(10), 5)
                if not data:
                    raise ConnectionError("closed by the server")
    finally:
        await server.stop()


def test_tls_config_errors_are_typed(tmp_path: Path, certs: CertFiles) -> None:
    from tierlog.server.tls import server_context

    bad = TlsSection(certfile=str(tmp_path / "missing.pem"), keyfile=str(certs.server_key))
    with pytest.raises(ConfigError, match="TLS certificate"):
        server_context(bad)
    # the key file's contents never appear in the error
    wrong_key = TlsSection(certfile=str(certs.server_cert), keyfile=str(certs.client_key))
    with pytest.raises(ConfigError) as info:
        server_context(wrong_key)
    assert "PRIVATE KEY" not in str(info.value)


async def test_server_process_mutual_tls_external(tmp_path: Path, certs: CertFiles) -> None:
    """The real ``tierlog serve`` (uvloop): TLS port from the ready file, SASL EXTERNAL."""
    config = f"""
[auth]
users = {{ guest = "guest", alice = "unused-password" }}
[tls]
certfile = "{certs.server_cert}"
keyfile = "{certs.server_key}"
cafile = "{certs.ca}"
verify_client = "required"
port = 0
[tier]
enabled = false
"""
    server = TierlogServerProcess(tmp_path / "data", config_text=config).start()
    try:
        assert server.tls_port
        kw: dict[str, Any] = {
            "port": server.tls_port,
            "ssl_context": client_context(certs, certs.client_cert),
            "username": "",
            "password": "",
            "sasl_configuration_mechanism": SlasMechanism.MechanismExternal,
        }
        async with Producer("localhost", **kw) as producer:
            await producer.create_stream("proc-s")
            await producer.send_wait("proc-s", RawMessage(b"over mTLS"))
        ctx = client_context(certs)
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"https://localhost:{server.admin_port}/api/streams/proc-s", ssl=ctx, headers=auth
            ) as r,
        ):
            assert r.status == 200
            assert (await r.json())["local"]["next_offset"] == 1
    finally:
        server.stop()
