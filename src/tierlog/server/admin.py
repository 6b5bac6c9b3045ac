"""The admin HTTP API (aiohttp, JSON) and the Prometheus /metrics endpoint.

Every request passes AdminGuard (Host / Origin checks, JSON writes, HTTP basic or
bearer credentials, then the route's declared permission, ``ROUTE_PERMISSIONS``:
configure / read on the stream, reserved stream names refused); routes check the
user's permission on the stream again. Routes (``vhost`` is a query parameter, default ``/``):

* ``GET /api/health`` — ``{"status": "ok" | "degraded", "streams": n, "connections": n,
  "tiering_degraded": [{"vhost", "stream", "tiering": "degraded" | "halted" | "not started"}],
  "not_ready": [...]}``
* ``GET /api/health/live``, ``GET /api/health/ready`` — probes, without credentials (200,
  or 503 with ``reasons`` when not ready; see ``health.py``)
* ``GET /api/streams`` — every stream's status
* ``POST /api/streams`` — ``{"name": ..., "vhost": "/", "arguments": {...}}`` (stream
  arguments as in Create) and/or ``"settings": {...}`` (StreamSettings fields)
* ``GET /api/streams/{name}`` — one stream's status (local, remote, settings; on a
  cluster node its ``cluster`` section: leader, epoch, members, see ``cluster_view``)
* ``PATCH /api/streams/{name}`` — ``{"arguments": {...}}`` / ``{"settings": {...}}``:
  change retention and tier settings
* ``DELETE /api/streams/{name}``
* ``PUT /api/streams/{name}/offload`` — ``{"before": offset}``: a segment-mode stream
  offloads every sealed segment whose next offset is <= ``before`` (202; 409 while an
  offload requested this way runs)
* ``GET /api/streams/{name}/offload`` — that offload's status: ``not run``, ``running``,
  ``success`` or ``error`` (with ``error``), and the first offset not offloaded
* ``GET /api/streams/{name}/messages?key=K[&from=T&to=T]`` — the stream's records whose
  key is ``K`` (times: ms or ISO-8601), found through its key index:
  ``{"stream", "key", "windows", "messages": [{"offset", "body" (base64 record)}]}``
* ``/api/super-streams…`` — list, create, show and delete super streams
  (``admin_super_streams.py``)
* ``GET /metrics`` — Prometheus text format (OpenMetrics when the scraper asks for it)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tierlog.errors import ConfigError
from tierlog.log.names import is_reserved
from tierlog.metrics import Metrics
from tierlog.offload.errors import OffloadRunningError
from tierlog.offload.service import SegmentOffloadService
from tierlog.remote.errors import RemoteTierError, StreamExistsError, StreamNotFoundError
from tierlog.remote.key_lookup import lookup_key, parse_timestamp
from tierlog.remote.settings import (
    StreamSettings,
    check_new_settings,
    check_tier_mode_unchanged,
)
from tierlog.server.admin_security import HEALTH_LIVE, HEALTH_READY, AdminGuard
from tierlog.server.admin_super_streams import add_super_stream_routes
from tierlog.server.arguments import settings_changes
from tierlog.server.broker import Broker
from tierlog.server.cluster_service import ClusterService
from tierlog.server.cluster_view import cluster_status
from tierlog.server.health import Health
from tierlog.server.limits import Gatekeeper


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


def _check_log_limits(broker: Broker, settings: StreamSettings) -> None:
    """The whole resulting configuration must open: reject it now, not at the next start."""
    broker.config.log.log_config(
        settings.max_segment_bytes,
        settings.max_segment_chunks,
        broker.config.server.frame_max,
        filter_size=settings.filter_size,
    )


def build_admin_app(
    broker: Broker,
    metrics: Metrics,
    guard: AdminGuard | None = None,
    health_state: Health | None = None,
) -> web.Application:
    if guard is None:
        guard = AdminGuard(broker.config.auth, Gatekeeper(broker.config, metrics))
    if health_state is None:
        health_state = Health(broker)
        health_state.listening = True
    state = health_state
    app = web.Application(middlewares=[guard.middleware], client_max_size=64 * 1024)

    async def health(request: web.Request) -> web.Response:
        degraded = state.degraded()
        return web.json_response(
            {
                "status": "degraded" if degraded else "ok",
                "streams": len(broker.streams()),
                "streams_opening": len(broker.opening_streams()),
                "catalog_loaded": broker.catalog_loaded.is_set(),
                "connections": len(broker.connections),
                "tiering_degraded": [
                    {"vhost": vhost, "stream": name, "tiering": what}
                    for (vhost, name), what in sorted(degraded.items())
                ],
                "not_ready": state.not_ready(),
            }
        )

    async def live(request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def ready(request: web.Request) -> web.Response:
        reasons = state.not_ready()
        if reasons:
            return web.json_response({"status": "not ready", "reasons": reasons}, status=503)
        return web.json_response({"status": "ready"})

    async def list_streams(request: web.Request) -> web.Response:
        visible = [
            h.status()
            for h in broker.streams()
            if not is_reserved(h.name)
            and (
                guard.may(request, h.vhost, "read", h.name)
                or guard.may(request, h.vhost, "configure", h.name)
            )
        ]
        visible += [  # not open here: resolving, failed with the error, or led elsewhere
            _with_cluster(o.status())
            for o in broker.opening_streams()
            if not is_reserved(o.record.name)
            and (
                guard.may(request, o.record.vhost, "read", o.record.name)
                or guard.may(request, o.record.vhost, "configure", o.record.name)
            )
        ]
        return web.json_response({"streams": visible})

    async def create_stream(request: web.Request) -> web.Response:
        data = await _body(request)
        name = data.get("name")
        vhost = data.get("vhost", "/")
        if not isinstance(name, str) or not isinstance(vhost, str):
            return _error(400, "'name' (and 'vhost') must be strings")
        if is_reserved(name):  # the path's names are checked by the guard, this one here
            guard.gate.refused("admin", "reserved_name")
            return _error(403, f"stream name {name!r} is reserved for the server")
        guard.require(request, vhost, "configure", name)
        try:
            settings = StreamSettings().updated(**_changes(data))
            check_new_settings(settings)
            _check_log_limits(broker, settings)
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
        if not guard.may(request, vhost, "configure", name):
            guard.require(request, vhost, "read", name)
        handle = broker.get(vhost, name)
        if handle is None:
            opening = broker.opening(vhost, name)
            if opening is not None:
                return web.json_response(_with_cluster(opening.status()))
            if not broker.catalog_loaded.is_set():
                return _error(503, "the server is starting: the stream catalog is loading")
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        return web.json_response(_with_cluster(handle.status()))

    def _with_cluster(status: dict[str, Any]) -> dict[str, Any]:
        """On a cluster node: leader, epoch, members with their progress and state."""
        placement = broker.placement
        if isinstance(placement, ClusterService):
            return cluster_status(placement, status)
        return status

    async def patch_stream(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        guard.require(request, vhost, "configure", name)
        data = await _body(request)
        current = broker.get(vhost, name)
        if current is None:
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        try:
            changes = _changes(data)
            check_tier_mode_unchanged(current.record.settings, changes)
            _check_log_limits(broker, current.record.settings.updated(**changes))
            broker.update_settings(vhost, name, changes)
        except (ConfigError, TypeError) as exc:
            return _error(400, str(exc))
        except StreamNotFoundError as exc:
            return _error(404, str(exc))
        handle = broker.get(vhost, name)
        assert handle is not None
        return web.json_response(handle.status())

    async def delete_stream(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        guard.require(request, vhost, "configure", name)
        try:
            record = await broker.delete_stream(vhost, name)
        except StreamNotFoundError as exc:
            return _error(404, str(exc))
        return web.json_response({"deleted": name, "incarnation": record.incarnation})

    def _offload_service(vhost: str, name: str) -> SegmentOffloadService | web.Response:
        handle = broker.get(vhost, name)
        if handle is None:
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        if handle.record.settings.tier_mode != "segments":
            return _error(
                400,
                f"stream {name!r} tiers in {handle.record.settings.tier_mode!r} mode: "
                "offloading is for streams created with x-tierlog-tier-mode=segments",
            )
        lookup = getattr(broker.lifecycle, "offload_of", None)
        service = lookup(handle.record) if lookup is not None else None
        if service is None:
            return _error(503, f"the offload service of {name!r} is not running (see the log)")
        assert isinstance(service, SegmentOffloadService)
        return service

    async def put_offload(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        guard.require(request, vhost, "configure", name)
        data = await _body(request)
        before = data.get("before")
        if isinstance(before, bool) or not isinstance(before, int) or before < 0:
            return _error(400, "'before' must be a non-negative integer offset")
        service = _offload_service(vhost, name)
        if isinstance(service, web.Response):
            return service
        try:
            service.request_offload(before)
        except OffloadRunningError as exc:
            return _error(409, str(exc))
        return web.json_response(service.status().to_dict(), status=202)

    async def get_offload(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        if not guard.may(request, vhost, "configure", name):
            guard.require(request, vhost, "read", name)
        service = _offload_service(vhost, name)
        if isinstance(service, web.Response):
            return service
        return web.json_response(service.status().to_dict())

    async def get_messages(request: web.Request) -> web.Response:
        vhost, name = _handle(request)
        guard.require(request, vhost, "read", name)
        key = request.query.get("key")
        if not key:
            return _error(400, "the 'key' query parameter is required")
        store = getattr(broker.lifecycle, "store", None)
        if store is None:
            return _error(503, "key lookups need the remote tier (tier.enabled)")
        try:
            lo, hi = (
                parse_timestamp(request.query[b], b) if b in request.query else None
                for b in ("from", "to")
            )
            found = await asyncio.to_thread(
                lookup_key,
                broker.catalog.meta,
                store,
                broker.config.tier.prefix,
                vhost,
                name,
                key.encode(),
                from_timestamp=lo,
                to_timestamp=hi,
            )
        except StreamNotFoundError:
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        except ConfigError as exc:
            return _error(400, str(exc))
        except RemoteTierError as exc:
            return _error(500, f"key index of {name!r} unusable: {exc}")
        body = {"stream": name, "key": key, "windows": found.windows}
        return web.json_response({**body, "messages": found.to_json()})

    async def prometheus(request: web.Request) -> web.Response:
        body, content_type = metrics.exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/api/health", health)
    app.router.add_get(HEALTH_LIVE, live)
    app.router.add_get(HEALTH_READY, ready)
    app.router.add_get("/api/streams", list_streams)
    app.router.add_post("/api/streams", create_stream)
    app.router.add_get("/api/streams/{name}", get_stream)
    app.router.add_patch("/api/streams/{name}", patch_stream)
    app.router.add_delete("/api/streams/{name}", delete_stream)
    app.router.add_put("/api/streams/{name}/offload", put_offload)
    app.router.add_get("/api/streams/{name}/offload", get_offload)
    app.router.add_get("/api/streams/{name}/messages", get_messages)
    app.router.add_get("/metrics", prometheus)
    add_super_stream_routes(app, broker, guard)
    return app
