"""Single active consumer is not cluster-wide yet: a cluster node refuses it with
PRECONDITION_FAILED (logged ``sac_refused``) rather than run a group per node, where two
consumers of one group attached to two nodes would both be active."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.test_node_servers import AsyncRawClient, node_config, start
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode


async def test_a_cluster_node_refuses_single_active_consumer(tmp_path: Path) -> None:
    server = await start(node_config(tmp_path, "a"))
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        created = await client.request(c.CreateRequest(client.next_corr(), "orders", {}))
        assert created.response_code == ResponseCode.OK
        first = c.WireOffsetSpec(OffsetType.FIRST)
        sac = {"single-active-consumer": "true", "name": "grp"}
        refused = await client.request(
            c.SubscribeRequest(client.next_corr(), 1, "orders", first, 10, sac)
        )
        assert refused.response_code == ResponseCode.PRECONDITION_FAILED
        plain = await client.request(
            c.SubscribeRequest(client.next_corr(), 1, "orders", first, 10, {"name": "grp"})
        )
        assert plain.response_code == ResponseCode.OK
        client.close()
    finally:
        await server.stop()
