"""An operator's view of a stream's cluster state, and log lines that say what is wrong.

* ``GET /api/streams/{name}`` on a cluster node carries a ``cluster`` section: leader,
  epoch, replication factor, and every member with its role (voter / learner), its
  written and committed chunks, its lag and a state word with the reason it is not
  following. A follower answers ``following`` (not the undocumented ``led-elsewhere``).
* Every state word the API can return is the one list in ``server/cluster_view.py`` and
  the one table in docs/cluster.md ("What an operator sees"), compared here, and the
  status code takes its words from nowhere else.
* A peer without a registered address is logged once per streak as such, not as
  ``replication_dial_failed … KeyError('n1')`` every few seconds; a healthy follower's
  start-up does not count its followed streams as failed.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import threading
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster.hub_helpers import Cluster
from tests.cluster.test_node_replication import SECRET, orders_on_three_nodes
from tests.cluster.test_node_servers import AsyncRawClient, node_config, start, until
from tests.log_events import events
from tierlog.cluster.replica_runner import ReplicaState
from tierlog.formats import replication as wire
from tierlog.formats.protocol import commands as c
from tierlog.remote.catalog import Catalog
from tierlog.server import cluster_view
from tierlog.server.app import Server
from tierlog.server.cluster_view import MEMBER_STATES, STREAM_STATES, member_state

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
TTL = 2.0


async def stream_status(server: Server, name: str = "orders") -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.admin_port}/api/streams/{name}"
    async with aiohttp.ClientSession(headers=AUTH) as http, http.get(url) as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


def by_node(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["node"]: m for m in status["cluster"]["members"]}


async def test_leader_and_members_show_the_cluster_state(tmp_path: Path) -> None:
    def config(name: str) -> Any:
        base = node_config(tmp_path, name, secret=SECRET)
        return replace(
            base, cluster=replace(base.cluster, lease_ttl_seconds=TTL, drift_seconds=0.5)
        )

    servers = {n: await start(config(n)) for n in ("a", "b", "c")}
    release = threading.Event()
    try:
        a, b = servers["a"], servers["b"]
        ca = await orders_on_three_nodes(servers, {"x-initial-cluster-size": "3"}, 10)

        async def all_follow() -> bool:
            members = by_node(await stream_status(a))
            return all(m["state"] in ("leading", "following") for m in members.values())

        await until(all_follow)
        on_a = await stream_status(a)
        assert on_a["state"] == "available"
        cluster = on_a["cluster"]
        assert (cluster["leader"], cluster["this_node"], cluster["replication_factor"]) == (
            "a",
            "a",
            3,
        )
        assert cluster["epoch"] >= 1
        members = by_node(on_a)
        assert {n: m["role"] for n, m in members.items()} == dict.fromkeys("abc", "voter")
        assert members["a"]["state"] == "leading"
        assert members["b"]["lag_offsets"] == 0 and members["b"]["why"] is None
        assert members["b"]["written_chunk_id"] == members["a"]["written_chunk_id"]

        async def b_follows() -> bool:
            return by_node(await stream_status(b))["b"]["state"] == "following"

        await until(b_follows)
        on_b = await stream_status(b)
        assert on_b["state"] == "following"  # not the undocumented "led-elsewhere"
        mine = by_node(on_b)["b"]
        assert mine["serves_consumers"] is True and mine["not_serving_because"] is None
        assert mine["committed_chunk_id"] >= 0 and mine["lag_offsets"] == 0
        assert by_node(on_b)["a"]["state"] == "leading"
        assert by_node(on_b)["c"]["state"] == "unknown"  # only a and c know c's progress
        url = f"http://127.0.0.1:{b.admin_port}/api/streams"
        async with aiohttp.ClientSession(headers=AUTH) as http, http.get(url) as r:
            listed = {s["name"]: s["state"] for s in (await r.json())["streams"]}
        assert listed == {"orders": "following"}

        # b gets stuck (its writer lane runs nothing): the leader shows it behind or
        # silent, with the reason, and b shows it no longer serves consumers, and why
        assert b.meta is not None and b.cluster is not None and b.cluster.followers
        incarnation = Catalog(b.meta).require("/", "orders").incarnation
        b.cluster.followers.streams[incarnation].lane.submit(release.wait)
        for k in range(5):
            await publish_one(ca, 100 + k)

        async def a_sees_b_stuck() -> bool:
            return by_node(await stream_status(a))["b"]["state"] in ("catching-up", "not-heard")

        await until(a_sees_b_stuck)
        stuck = by_node(await stream_status(a))["b"]
        assert stuck["why"] and stuck["lag_offsets"] > 0

        async def b_says_why() -> bool:
            return by_node(await stream_status(b))["b"]["serves_consumers"] is False

        await until(b_says_why)
        why = by_node(await stream_status(b))["b"]["not_serving_because"]
        assert why.startswith("no word from leader a")
        release.set()
        await until(all_follow)
        ca.close()
    finally:
        release.set()
        for server in servers.values():
            await server.stop()


async def publish_one(client: AsyncRawClient, publishing_id: int) -> None:
    from tierlog.formats.protocol.publish import PublishConfirm, encode_publish

    client.send(encode_publish(1, [(publishing_id, b"x")]))
    await client.expect(PublishConfirm)


def test_member_states_and_reasons() -> None:
    """The one decision, including the member's own account of a failure."""
    common = {"live": True, "leads": False, "committed": 100, "silence": 5.0}
    assert member_state(**common, written=100, heard_age=0.5) == ("following", None)
    assert member_state(**common, written=None, heard_age=None)[0] == "unknown"
    word, why = member_state(**common, written=40, heard_age=0.5)
    assert (word, why) == ("catching-up", "catching up from 60 offsets behind the commit")
    assert member_state(**common, written=100, heard_age=9.0)[0] == "not-heard"
    assert member_state(**{**common, "live": False}, written=100, heard_age=0.5)[0] == "down"
    failed = member_state(
        **common,
        written=None,
        heard_age=None,
        replica_state="failed",
        last_error="OSError(28, 'No space left on device')",
    )
    assert failed == ("failed", "failed: OSError(28, 'No space left on device')")
    far = member_state(
        **common, written=None, heard_age=None, replica_state="catching-up", behind=12_345
    )
    assert far == ("catching-up", "catching up from 12,345 offsets behind the commit")
    assert member_state(**{**common, "leads": True}, written=0, heard_age=None)[0] == "leading"


