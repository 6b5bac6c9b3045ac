"""``StreamLeader.when_committed`` (pure): an answer that must survive a failover (a
consumer offset the leader answers) waits for the stream's cluster commit to reach the
chunk holding it, as publish confirms do, and is refused when the leader steps down
first; it writes nothing and keeps the waiting in chunk order."""

from __future__ import annotations

from tierlog.cluster.log_history import Tail
from tierlog.cluster.members import Membership
from tierlog.cluster.membership import Leadership
from tierlog.cluster.node import ClusterNode
from tierlog.cluster.state import Commit, EpochAdopted, LeaseTiming, StepDown


def test_an_answer_waits_for_the_commit_of_its_chunk_or_is_refused_at_step_down() -> None:
    node = ClusterNode("a", LeaseTiming(ttl=10.0, drift=1.0), clock=lambda: 0.0)
    leadership = Leadership("v_s_1", "a", 2, Membership(("a", "b", "c")), 1, 1)
    leader = node.lead(leadership, Tail(1, 100), acquired_at=0.0)
    leader.start(0.0)
    leader.handle(EpochAdopted("b", 2, Tail(1, 100)), 0.1)
    leader.apply_local([Commit(100)])
    got: list[object] = []
    leader.when_committed(90, lambda: got.append(90), got.append)  # committed already
    assert got == [90]
    leader.when_committed(300, lambda: got.append(300), got.append)
    leader.when_committed(200, lambda: got.append(200), got.append)  # goes before 300
    leader.apply_local([Commit(250)])
    assert got == [90, 200]
    leader.apply_local([StepDown("cut from its members")])
    assert got == [90, 200, "cut from its members"]  # never answered after all
    assert not leader.waiting
