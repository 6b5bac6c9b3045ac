"""The pure cluster decisions, case by case: epochs, truncation, membership rules, and
the leader machine's election, commit, lease and promotion rules."""

from __future__ import annotations

import pytest

from tierlog.cluster import state as cs
from tierlog.cluster.errors import MembershipChangeError, StaleEpochError
from tierlog.cluster.log_history import (
    EMPTY_TAIL,
    NO_CHUNK,
    EpochRange,
    Tail,
    common_prefix_end,
    history_of,
    holds,
    tail_of,
    truncate_history,
)
from tierlog.cluster.members import Membership, majority, quorum_value
from tierlog.errors import ConfigError

TIMING = cs.LeaseTiming(ttl=10.0, drift=1.0)
THREE = Membership(("a", "b", "c"))


def log(*epochs: int) -> list[tuple[int, int]]:
    """A log with one chunk per offset: ``log(1, 1, 2)`` = chunks 0, 1 in epoch 1, 2 in 2."""
    return [(epoch, i) for i, epoch in enumerate(epochs)]


# --- epochs and histories ----------------------------------------------------------------


def test_next_leader_epoch_is_above_every_recorded_epoch() -> None:
    assert cs.next_leader_epoch(3, 1, [2]) == 4
    assert cs.next_leader_epoch(3, 7, [2]) == 8
    assert cs.next_leader_epoch(3, 1, [2, 9, 4]) == 10
    assert cs.next_leader_epoch(0, 0, []) == 1


def test_member_epoch_refuses_older_and_reports_raises() -> None:
    guard = cs.MemberEpoch()
    assert guard.check(3) is True
    assert guard.check(3) is False
    with pytest.raises(StaleEpochError) as info:
        guard.check(2)
    assert (info.value.epoch, info.value.highest) == (2, 3)
    assert guard.highest == 3


def test_history_and_tail() -> None:
    history = history_of(log(1, 1, 2, 2, 2, 5))
    assert history == (EpochRange(1, 0, 1), EpochRange(2, 2, 4), EpochRange(5, 5, 5))
    assert tail_of(history) == Tail(5, 5)
    assert tail_of(()) == EMPTY_TAIL
    with pytest.raises(ValueError):
        history_of([(2, 0), (1, 1)])
    with pytest.raises(ValueError):
        history_of([(1, 3), (1, 3)])


def test_tails_compare_epoch_before_offset() -> None:
    assert Tail(2, 3) > Tail(1, 9)
    assert Tail(2, 4) > Tail(2, 3)
    assert Tail(0, 0) > EMPTY_TAIL


@pytest.mark.parametrize(
    ("local", "leader", "keep"),
    [
        # member is a prefix of the leader: keep everything
        (log(1, 1), log(1, 1, 1, 2), 1),
        # member went on in epoch 1 past the leader's last epoch-1 chunk: cut after it
        (log(1, 1, 1, 1), log(1, 1, 2, 2), 1),
        # member holds an epoch the leader never had: back to the previous common epoch
        (log(1, 3, 3), log(1, 2, 2, 2), 0),
        # member and leader share the leader's newest epoch: keep up to the member's end
        (log(1, 2, 2), log(1, 2, 2, 2, 2), 2),
        # nothing in common
        (log(3, 3), log(1, 2), NO_CHUNK),
        ([], log(1, 2), NO_CHUNK),
        (log(1, 1), [], NO_CHUNK),
        # identical logs
        (log(1, 2, 4), log(1, 2, 4), 2),
    ],
)
def test_common_prefix_end_follows_osiris_truncation(
    local: list[tuple[int, int]], leader: list[tuple[int, int]], keep: int
) -> None:
    assert common_prefix_end(history_of(local), history_of(leader)) == keep
    # Whatever is kept is identical on both sides (the rule never keeps a divergence).
    assert local[: keep + 1] == leader[: keep + 1]


def test_holds_and_truncate_history() -> None:
    history = history_of(log(1, 1, 2, 2))
    assert holds(history, Tail(2, 3))
    assert holds(history, Tail(1, 0))
    assert holds(history, EMPTY_TAIL)
    assert not holds(history, Tail(1, 2))
    assert not holds(history, Tail(3, 3))
    assert truncate_history(history, 2) == (EpochRange(1, 0, 1), EpochRange(2, 2, 2))
    assert truncate_history(history, NO_CHUNK) == ()


# --- membership -------------------------------------------------------------------------


