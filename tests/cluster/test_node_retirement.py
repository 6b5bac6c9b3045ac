"""Retiring the only member of a stream, on three in-process nodes (one SQLite
MetaStore): the stream had no replication, so the leader starts serving the spare's
fetches when it adds it as a learner; the spare catches up, is promoted, the retiring
node hands the stream over and is removed, then releases its lease. Every confirmed
message is on the new leader, once, in order. Also: the admin API refuses bad member
changes with the right status, and a retiring node refuses to create streams."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.cluster.test_node_replication import SECRET, records
from tests.cluster.test_node_servers import (
    AsyncRawClient,
    node_config,
    publish_confirmed,
    start,
    until,
)
from tierlog.cluster.membership import ClusterDirectory
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.remote.catalog import Catalog
from tierlog.server.app import Server

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def admin(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": AUTH, "Content-Type": "application/json"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.admin_port}{path}", data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def scrape(server: Server) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.admin_port}/metrics", headers={"Authorization": AUTH}
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return str(response.read().decode())


async def call(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.to_thread(admin, server, method, path, body)


async def test_retiring_the_only_member_moves_the_stream_to_a_spare(tmp_path: Path) -> None:
    servers = {n: await start(node_config(tmp_path, n, secret=SECRET)) for n in ("a", "b", "c")}
    try:
        a = servers["a"]
        assert a.cluster is not None and a.meta is not None

        async def all_known() -> bool:
            return all(len(s.cluster.view.nodes) == 3 for s in servers.values())  # type: ignore[union-attr]

        await until(all_known)
        ca = await AsyncRawClient.connect(a.stream_port)
        created = await ca.request(c.CreateRequest(ca.next_corr(), "solo", {}))
        assert created.response_code == ResponseCode.OK
        await ca.request(c.DeclarePublisherRequest(ca.next_corr(), 1, "p", "solo"))
        await publish_confirmed(ca, range(1, 31))
        directory = ClusterDirectory(a.meta)
        incarnation = Catalog(a.meta).require("/", "solo").incarnation
        assert directory.require_stream(incarnation).membership.voters == ("a",)

        # bad requests are refused with their status, nothing changes
        assert (await call(a, "POST", "/api/streams/solo/members", {"add": "zz"}))[0] == 409
        assert (await call(a, "POST", "/api/streams/solo/members", {"remove": "a"}))[0] == 409
        assert (await call(a, "POST", "/api/streams/nope/members", {"add": "b"}))[0] == 404
        assert (await call(a, "POST", "/api/nodes/zz/retire", {}))[0] == 404

        status, answer = await call(servers["b"], "POST", "/api/nodes/a/retire", {})
        assert status == 202 and answer["retiring"] is True
        assert [s["stream"] for s in answer["streams_left"]] == ["/solo"]

        async def moved() -> bool:
            record = directory.require_stream(incarnation)
            return record.leader in ("b", "c") and record.membership.members == (record.leader,)

        await until(moved)
        new = servers[directory.require_stream(incarnation).leader or ""]

        async def retired() -> bool:
            return (await call(new, "GET", "/api/nodes/a"))[1]["retired"] is True

        await until(retired)
        assert not directory.node_alive("a")
        _, runtime = await call(a, "GET", "/api/cluster")
        assert runtime["retired"] is True and runtime["leading"] == []
        assert "tierlog_cluster_node_retiring 2.0" in await asyncio.to_thread(scrape, a)
        removed = "tierlog_cluster_member_changes_total 1.0"  # the new leader removed a
        assert removed in await asyncio.to_thread(scrape, new)
        # a retiring node creates nothing
        refused = await ca.request(c.CreateRequest(ca.next_corr(), "later", {}))
        assert refused.response_code != ResponseCode.OK
        ca.close()

        cn = await AsyncRawClient.connect(new.stream_port)
        await cn.request(c.DeclarePublisherRequest(cn.next_corr(), 1, "p", "solo"))
        await publish_confirmed(cn, range(31, 41))
        assert records(new, "solo") == [f"m{i}".encode() for i in range(1, 41)]
        cn.close()
        # withdrawing a finished retirement says the node must be restarted to rejoin
        status, answer = await call(new, "DELETE", "/api/nodes/a/retire")
        assert status == 200 and answer["restart"] is True
    finally:
        for server in servers.values():
            await server.stop()
