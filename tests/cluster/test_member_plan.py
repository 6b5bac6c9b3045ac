"""The leader's member-change decisions (``cluster.member_plan``): the rules one by one,
then a property test that drives a stream's members through random retirements, node
deaths and arrivals, carrying out each decided step the way the server does (a learner
is promoted once it caught up, a resigning leader is replaced by a staying voter).

Invariants after every step: at most one learner; never fewer than one voter; a new
member is never retiring, dead or already a member; a voter is only removed while the
voters staying hold the commit offset on a majority; a retiring node never leads.
Outcome: once the cluster holds enough non-retiring live nodes, every retiring node
has left the stream and it has its replication factor of voters again.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from tierlog.cluster.log_history import NO_CHUNK
from tierlog.cluster.member_plan import (
    AddLearner,
    NodesSeen,
    RemoveMember,
    Resign,
    StreamSeen,
    Wait,
    holds_commit,
    next_member_change,
)
from tierlog.cluster.members import Membership

LIVE = frozenset({"a", "b", "c", "d"})


def stream(
    voters: tuple[str, ...],
    learners: tuple[str, ...] = (),
    leader: str = "a",
    rf: int | None = None,
    commit: int = 100,
    written: dict[str, int] | None = None,
) -> StreamSeen:
    membership = Membership(voters, learners)
    if written is None:
        written = {m: commit for m in membership.members}
    return StreamSeen(leader, membership, rf or len(voters), commit, written)


def test_settled_stream_needs_nothing() -> None:
    assert next_member_change(stream(("a", "b", "c")), NodesSeen(LIVE)) is None


def test_a_learner_is_waited_for_or_abandoned() -> None:
    s = stream(("a", "b"), ("c",))
    assert isinstance(next_member_change(s, NodesSeen(LIVE)), Wait)
    assert next_member_change(s, NodesSeen(LIVE - {"c"})) == RemoveMember(
        "c", "learner c is not live"
    )
    step = next_member_change(s, NodesSeen(LIVE, frozenset({"c"})))
    assert isinstance(step, RemoveMember) and step.node == "c"


def test_a_retiring_voter_is_replaced_learner_first_then_removed() -> None:
    nodes = NodesSeen(LIVE, frozenset({"c"}), {"d": 0})
    step = next_member_change(stream(("a", "b", "c")), nodes)
    assert step == AddLearner("d", "replaces retiring c")
    # d promoted: the stream has its three staying voters, c goes
    step = next_member_change(stream(("a", "b", "c", "d"), rf=3), nodes)
    assert step == RemoveMember("c", "voter c is retiring")


def test_without_a_spare_a_retiring_voter_is_removed_once_the_rest_hold_the_commit() -> None:
    nodes = NodesSeen(frozenset({"a", "b", "c"}), frozenset({"c"}))
    lagging = stream(("a", "b", "c"), written={"a": 100, "b": 40, "c": 100})
    step = next_member_change(lagging, nodes)
    assert isinstance(step, Wait)
    caught_up = stream(("a", "b", "c"), written={"a": 100, "b": 100, "c": 100})
    assert next_member_change(caught_up, nodes) == RemoveMember("c", "voter c is retiring")


def test_a_retiring_leader_replaces_itself_then_resigns() -> None:
    nodes = NodesSeen(LIVE, frozenset({"a"}), {"c": 3, "d": 1})
    step = next_member_change(stream(("a", "b")), nodes)
    assert step == AddLearner("d", "replaces retiring a")  # the least loaded spare
    step = next_member_change(stream(("a", "b", "d"), rf=2), nodes)
    assert isinstance(step, Resign)


def test_a_companion_streams_members_are_preferred_spares() -> None:
    nodes = NodesSeen(LIVE | {"e"}, frozenset({"c"}), {"d": 0, "e": 5}, prefer=frozenset({"e"}))
    step = next_member_change(stream(("a", "b", "c")), nodes)
    assert step == AddLearner("e", "replaces retiring c")


def test_a_retiring_single_voter_leader_without_a_spare_waits() -> None:
    nodes = NodesSeen(frozenset({"a"}), frozenset({"a"}))
    assert isinstance(next_member_change(stream(("a",)), nodes), Wait)
    # with a spare it moves: learner first
    nodes = NodesSeen(frozenset({"a", "b"}), frozenset({"a"}))
    assert next_member_change(stream(("a",)), nodes) == AddLearner("b", "replaces retiring a")


def test_an_under_replicated_stream_gets_a_spare() -> None:
    step = next_member_change(stream(("a", "b"), rf=3), NodesSeen(LIVE, frozenset({"c"})))
    assert step == AddLearner("d", "2 voters, replication factor 3")
    # without a spare it runs short and says why (status, logs, the waiting gauge)
    short = next_member_change(stream(("a", "b"), rf=3), NodesSeen(frozenset({"a", "b"})))
    assert isinstance(short, Wait) and "no spare node" in short.reason


def test_holds_commit_counts_a_majority_of_the_staying_voters() -> None:
    s = stream(("a", "b", "c"), written={"a": 100, "b": 50, "c": 100})
    assert holds_commit(s, ("a", "c"))
    assert not holds_commit(s, ("a", "b"))
    assert holds_commit(replace(s, commit=NO_CHUNK), ("b",))


NAMES = ("a", "b", "c", "d", "e")


@given(
    rf=st.integers(1, 3),
    events=st.lists(
        st.tuples(
            st.sampled_from(("retire", "die", "live", "lag", "step")), st.sampled_from(NAMES)
        ),
        max_size=40,
    ),
)
def test_member_changes_stay_safe_and_converge(rf: int, events: list[tuple[str, str]]) -> None:
    live = set(NAMES[:4])
    retiring: set[str] = set()
    voters = NAMES[:rf]
    membership = Membership(voters)
    leader = voters[0]
    factor = rf
    commit = 100
    written = {n: commit for n in NAMES}

    def step_once() -> bool:
        nonlocal membership, leader
        seen = StreamSeen(leader, membership, factor, commit, dict(written))
        load = {n: 0 for n in NAMES}
        step = next_member_change(seen, NodesSeen(frozenset(live), frozenset(retiring), load))
        if step is None or isinstance(step, Wait):
            # the server's promotion: a live learner that caught up becomes a voter
            for learner in membership.learners:
                if learner in live and written[learner] >= commit:
                    membership = membership.promote(learner, written[learner], commit)
                    return True
            return False
        if isinstance(step, AddLearner):
            assert step.node in live and step.node not in retiring
            assert step.node not in membership.members
            membership = membership.add_learner(step.node)
        elif isinstance(step, RemoveMember):
            if step.node in membership.voters:
                staying = tuple(v for v in membership.voters if v != step.node)
                assert holds_commit(seen, staying)
                assert step.node != leader
            membership = membership.remove(step.node)
        elif isinstance(step, Resign):
            assert leader in retiring
            staying = [v for v in membership.voters if v not in retiring and v in live]
            assert staying
            leader = staying[0]
        assert len(membership.learners) <= 1 and membership.voters
        return True

    for kind, node in events:
        if kind == "retire" and len(retiring) < len(NAMES) - 1:
            retiring.add(node)
        elif kind == "die" and node != leader:
            live.discard(node)
        elif kind == "live":
            live.add(node)
            written[node] = commit  # a node that comes back catches up
        elif kind == "lag":
            written[node] = commit - 1
        else:
            for _ in range(3):
                step_once()
    # the cluster settles: everyone alive and caught up, at least rf spares not retiring
    for n in NAMES:
        written[n] = commit
    live |= set(NAMES)
    for _ in range(30):
        if not step_once():
            break
    staying = [n for n in NAMES if n not in retiring]
    if len(staying) >= factor:
        assert leader not in retiring
        assert not set(membership.members) & retiring
        assert len(membership.voters) == factor
