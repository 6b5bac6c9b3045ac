"""The bounded CI profile of the three-member cluster fault campaign
(``tests/cluster/nodes_campaign_replicated.py``; ``scripts/cluster_nodes_campaign.py
--members 3`` runs the long one): two cycles on three ``tierlog serve`` nodes (one
etcd, one SeaweedFS, lease TTL 5 s), a stream of three members and an ``rstream`` named
producer with confirms: the leader isolated from its members (it keeps etcd; the
majority side elects a new leader), then a voter removed and added back (a learner,
then promoted). After each cycle: every confirmed message read back exactly once, in
order, through the leader; every member's segment and index files byte-identical to the
leader's; at the end no pointer regression and no confirm from the isolated leader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.nodes_campaign_replicated import run_replicated_campaign
from tests.plugins.seaweed import SeaweedServer

pytestmark = [pytest.mark.etcd, pytest.mark.s3]

CI_FAULTS = ("isolate-leader", "remove-and-add")


async def test_three_member_campaign_bounded(
    tmp_path: Path, etcd_server: str, seaweed: SeaweedServer
) -> None:
    result = await run_replicated_campaign(
        tmp_path, etcd_server, seaweed, cycles=2, seed=1, faults=CI_FAULTS, in_order=True
    )
    assert result.problems == []
    assert result.faults == {fault: 1 for fault in CI_FAULTS}
    assert result.read_back >= result.confirmed > 0
    assert result.epochs >= 2  # the isolated leader was replaced in a higher epoch
