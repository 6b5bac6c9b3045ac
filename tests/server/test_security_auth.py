"""Authentication and authorisation with real clients: rstream on the stream protocol,
aiohttp on the admin API (credentials, Host / Origin checks, JSON writes, permissions)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rstream import Consumer, Producer
from rstream.consumer import MessageContext
from rstream.exceptions import (
    AccessRefused,
    AuthenticationFailure,
    PublisherDoesNotExist,
    VirtualHostAccessFailure,
)
from rstream.utils import RawMessage

from tierlog.errors import ConfigError
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.server.app import Server
from tierlog.server.auth import Authenticator, hash_password, parse_permissions
from tierlog.server.config import (
    AuthSection,
    ServerConfig,
    ServerSection,
    StorageSection,
    load_config,
)

ALICE_PASSWORD = "alice-secret-pw"
TOKEN = "token-for-alice-7f3a"


def _basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def secured_config(tmp_path: Path) -> ServerConfig:
    permissions = parse_permissions(
        {
            "alice": {
                "/": {"configure": "alice-.*", "write": "alice-.*|shared", "read": ".*"},
                "other": {"configure": ".*", "write": ".*", "read": ".*"},
            },
            "bob": {"/": {"configure": "", "write": "", "read": "shared"}},
        }
    )
    auth = AuthSection(
        users={"guest": "guest", "alice": hash_password(ALICE_PASSWORD), "bob": "bob-pw"},
        loopback_users=("guest",),
        tokens={"sha256$" + hashlib.sha256(TOKEN.encode()).hexdigest(): "alice"},
        permissions=permissions,
    )
    return replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
        auth=auth,
    ).validate()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(secured_config(tmp_path))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


def refusals(server: Server, **labels: str) -> float:
    return server.metrics.value("tierlog_access_refused_total", **labels)


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.admin_port}"


async def call(
    server: Server, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, base(server) + path, headers=headers, **kw) as r,
    ):
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body


# ----------------------------------------------------------------------------- admin API


async def test_admin_rejects_missing_and_wrong_credentials(server: Server) -> None:
    status, _ = await call(server, "GET", "/api/streams")
    assert status == 401
    async with (
        aiohttp.ClientSession() as http,
        http.get(base(server) + "/api/health") as r,
    ):
        assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
    assert (await call(server, "GET", "/api/health", _basic("alice", "wrong")))[0] == 401
    assert (await call(server, "GET", "/api/health", _basic("nobody", "x")))[0] == 401
    bad_token = {"Authorization": "Bearer not-a-token"}
    assert (await call(server, "GET", "/api/health", bad_token))[0] == 401
    assert (await call(server, "GET", "/api/health", _basic("alice", ALICE_PASSWORD)))[0] == 200
    token = {"Authorization": f"Bearer {TOKEN}"}
    assert (await call(server, "GET", "/api/health", token))[0] == 200
    assert server.metrics.value("tierlog_auth_failures_total") == 5


async def test_admin_refuses_foreign_host_and_cross_origin(server: Server) -> None:
    alice = _basic("alice", ALICE_PASSWORD)
    body = {"name": "alice-a"}
    # DNS rebinding: the browser sends the attacker's name as Host
    rebinding = {**alice, "Host": f"evil.example:{server.admin_port}"}
    status, _ = await call(server, "POST", "/api/streams", rebinding, json=body)
    assert status == 421
    cross = {**alice, "Origin": "http://evil.example"}
    status, _ = await call(server, "POST", "/api/streams", cross, json=body)
    assert status == 403
    status, _ = await call(server, "DELETE", "/api/streams/alice-a", cross)
    assert status == 403
    assert server.broker is not None and server.broker.get("/", "alice-a") is None
    same = {**alice, "Origin": f"http://127.0.0.1:{server.admin_port}"}
    status, _ = await call(server, "POST", "/api/streams", same, json=body)
    assert status == 201
    localhost = {**alice, "Host": f"localhost:{server.admin_port}"}
    assert (await call(server, "GET", "/api/streams/alice-a", localhost))[0] == 200
    assert refusals(server, interface="admin", action="host") == 1
    assert refusals(server, interface="admin", action="origin") == 2


async def test_admin_writes_must_be_json(server: Server) -> None:
    alice = _basic("alice", ALICE_PASSWORD)
    form = {**alice, "Content-Type": "application/x-www-form-urlencoded"}
    status, _ = await call(server, "POST", "/api/streams", form, data=b"name=alice-f")
    assert status == 415
    plain = {**alice, "Content-Type": "text/plain"}
    status, _ = await call(server, "POST", "/api/streams", plain, data=b'{"name": "alice-f"}')
    assert status == 415
    assert server.broker is not None and server.broker.get("/", "alice-f") is None


async def test_admin_request_bodies_are_bounded(server: Server) -> None:
    alice = _basic("alice", ALICE_PASSWORD)
    huge = {"name": "alice-h", "settings": {"padding": "x" * 200_000}}
    status, _ = await call(server, "POST", "/api/streams", alice, json=huge)
    assert status == 413
    assert server.broker is not None and server.broker.get("/", "alice-h") is None


async def test_admin_permissions_per_user_vhost_and_stream(server: Server) -> None:
    alice = _basic("alice", ALICE_PASSWORD)
    bob = _basic("bob", "bob-pw")
    assert (await call(server, "POST", "/api/streams", alice, json={"name": "alice-1"}))[0] == 201
    assert (await call(server, "POST", "/api/streams", alice, json={"name": "bob-1"}))[0] == 403
    other = {"name": "x", "vhost": "other"}
    assert (await call(server, "POST", "/api/streams", alice, json=other))[0] == 201
    assert (await call(server, "POST", "/api/streams", bob, json=other))[0] == 403
    assert (await call(server, "DELETE", "/api/streams/alice-1", bob))[0] == 403
    patch = {"settings": {"max_bytes": 10**6}}
    assert (await call(server, "PATCH", "/api/streams/alice-1", bob, json=patch))[0] == 403
    assert (await call(server, "GET", "/api/streams/alice-1", bob))[0] == 403
    # bob sees only what he may read
    status, listing = await call(server, "GET", "/api/streams", bob)
    assert status == 200 and listing["streams"] == []
    status, listing = await call(server, "GET", "/api/streams", alice)
    assert sorted(s["name"] for s in listing["streams"]) == ["alice-1", "x"]
    assert (await call(server, "DELETE", "/api/streams/alice-1", alice))[0] == 200

    def refused_count(**labels: str) -> float:
        return refusals(server, **labels)

    assert refused_count(interface="admin", action="configure") == 4
    assert refused_count(interface="admin", action="read") == 1
    metrics = (await call(server, "GET", "/metrics"))[1]
    assert 'tierlog_access_refused_total{action="configure",interface="admin"} 4.0' in metrics


async def test_admin_failed_attempts_are_rate_limited_per_peer(server: Server) -> None:
    assert (await call(server, "GET", "/api/health", _basic("bob", "bob-pw")))[0] == 200
    for _ in range(10):
        assert (await call(server, "GET", "/api/health", _basic("alice", "guess")))[0] == 401
    # even the right password is refused for a while: no online guessing at hash speed
    status, _ = await call(server, "GET", "/api/health", _basic("alice", ALICE_PASSWORD))
    assert status == 429
    # credentials verified before still work: one bad client does not lock out its host
    assert (await call(server, "GET", "/api/health", _basic("bob", "bob-pw")))[0] == 200
    # the stream protocol shares the limiter
    with pytest.raises(AuthenticationFailure):
        async with Producer(
            "127.0.0.1", port=server.stream_port, username="alice", password=ALICE_PASSWORD
        ):
            pass
    async with Producer("127.0.0.1", port=server.stream_port, username="bob", password="bob-pw"):
        pass


async def test_admin_patch_validates_the_resulting_configuration(server: Server) -> None:
    alice = _basic("alice", ALICE_PASSWORD)
    assert (await call(server, "POST", "/api/streams", alice, json={"name": "alice-p"}))[0] == 201
    too_big = {"settings": {"max_segment_bytes": 5_000_000_000}}
    status, body = await call(server, "PATCH", "/api/streams/alice-p", alice, json=too_big)
    assert status == 400 and "max_segment_bytes" in body["error"]
    create_big = {"name": "alice-q", "settings": {"max_segment_bytes": 5_000_000_000}}
    assert (await call(server, "POST", "/api/streams", alice, json=create_big))[0] == 400
    status, stream = await call(server, "GET", "/api/streams/alice-p", alice)
    assert status == 200 and stream["settings"]["max_segment_bytes"] == 500_000_000


# ----------------------------------------------------------------------------- stream protocol


async def test_rstream_wrong_credentials_and_wrong_vhost(server: Server) -> None:
    port = server.stream_port
    with pytest.raises(AuthenticationFailure):
        async with Producer("127.0.0.1", port=port, username="alice", password="nope"):
            pass
    with pytest.raises(VirtualHostAccessFailure):
        async with Producer(
            "127.0.0.1", port=port, username="bob", password="bob-pw", vhost="other"
        ):
            pass
    assert refusals(server, interface="stream", action="vhost") == 1


async def test_rstream_permissions_on_create_publish_subscribe(server: Server) -> None:
    port = server.stream_port
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.create_stream("shared")  # guest has no permissions entry: all of "/"
    async with Producer("127.0.0.1", port=port, username="alice", password=ALICE_PASSWORD) as p:
        await p.create_stream("alice-s")
        with pytest.raises(AccessRefused):
            await p.create_stream("other-s")
        await p.send_wait("shared", RawMessage(b"hello"))
    bob = Producer("127.0.0.1", port=port, username="bob", password="bob-pw")
    await bob.start()
    with pytest.raises(AccessRefused):
        await bob.delete_stream("alice-s")
    # rstream answers a refused DeclarePublisher by deleting the publisher, which
    # then surfaces as PublisherDoesNotExist; the refusal itself is counted below
    with pytest.raises((AccessRefused, PublisherDoesNotExist)):
        await bob.send_wait("shared", RawMessage(b"bob writes"))
    # rstream keeps the refused publisher and tries to delete it on close
    with contextlib.suppress(PublisherDoesNotExist):
        await bob.close()
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append(bytes(msg))
        done.set()

    async with Consumer("127.0.0.1", port=port, username="bob", password="bob-pw") as consumer:
        await consumer.subscribe("shared", on_message)
        await asyncio.wait_for(done.wait(), 10)
        with pytest.raises(AccessRefused):
            await consumer.subscribe("alice-s", on_message)
    assert got == [b"hello"]
    assert server.broker is not None and server.broker.get("/", "alice-s") is not None

    def refused_count(**labels: str) -> float:
        return refusals(server, **labels)

    assert refused_count(interface="stream", action="configure") == 2
    assert refused_count(interface="stream", action="write") == 1
    assert refused_count(interface="stream", action="read") >= 1


async def test_raw_protocol_refusals_carry_access_refused(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.stream_port)
    from tierlog.formats.protocol.frames import FrameSplitter

    splitter = FrameSplitter()
    pending: list[Any] = []

    async def expect(kind: type) -> Any:
        while True:
            while not pending:
                data = await asyncio.wait_for(reader.read(65536), 10)
                assert data, "server closed"
                pending.extend(c.decode_server_frame(f) for f in splitter.feed(data))
            frame = pending.pop(0)
            if isinstance(frame, kind):
                return frame

    writer.write(c.PeerPropertiesRequest(1, {}).encode())
    await expect(c.PeerPropertiesResponse)
    writer.write(c.SaslAuthenticateRequest(2, "PLAIN", c.plain_data("bob", "bob-pw")).encode())
    assert (await expect(c.SaslAuthenticateResponse)).response_code == ResponseCode.OK
    tune = await expect(c.Tune)
    writer.write(c.Tune(tune.frame_max, 0).encode())
    writer.write(c.OpenRequest(3, "/").encode())
    assert (await expect(c.OpenResponse)).response_code == ResponseCode.OK
    writer.write(c.CreateRequest(4, "bobs", {}).encode())
    assert (await expect(c.SimpleResponse)).response_code == ResponseCode.ACCESS_REFUSED
    writer.close()


# ----------------------------------------------------------------------------- units


def test_verified_credentials_are_cached_and_hashes_checked() -> None:
    stored = hash_password("pw", n=2**14)
    auth = Authenticator({"u": stored})
    assert auth.needs_slow_check("u", "pw")
    assert auth.check_password("u", "pw")
    assert not auth.needs_slow_check("u", "pw")  # no second scrypt for the same secret
    assert not auth.check_password("u", "pW")
    assert auth.needs_slow_check("u", "pW")  # failures are not cached as successes


def test_config_rejects_bad_security_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cases = {
        '[auth]\nusers = { a = "scrypt$x" }\n': "malformed scrypt",
        '[auth.permissions.nobody]\n"/" = { read = ".*" }\n': "unknown user",
        '[auth.permissions.guest]\n"/" = { read = "(" }\n': "not a valid regex",
        '[tls]\nverify_client = "maybe"\n': "verify_client",
        '[tls]\ncertfile = "x.pem"\n': "together",
        "[limits]\npreauth_frame_max = 10\n": "preauth_frame_max",
    }
    for text, message in cases.items():
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(str(cfg), {})
    cfg.write_text(
        '[auth.permissions.guest]\n"/" = { configure = "", write = "a.*", read = ".*" }\n'
    )
    config = load_config(str(cfg), {})
    assert not config.auth.permissions["guest"]["/"].allows("configure", "a")
    assert config.auth.permissions["guest"]["/"].allows("write", "abc")