def documented_words(heading: str) -> set[str]:
    """The backticked words of the first column of the table under ``heading`` in the
    section "What an operator sees" of docs/cluster.md."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    section = text.split("### What an operator sees", 1)[1]
    part = section.split(heading, 1)[1]
    words = set()
    for line in part.splitlines()[1:]:
        if line.startswith("|"):
            match = re.match(r"\|\s*`([a-z-]+)`", line)
            if match:
                words.add(match.group(1))
        elif words:
            break
    return words


def state_words_in(path: Path) -> set[str]:
    """String constants a module puts under a ``state`` key or into a ``state``
    attribute (module constants they name resolved)."""
    tree = ast.parse(path.read_text())
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value.value, str)
    }

    def strings(node: ast.AST) -> set[str]:
        """The values an expression can take (a conditional's branches, not its test)."""
        if isinstance(node, ast.IfExp):
            return strings(node.body) | strings(node.orelse)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Name) and node.id in constants:
            return {constants[node.id]}
        return set()

    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                keyed = isinstance(key, ast.Constant) and key.value == "state"
                if keyed and isinstance(value, ast.IfExp | ast.Constant | ast.Name):
                    words |= {w for w in strings(value) if re.fullmatch(r"[a-z-]+", w)}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                for i, t in enumerate(names):
                    named = (
                        (isinstance(t, ast.Attribute) and t.attr == "state")
                        or (isinstance(t, ast.Name) and t.id == "state")
                        or (
                            isinstance(t, ast.Subscript)
                            and isinstance(t.slice, ast.Constant)
                            and t.slice.value == "state"
                        )
                    )
                    value = node.value
                    if named and value is not None:
                        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                            value = value.elts[i]
                        if isinstance(value, ast.Constant | ast.Name):
                            words |= strings(value)
    return words


def test_every_state_word_is_documented_and_declared_once() -> None:
    assert documented_words("Stream states") == set(STREAM_STATES)
    assert documented_words("Member states") == set(MEMBER_STATES)
    server = ROOT / "src" / "tierlog" / "server"
    returned = set()
    for module in ("broker.py", "member_reads.py", "remote_stream.py"):
        returned |= state_words_in(server / module)
    assert returned == set(STREAM_STATES), returned ^ set(STREAM_STATES)
    # the member words come from the decision and the replica runner's states
    assert set(typing.get_args(ReplicaState)) <= set(MEMBER_STATES)
    source = Path(cluster_view.__file__).read_text()
    decided = set(re.findall(r'return "([a-z-]+)", ', source))
    assert decided == set(MEMBER_STATES)


async def test_a_peer_without_an_address_is_named_once(
    hubs: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tierlog.cluster.hub")
    hub = await hubs.add("n2")
    hub.send("n1", wire.Commit("v_s_1", 1, 0))  # n1 never registered (its lease is gone)
    await asyncio.sleep(3.5)  # four or five attempts at the growing pause
    assert not [
        e for e in events(caplog.records, "replication_dial_failed") if "KeyError" in e["error"]
    ]
    (unknown,) = events(caplog.records, "replication_peer_unknown")
    assert unknown["peer"] == "n1" and "lease is gone" in unknown["reason"]


async def test_a_follower_start_counts_no_failed_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tierlog.server.broker")
    servers = {n: await start(node_config(tmp_path, n, secret=SECRET)) for n in ("a", "b")}
    try:
        a = servers["a"]
        assert a.cluster is not None

        async def both_known() -> bool:
            await a.cluster.scan()  # type: ignore[union-attr]
            return len(a.cluster.view.nodes) == 2  # type: ignore[union-attr]

        await until(both_known)
        ca = await AsyncRawClient.connect(a.stream_port)
        created = await ca.request(
            c.CreateRequest(ca.next_corr(), "orders", {"x-initial-cluster-size": "2"})
        )
        assert created.response_code == 1
        ca.close()
        await servers["b"].stop()
        caplog.clear()
        servers["b"] = await start(node_config(tmp_path, "b", secret=SECRET))  # a follower again
        (opened,) = events(caplog.records, "streams_opened")
        assert opened["failed"] == "0"  # a followed stream is not a failure
        assert (opened["streams"], opened["led_elsewhere"]) == ("1", "1")
    finally:
        for server in servers.values():
            await server.stop()