def test_quorum_arithmetic() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert quorum_value({"a": 9, "b": 5, "c": 1}, ["a", "b", "c"], -1) == 5
    assert quorum_value({"a": 9}, ["a", "b", "c"], -1) == -1
    assert quorum_value({"a": 9, "b": 7}, ["a", "b", "c", "d"], -1) == -1


def test_membership_changes_one_at_a_time() -> None:
    grown = THREE.add_learner("d")
    assert grown.learners == ("d",) and grown.changing
    with pytest.raises(MembershipChangeError):
        grown.add_learner("e")
    with pytest.raises(MembershipChangeError):
        grown.remove("a")
    with pytest.raises(MembershipChangeError):
        grown.promote("d", learner_written=4, commit_offset=5)
    promoted = grown.promote("d", learner_written=5, commit_offset=5)
    assert promoted.voters == ("a", "b", "c", "d") and not promoted.changing
    assert promoted.remove("a").voters == ("b", "c", "d")
    assert grown.remove("d") == THREE
    with pytest.raises(MembershipChangeError):
        Membership(("a",)).remove("a")
    with pytest.raises(MembershipChangeError):
        THREE.add_learner("a")
    with pytest.raises(MembershipChangeError):
        Membership(("a",), ("a",))


# --- the leader machine -----------------------------------------------------------------


def leader(
    own: Tail = EMPTY_TAIL, membership: Membership = THREE, epoch: int = 5
) -> cs.LeaderState:
    return cs.LeaderState("a", epoch, membership, own, TIMING, acquired_at=100.0)


def elect(state: cs.LeaderState, now: float = 100.0) -> list[cs.Effect]:
    assert state.start(now) == [cs.RequestAdopt(("b", "c"), state.epoch)]
    return state.handle(cs.EpochAdopted("b", state.epoch, EMPTY_TAIL), now)


def test_lease_timing_is_validated() -> None:
    with pytest.raises(ConfigError):
        cs.LeaseTiming(ttl=5.0, drift=5.0)
    with pytest.raises(ConfigError):
        cs.LeaseTiming(ttl=5.0, drift=0.0)


def test_elected_with_a_majority_appends_a_snapshot_in_its_epoch() -> None:
    state = leader(Tail(4, 7))
    assert elect(state) == [cs.AppendTrackingSnapshot(5)]
    assert state.accepts_appends


def test_catches_up_to_the_most_up_to_date_member() -> None:
    state = leader(Tail(4, 7))
    state.start(100.0)
    assert state.handle(cs.EpochAdopted("b", 5, Tail(4, 9)), 100.0) == [cs.CatchUp("b", Tail(4, 9))]
    assert not state.accepts_appends
    assert state.handle(cs.CaughtUp(Tail(4, 8)), 100.0) == []  # not the tail asked for
    assert state.handle(cs.CaughtUp(Tail(4, 9)), 100.0) == [cs.AppendTrackingSnapshot(5)]


def test_higher_epoch_beats_higher_offset() -> None:
    state = leader(Tail(4, 3))
    state.start(100.0)
    assert state.handle(cs.EpochAdopted("b", 5, Tail(3, 9)), 100.0) == [
        cs.AppendTrackingSnapshot(5)
    ]


def test_catch_up_failure_steps_down() -> None:
    state = leader(Tail(4, 3))
    state.start(100.0)
    state.handle(cs.EpochAdopted("b", 5, Tail(4, 9)), 100.0)
    effects = state.handle(cs.CatchUpFailed("b went away"), 100.0)
    assert isinstance(effects[0], cs.StepDown) and state.phase is cs.Phase.STEPPED_DOWN


def test_without_a_majority_it_never_leads_and_steps_down_after_a_ttl() -> None:
    state = leader(Tail(4, 3), Membership(("a", "b", "c", "d", "e")))
    state.start(100.0)
    assert state.handle(cs.EpochAdopted("b", 5, Tail(9, 9)), 101.0) == []  # 2 of 5
    assert state.handle(cs.LeaseRenewed(105.0), 105.0) == []
    assert state.handle(cs.Tick(), 110.0) == []
    effects = state.handle(cs.Tick(), 111.5)
    assert [type(e) for e in effects] == [cs.StepDown]
    assert "check-quorum" in state.step_down_reason  # type: ignore[operator]


def test_refusal_from_a_newer_epoch_deposes() -> None:
    state = leader()
    state.start(100.0)
    assert state.handle(cs.EpochRefused("b", 4), 100.0) == []  # older: irrelevant
    assert isinstance(state.handle(cs.EpochRefused("b", 6), 100.0)[0], cs.StepDown)


