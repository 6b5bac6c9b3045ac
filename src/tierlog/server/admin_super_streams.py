"""The admin API's super-stream routes (``vhost`` is a query parameter, default ``/``):

* ``GET /api/super-streams`` — every super stream the user may read or configure:
  ``{"super_streams": [{"vhost", "name", "partitions", "binding_keys", "arguments",
  "state", "created_ns"}]}`` (``state``: ``ready``, or ``creating`` / ``deleting`` for
  one cut short, which the same create / a delete finishes)
* ``POST /api/super-streams`` — ``{"name", "vhost"?, "partitions": N}`` (partitions
  ``{name}-0`` … bound with ``"0"`` …), ``{"name", "binding_keys": [...]}`` (one
  partition ``{name}-{key}`` per key), or both as lists; ``"arguments"``: the partitions'
  stream arguments as in Create
* ``GET /api/super-streams/{name}`` — one super stream
* ``DELETE /api/super-streams/{name}`` — the super stream and its partitions

Permissions as the stream protocol's CreateSuperStream / DeleteSuperStream
(``handlers/super_streams.py``): ``configure`` and ``read`` on the super stream,
``configure`` and ``write`` on every partition; reserved names are refused (403).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tierlog.errors import ConfigError
from tierlog.log.errors import ReservedNameError
from tierlog.log.names import check_super_stream, is_reserved
from tierlog.remote.errors import StreamExistsError, SuperStreamNotFoundError
from tierlog.remote.super_streams import SuperStreamDefinition, partitions_for
from tierlog.server.admin_security import AdminGuard
from tierlog.server.broker import Broker
from tierlog.server.super_streams import super_streams_of


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _definition(data: dict[str, Any]) -> SuperStreamDefinition:
    name, vhost = data.get("name"), data.get("vhost", "/")
    if not isinstance(name, str) or not isinstance(vhost, str):
        raise ConfigError("'name' (and 'vhost') must be strings")
    given, keys = data.get("partitions"), data.get("binding_keys")
    arguments = data.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise ConfigError("'arguments' must be an object")
    if keys is not None and not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise ConfigError("'binding_keys' must be a list of strings")
    if isinstance(given, list):
        if not all(isinstance(p, str) for p in given) or keys is None:
            raise ConfigError("a list of 'partitions' needs its 'binding_keys' (strings)")
        partitions, bindings = tuple(given), tuple(keys)
    else:
        partitions, bindings = partitions_for(name, given, keys)
    stringified = {str(k): str(v) for k, v in arguments.items()}
    return SuperStreamDefinition(vhost, name, partitions, bindings, stringified)


def add_super_stream_routes(app: web.Application, broker: Broker, guard: AdminGuard) -> None:
    super_streams = super_streams_of(broker)

    def may_manage(
        request: web.Request, vhost: str, name: str, partitions: tuple[str, ...]
    ) -> None:
        guard.require(request, vhost, "configure", name)
        guard.require(request, vhost, "read", name)
        for partition in partitions:
            guard.require(request, vhost, "configure", partition)
            guard.require(request, vhost, "write", partition)

    async def list_super_streams(request: web.Request) -> web.Response:
        visible = [
            r.to_dict()
            for r in await super_streams.list()
            if not is_reserved(r.name)
            and (
                guard.may(request, r.vhost, "read", r.name)
                or guard.may(request, r.vhost, "configure", r.name)
            )
        ]
        return web.json_response({"super_streams": visible})

    async def create_super_stream(request: web.Request) -> web.Response:
        try:
            data = await request.json()
        except ValueError:
            return _error(400, "body must be JSON")
        if not isinstance(data, dict):
            return _error(400, "body must be a JSON object")
        try:
            definition = _definition(data)
            check_super_stream(definition.name, definition.partitions)
        except ReservedNameError as exc:
            guard.gate.refused("admin", "reserved_name")
            return _error(403, str(exc))
        except ConfigError as exc:
            return _error(400, str(exc))
        may_manage(request, definition.vhost, definition.name, definition.partitions)
        try:
            record = await super_streams.create(definition)
        except StreamExistsError as exc:
            return _error(409, str(exc))
        except ConfigError as exc:
            return _error(400, str(exc))
        return web.json_response(record.to_dict(), status=201)

    async def get_super_stream(request: web.Request) -> web.Response:
        vhost, name = request.query.get("vhost", "/"), request.match_info["name"]
        record = await super_streams.get(vhost, name)
        if record is None:
            return _error(404, f"no super stream {name!r} in vhost {vhost!r}")
        return web.json_response(record.to_dict())

    async def delete_super_stream(request: web.Request) -> web.Response:
        vhost, name = request.query.get("vhost", "/"), request.match_info["name"]
        record = await super_streams.get(vhost, name)
        if record is None:
            return _error(404, f"no super stream {name!r} in vhost {vhost!r}")
        may_manage(request, vhost, name, record.partitions)
        try:
            deleted = await super_streams.delete(vhost, name)
        except SuperStreamNotFoundError as exc:
            return _error(404, str(exc))
        except ConfigError as exc:
            return _error(400, str(exc))
        return web.json_response({"deleted": name, "partitions": list(deleted.partitions)})

    app.router.add_get("/api/super-streams", list_super_streams)
    app.router.add_post("/api/super-streams", create_super_stream)
    app.router.add_get("/api/super-streams/{name}", get_super_stream)
    app.router.add_delete("/api/super-streams/{name}", delete_super_stream)
