"""docs/security.md's table of admin routes and what they need is the declared permission
table (``ROUTE_PERMISSIONS``), and that table names exactly the routes the server's admin
API serves: a route added without a declared permission (refused at run time, fail
closed) or without a row in the docs fails here."""

from __future__ import annotations

import base64
import re
from dataclasses import replace
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tierlog.metrics import Metrics
from tierlog.server.admin_security import ROUTE_PERMISSIONS, AdminGuard
from tierlog.server.app import Server
from tierlog.server.config import ServerConfig, ServerSection, StorageSection
from tierlog.server.limits import Gatekeeper

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
ROW = re.compile(r"^\| `(?P<method>[A-Z]+)` \| `(?P<path>[^`]+)` \| (?P<needs>[^|]+?) \|$")


def documented() -> dict[tuple[str, str], str]:
    text = DOC.read_text()
    start = text.index("<!-- admin-routes")
    end = text.index("<!-- /admin-routes -->")
    rows = {}
    for line in text[start:end].splitlines():
        match = ROW.match(line)
        if match:
            key = (match["method"], match["path"])
            assert key not in rows, f"{key} twice in docs/security.md"
            rows[key] = match["needs"]
    return rows


def test_the_docs_table_is_the_declared_permission_table() -> None:
    rows = documented()
    assert len(rows) > 10
    assert rows == ROUTE_PERMISSIONS


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    routes = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # aiohttp adds one beside every GET
            continue
        assert route.resource is not None
        routes.add((route.method, route.resource.canonical))
    return routes


async def test_every_served_route_has_a_declared_permission(tmp_path: Path) -> None:
    config = replace(
        ServerConfig(),
        server=replace(ServerSection(), port=0, admin_port=0, heartbeat=0),
        storage=StorageSection(data_dir=str(tmp_path / "data")),
    ).validate()
    server = Server(config)
    await server.start()
    try:
        assert server._runner is not None
        assert served_routes(server._runner.app) == set(ROUTE_PERMISSIONS)
    finally:
        await server.stop()


async def test_a_route_without_a_declared_permission_is_refused() -> None:
    """Fail closed: a route nobody declared answers 403 even to the administrator."""
    config = ServerConfig().validate()
    guard = AdminGuard(config.auth, Gatekeeper(config, Metrics()))
    app = web.Application(middlewares=[guard.middleware])

    async def secret(request: web.Request) -> web.Response:
        return web.json_response({"secret": True})

    app.router.add_get("/api/secret", secret)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        guard.port = client.port or 0
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        answer = await client.get("/api/secret", headers=auth)
        assert answer.status == 403
        assert "no declared permission" in (await answer.json())["error"]
        assert (await client.get("/api/nothing-here", headers=auth)).status == 404
