"""A member change at run time on three in-process nodes: the leader of a two-member
stream adds the third node as a learner; it catches up from the leader (a late joiner)
and the leader promotes it to a voter once it holds everything up to the commit
offset (the ``PromoteLearner`` effect carried out as a directory transaction); its
segment and index files are byte-identical to the leader's."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.test_node_replication import SECRET, orders_on_three_nodes, stream_files
from tests.cluster.test_node_servers import (
    node_config,
    publish_confirmed,
    start,
    until,
)
from tierlog.cluster.membership import ClusterDirectory
from tierlog.cluster.state import MembersChanged
from tierlog.remote.catalog import Catalog

ARGS = {"x-initial-cluster-size": "2", "x-tierlog-max-segment-chunks": "8"}


async def test_a_learner_catches_up_and_is_promoted(tmp_path: Path) -> None:
    servers = {n: await start(node_config(tmp_path, n, secret=SECRET)) for n in ("a", "b", "c")}
    try:
        a = servers["a"]
        assert a.cluster is not None
        ca = await orders_on_three_nodes(servers, ARGS, 40)
        meta = a.meta
        assert meta is not None
        directory = ClusterDirectory(meta)
        incarnation = Catalog(meta).require("/", "orders").incarnation
        record = directory.require_stream(incarnation)
        assert record.leader == "a" and len(record.membership.voters) == 2
        (joiner,) = [n for n in servers if n not in record.membership.voters]

        service = a.cluster
        leader = service.node.leaders[incarnation]
        leader.leadership = directory.add_learner(leader.leadership, joiner)
        service._feed(incarnation, MembersChanged(leader.leadership.membership))
        assert directory.require_stream(incarnation).membership.learners == (joiner,)
        await publish_confirmed(ca, range(41, 81))  # keeps the commit offset moving

        async def promoted() -> bool:
            return joiner in directory.require_stream(incarnation).membership.voters

        await until(promoted)
        current = directory.require_stream(incarnation)
        assert current.membership.learners == () and current.leader == "a"
        assert current.epoch == record.epoch  # a member change, not a new election
        handle = a.broker.get("/", "orders")  # type: ignore[union-attr]
        assert handle is not None
        leader_dir = Path(handle.log.stream_dir)
        await publish_confirmed(ca, range(81, 91))

        async def identical() -> bool:
            return stream_files(tmp_path / joiner / "streams" / incarnation) == stream_files(
                leader_dir
            )

        await until(identical)
        ca.close()
    finally:
        for server in servers.values():
            await server.stop()
