"""The admin HTTP API (aiohttp, JSON) and the Prometheus /metrics endpoint.

Routes (``vhost`` is a query parameter, default ``/``):

* ``GET /api/health`` — ``{"status": "ok", "streams": n, "connections": n}``
* ``GET /api/streams`` — every stream's status
* ``POST /api/streams`` — ``{"name": ..., "vhost": "/", "arguments": {...}}`` (stream
  arguments as in Create) and/or ``"settings": {...}`` (StreamSettings fields)
* ``GET /api/streams/{name}`` — one stream's status (local, remote, settings)
* ``PATCH /api/streams/{name}`` — ``{"arguments": {...}}`` / ``{"settings": {...}}``:
  change retention and tier settings
* ``DELETE /api/streams/{name}``
* ``GET /metrics`` — Prometheus text format (OpenMetrics when the scraper asks for it)
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tierlog.errors import ConfigError
from tierlog.metrics import Metrics
from tierlog.remote.catalog import StreamExistsError, StreamNotFoundError
from tierlog.remote.settings import StreamSettings
from tierlog.server.arguments import settings_changes
from tierlog.server.broker import Broker


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "body must be JSON"}), content_type="application/json"
        ) from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "body must be a JSON object"}),
            content_type="application/json",
        )
    return data


def _changes(data: dict[str, Any]) -> dict[str, Any]:
    arguments = data.get("arguments") or {}
    settings = data.get("settings") or {}
    if not isinstance(arguments, dict) or not isinstance(settings, dict):
        raise ConfigError("'arguments' and 'settings' must be objects")
    changes = settings_changes({str(k): str(v) for k, v in arguments.items()})
    changes.update(settings)
    return changes


def build_admin_app(broker: Broker, metrics: Metrics) -> web.Application:
    app = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "streams": len(broker.streams()),
                "connections": len(broker.connections),
            }
        )

    async def list_streams(request: web.Request) -> web.Response:
        return web.json_response({"streams": [h.status() for h in broker.streams()]})

    async def create_stream(request: web.Request) -> web.Response:
        data = await _body(request)
        name = data.get("name")
        vhost = data.get("vhost", "/")
        if not isinstance(name, str) or not isinstance(vhost, str):
            return _error(400, "'name' (and 'vhost') must be strings")
        try:
            settings = StreamSettings().updated(**_changes(data))
            handle = await broker.create_stream(vhost, name, settings)
        except StreamExistsError as exc:
            return _error(409, str(exc))
        except (ConfigError, TypeError) as exc:
            return _error(400, str(exc))
        return web.json_response(handle.status(), status=201)

    def _handle(request: web.Request) -> tuple[str, str]:
        return request.query.get("vhost", "/"), request.match_info["name"]

    async def get_stream(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        handle = broker.get(vhost, name)
        if handle is None:
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        return web.json_response(handle.status())

    async def patch_stream(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        data = await _body(request)
        if broker.get(vhost, name) is None:
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        try:
            broker.update_settings(vhost, name, _changes(data))
        except (ConfigError, TypeError) as exc:
            return _error(400, str(exc))
        except StreamNotFoundError as exc:
            return _error(404, str(exc))
        handle = broker.get(vhost, name)
        assert handle is not None
        return web.json_response(handle.status())

    async def delete_stream(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        try:
            record = await broker.delete_stream(vhost, name)
        except StreamNotFoundError as exc:
            return _error(404, str(exc))
        return web.json_response({"deleted": name, "incarnation": record.incarnation})

    async def prometheus(request: web.Request) -> web.Response:
        body, content_type = metrics.exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/api/health", health)
    app.router.add_get("/api/streams", list_streams)
    app.router.add_post("/api/streams", create_stream)
    app.router.add_get("/api/streams/{name}", get_stream)
    app.router.add_patch("/api/streams/{name}", patch_stream)
    app.router.add_delete("/api/streams/{name}", delete_stream)
    app.router.add_get("/metrics", prometheus)
    return app
