"""The admin API of a cluster node: member changes and node retirement.

* ``POST /api/streams/{name}/members`` ``{"add": node}`` or ``{"remove": node}``
  (``vhost`` query parameter, default ``/``; configure permission on the stream): one
  member change, carried out by the stream's leader; a node that does not lead the
  stream forwards the request to the leader's admin address once. 200 with the new
  members and replication factor; 409 when the change breaks a rule (one change at a
  time, the staying voters do not hold the commit offset yet, ...); 503 without a live
  leader.
* ``GET /api/cluster`` — this node's cluster runtime: streams it leads, whether it is
  retiring or retired, and what each led stream's next member change waits for.
* ``GET /api/nodes`` — every registered node: live, retiring, retired, streams held.
* ``GET /api/nodes/{name}`` — one node's status; a retiring node's progress is the list
  of streams it still holds (``streams_left``) and ``retired`` once it released its lease.
* ``POST /api/nodes/{name}/retire`` — start retiring the node (idempotent; 202).
* ``DELETE /api/nodes/{name}/retire`` — withdraw a retirement (``"restart": true`` when
  the node had retired already: it rejoins when restarted).

Node and cluster requests need the user tag ``administrator`` (``auth.tags``; checked by
``AdminGuard`` from ``ROUTE_PERMISSIONS``), never a stream pattern: a user barred from
some streams must not be able to retire the node that serves them. Any node answers them
from the directory: the node being retired need not be up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from tierlog.cluster.errors import ClusterError, MembershipChangeError, NotLeaderError
from tierlog.cluster.membership import NodeInfo
from tierlog.cluster.node import DirectoryView
from tierlog.cluster.retirement import Retirement
from tierlog.logs import get_logger
from tierlog.remote.catalog import StreamRecord
from tierlog.server.admin_security import AdminGuard
from tierlog.storage.errors import StorageError

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService

log = get_logger("tierlog.server.admin")

FORWARDED_HEADER = "X-Tierlog-Forwarded"
FORWARD_TIMEOUT_SECONDS = 30.0


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def node_status(
    name: str,
    info: NodeInfo | None,
    view: DirectoryView,
    retirement: Retirement | None,
    names: dict[str, str],
) -> dict[str, Any]:
    """One node as the directory shows it; ``names``: incarnation -> stream name."""
    held = []
    for incarnation, place in sorted(view.streams.items()):
        membership = place.record.membership
        if name not in membership.members:
            continue
        role = "learner" if name in membership.learners else "voter"
        if place.record.leader == name and place.leader is not None:
            role = "leader"
        held.append(
            {
                "stream": names.get(incarnation, incarnation),
                "incarnation": incarnation,
                "role": role,
            }
        )
    return {
        "node": name,
        "live": name in view.nodes,
        "stream_address": info.stream_address if info else None,
        "admin_address": info.admin_address if info else None,
        "retiring": retirement is not None,
        # a retiring node that is gone and holds nothing has retired too (it died after
        # its streams moved off it, or was never restarted)
        "retired": retirement is not None
        and (retirement.retired or (name not in view.nodes and not held)),
        "streams_left" if retirement is not None else "streams": held,
    }


def add_cluster_routes(
    app: web.Application, guard: AdminGuard, cluster: Callable[[], ClusterService | None]
) -> None:
    """Add the routes; ``cluster()`` is the node's cluster service (None: not a cluster
    node, and the routes answer 404). The service starts after the admin listener."""

    def service_or_error() -> ClusterService | web.Response:
        service = cluster()
        if service is None:
            return _error(404, "this server does not run in a cluster ([cluster] node)")
        return service

    async def read_nodes(
        service: ClusterService,
    ) -> tuple[DirectoryView, dict[str, NodeInfo], dict[str, Retirement], dict[str, str]]:
        def read() -> tuple[
            DirectoryView, dict[str, NodeInfo], dict[str, Retirement], list[StreamRecord]
        ]:
            view = DirectoryView.read(service.directory)
            registered = {}
            for stored in service.directory.meta.list("cluster/nodes/"):
                info = NodeInfo.decode(stored.value)
                registered[info.name] = info
            return view, registered, service.changes.retirements.all(), service.catalog.list()

        view, registered, retirements, records = await service._directory(read)
        names = {
            r.incarnation: f"{r.vhost}{'' if r.vhost.endswith('/') else '/'}{r.name}"
            for r in records
        }
        return view, registered, retirements, names

    async def list_nodes(request: web.Request) -> web.Response:
        service = service_or_error()
        if isinstance(service, web.Response):
            return service
        view, registered, retirements, names = await read_nodes(service)
        nodes = [
            node_status(n, registered.get(n), view, retirements.get(n), names)
            for n in sorted(set(registered) | set(retirements))
        ]
        return web.json_response({"nodes": nodes})

    async def get_node(request: web.Request) -> web.Response:
        service = service_or_error()
        if isinstance(service, web.Response):
            return service
        name = request.match_info["name"]
        view, registered, retirements, names = await read_nodes(service)
        if name not in registered and name not in retirements:
            return _error(404, f"no node {name!r} in the cluster")
        return web.json_response(
            node_status(name, registered.get(name), view, retirements.get(name), names)
        )

    async def retire_node(request: web.Request) -> web.Response:
        service = service_or_error()
        if isinstance(service, web.Response):
            return service
        name = request.match_info["name"]
        info = await service._directory(service.directory.node, name)
        if info is None:
            return _error(404, f"no node {name!r} in the cluster")
        try:
            record = await service._directory(service.changes.retirements.request, name)
        except (ClusterError, StorageError) as exc:
            return _error(503, f"cannot record the retirement: {exc}")
        log.info("cluster_node_retire_requested", node=name, by=service.name)
        view, registered, retirements, names = await read_nodes(service)
        body = node_status(name, registered.get(name), view, retirements.get(name, record), names)
        return web.json_response(body, status=202)

    async def withdraw_retirement(request: web.Request) -> web.Response:
        service = service_or_error()
        if isinstance(service, web.Response):
            return service
        name = request.match_info["name"]
        current = await service._directory(service.changes.retirements.get, name)
        if current is None:
            return _error(404, f"node {name!r} is not retiring")
        await service._directory(service.changes.retirements.withdraw, name)
        log.info("cluster_node_retire_withdrawn", node=name, by=service.name)
        # a node that retired already released its lease for good: restarting it rejoins
        return web.json_response({"node": name, "retiring": False, "restart": current.retired})

    async def change_members(request: web.Request) -> web.Response:
        service = service_or_error()
        if isinstance(service, web.Response):
            return service
        vhost, name = request.query.get("vhost", "/"), request.match_info["name"]
        guard.require(request, vhost, "configure", name)
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body must be JSON")
        actions = [a for a in ("add", "remove") if isinstance(data, dict) and a in data]
        if len(actions) != 1 or not isinstance(data[actions[0]], str):
            return _error(400, 'body must be {"add": node} or {"remove": node}')
        action, node = actions[0], data[actions[0]]
        broker = service.broker
        assert broker is not None
        handle = broker.get(vhost, name)
        opening = broker.opening(vhost, name)
        record = handle.record if handle is not None else opening.record if opening else None
        if record is None:
            return _error(404, f"no stream {name!r} in vhost {vhost!r}")
        try:
            result = await service.changes.request_change(record.incarnation, action, node)
        except MembershipChangeError as exc:
            return _error(409, str(exc))
        except NotLeaderError:
            return await forward(request, service, record.incarnation, data)
        except ClusterError as exc:
            return _error(503, str(exc))
        return web.json_response(result.to_json())

    async def forward(
        request: web.Request, service: ClusterService, incarnation: str, data: Any
    ) -> web.Response:
        """Hand a member change to the stream's leader (once: a forwarded request that
        reaches a node not leading the stream any more is answered 503)."""
        place = service.view.streams.get(incarnation)
        if request.headers.get(FORWARDED_HEADER) or place is None or place.leader is None:
            return _error(503, "the stream has no live leader right now; try again")
        if place.leader.name == service.name:
            return _error(503, "this node is still becoming the stream's leader; try again")
        url = f"{guard.scheme}://{place.leader.admin_address}{request.rel_url}"
        headers = {FORWARDED_HEADER: service.name, "Content-Type": "application/json"}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_SECONDS)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(url, data=json.dumps(data), headers=headers) as answer,
            ):
                body = await answer.read()
                return web.Response(
                    body=body, status=answer.status, content_type="application/json"
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error(503, f"leader {place.leader.name} unreachable: {exc!r}")

    async def this_node(request: web.Request) -> web.Response:
        service = service_or_error()
        if isinstance(service, web.Response):
            return service
        return web.json_response(service.status())

    app.router.add_get("/api/cluster", this_node)
    app.router.add_post("/api/streams/{name}/members", change_members)
    app.router.add_get("/api/nodes", list_nodes)
    app.router.add_get("/api/nodes/{name}", get_node)
    app.router.add_post("/api/nodes/{name}/retire", retire_node)
    app.router.add_delete("/api/nodes/{name}/retire", withdraw_retirement)