def test_commit_waits_for_a_current_epoch_chunk_on_a_majority() -> None:
    state = leader(Tail(3, 4))
    elect(state)
    state.handle(cs.LocalWritten(5, 5), 100.0)  # our tracking snapshot
    # b holds the old chunks 0..4: a majority holds 4, but 4 is an old-epoch chunk.
    assert state.handle(cs.MemberAcked("b", 5, 4), 100.0) == []
    assert state.commit == NO_CHUNK
    assert state.handle(cs.MemberAcked("b", 5, 5), 100.0) == [cs.Commit(5)]
    state.handle(cs.LocalWritten(6, 5), 100.0)
    assert state.handle(cs.MemberAcked("c", 5, 6), 100.0) == [cs.Commit(6)]


def test_acks_from_other_epochs_do_not_count() -> None:
    state = leader(Tail(3, 4))
    elect(state)
    state.handle(cs.LocalWritten(5, 5), 100.0)
    assert state.handle(cs.MemberAcked("b", 4, 5), 100.0) == []
    assert state.handle(cs.MemberAcked("x", 5, 5), 100.0) == []  # not a member
    assert state.commit == NO_CHUNK


def test_stops_confirming_before_the_lease_can_expire_then_steps_down() -> None:
    state = leader(Tail(3, 4))
    elect(state)
    state.handle(cs.LocalWritten(5, 5), 100.0)
    state.handle(cs.MemberAcked("b", 5, 5), 100.0)
    state.handle(cs.LocalWritten(6, 5), 100.0)
    # 100 + TTL - drift = 109: an ack at 109.5 is recorded but not confirmed.
    assert state.handle(cs.MemberAcked("b", 5, 6), 109.5) == []
    assert state.commit == 5
    # A renewal sent at 105 extends the deadline to 114: the held commit goes out.
    assert state.handle(cs.LeaseRenewed(105.0), 109.6) == [cs.Commit(6)]
    effects = state.handle(cs.Tick(), 115.0)
    assert [type(e) for e in effects] == [cs.StepDown]


def test_a_paused_leader_woken_after_its_lease_confirms_nothing() -> None:
    state = leader(Tail(3, 4))
    elect(state)
    state.handle(cs.LocalWritten(5, 5), 100.0)
    # SIGSTOP for 30 s: the first event after waking is an ack that would commit.
    effects = state.handle(cs.MemberAcked("b", 5, 5), 130.0)
    assert [type(e) for e in effects] == [cs.StepDown]
    assert state.commit == NO_CHUNK
    assert state.handle(cs.MemberAcked("c", 5, 5), 130.0) == []


def test_lease_lost_steps_down() -> None:
    state = leader()
    elect(state)
    assert isinstance(state.handle(cs.LeaseLost(), 100.0)[0], cs.StepDown)
    assert state.handle(cs.Tick(), 100.0) == []


def test_learner_promoted_once_it_holds_the_commit_offset() -> None:
    state = leader(Tail(3, 4), THREE.add_learner("d"))
    state.start(100.0)
    state.handle(cs.EpochAdopted("d", 5, Tail(3, 9)), 100.0)  # learners never count
    assert state.phase is cs.Phase.ADOPTING
    state.handle(cs.EpochAdopted("b", 5, EMPTY_TAIL), 100.0)
    state.handle(cs.LocalWritten(5, 5), 100.0)
    state.handle(cs.MemberAcked("d", 5, 3), 100.0)
    assert state.handle(cs.MemberAcked("b", 5, 5), 100.0) == [cs.Commit(5)]
    assert state.handle(cs.MemberAcked("d", 5, 5), 100.0) == [cs.PromoteLearner("d", 5, 5)]
    assert state.handle(cs.MemberAcked("d", 5, 5), 100.0) == []  # one proposal at a time
    promoted = THREE.add_learner("d").promote("d", 5, 5)
    assert state.handle(cs.MembersChanged(promoted), 100.0) == []
    assert state.membership.voters == ("a", "b", "c", "d")


def test_removed_leader_steps_down() -> None:
    state = leader()
    elect(state)
    effects = state.handle(cs.MembersChanged(Membership(("b", "c"))), 100.0)
    assert [type(e) for e in effects] == [cs.StepDown]


def test_single_voter_stream_commits_alone() -> None:
    state = cs.LeaderState("a", 1, Membership(("a",)), EMPTY_TAIL, TIMING, acquired_at=0.0)
    assert state.start(0.0) == [cs.RequestAdopt((), 1), cs.AppendTrackingSnapshot(1)]
    assert state.handle(cs.LocalWritten(0, 1), 0.0) == [cs.Commit(0)]
