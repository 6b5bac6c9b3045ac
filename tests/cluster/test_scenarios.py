"""Scripted interleavings in the simulated cluster that the random search reaches only
rarely: each one loses a committed chunk if its rule is broken (the campaign script's
mutation mode checks that), and passes with the rules as built."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cluster.world import InvariantViolation, Message, World
from tierlog.cluster import state as cs
from tierlog.cluster.disk_identity import MemberDisks
from tierlog.cluster.log_history import Tail
from tierlog.cluster.members import Membership

TTL = 10.0
TIMING = cs.LeaseTiming(TTL, 0.5)
EXPIRE = TTL + 1.0


def five_voters() -> World:
    names = [f"n{i}" for i in range(5)]
    world = World(names, TIMING, [1.0] * 5)
    world.membership = Membership(tuple(names))
    world.disks = MemberDisks.created(names)  # every voter has a place to claim
    return world


def deliver_all(world: World, keep: Callable[[Message], bool] = lambda m: False) -> None:
    """Deliver every message (and the replies they cause) except those ``keep`` holds."""
    while True:
        pending = [i for i, m in enumerate(world.network) if not keep(m)]
        deliverable = [i for i in pending if not world.nodes[world.network[i].to].paused]
        if not deliverable:
            return
        world.deliver(deliverable[0])


def leading(world: World, name: str) -> bool:
    leader = world.nodes[name].leader
    return leader is not None and leader.phase is cs.Phase.LEADING


def test_old_epoch_copies_on_a_majority_are_not_committed() -> None:
    """Raft's figure 8: a leader must not commit a chunk of an older epoch by counting
    its copies; only a chunk of its own epoch on a majority commits."""
    world = five_voters()
    world.acquire("n0")  # epoch 1
    deliver_all(world)
    assert leading(world, "n0")
    world.append("n0")  # (1, 1) on n0 and n1 only
    world.sync("n1", "n0", 10)
    deliver_all(world)
    world.crash("n0")
    world.tick(EXPIRE)
    world.cut("n4", "n1")
    world.acquire("n4")  # epoch 2, elected by n2, n3, n4: its snapshot (2, 0) stays on n4
    deliver_all(world)
    assert leading(world, "n4") and world.nodes["n4"].log == [(2, 0)]
    world.crash("n4")
    world.heal()
    world.restart("n0")
    world.tick(EXPIRE)
    world.cut("n0", "n3")
    world.cut("n0", "n4")
    world.acquire("n0")  # epoch 3, snapshot (3, 2)
    deliver_all(world)
    assert leading(world, "n0")
    world.sync("n2", "n0", 2)  # the epoch-1 chunks reach n2: on a majority (n0, n1, n2)
    world.sync("n1", "n0", 0)
    deliver_all(world)
    world.crash("n0")
    world.heal()
    world.restart("n4")
    world.tick(EXPIRE)
    world.cut("n4", "n0")
    world.cut("n4", "n1")
    world.acquire("n4")  # epoch 4 elected by n2, n3, n4: best tail (2, 0) on n4
    deliver_all(world)
    assert world.nodes["n4"].leader is not None
    assert world.nodes["n4"].leader.epoch == 4
    world.check_always()


def test_stale_ack_from_an_older_epoch_is_not_counted() -> None:
    """A member's ack sent while it followed epoch 1 arrives after the same node leads
    again in epoch 3; the member's log changed since, so the ack must not count."""
    world = five_voters()
    world.acquire("n0")  # epoch 1
    deliver_all(world)
    for _ in range(5):
        world.append("n0")
    world.sync("n1", "n0", 10)  # n1 holds (1, 0..5); its ack stays in flight

    def stale(message: Message) -> bool:
        return isinstance(message.body, cs.MemberAcked) and message.body.epoch == 1

    world.crash("n0")
    world.tick(EXPIRE)
    world.cut("n2", "n1")
    world.acquire("n2")  # epoch 2 elected by n2, n3, n4 (empty logs)
    deliver_all(world, keep=stale)
    assert leading(world, "n2")
    world.append("n2")
    world.append("n2")
    world.heal()
    world.restart("n0")
    for member in ("n0", "n1", "n3"):
        world.sync(member, "n2", 10)  # n0 and n1 cut their epoch-1 suffix
    assert world.nodes["n1"].log == [(2, 0), (2, 1), (2, 2)]
    deliver_all(world, keep=stale)
    world.crash("n2")
    world.tick(EXPIRE)
    world.acquire("n0")  # epoch 3
    deliver_all(world, keep=stale)
    assert leading(world, "n0")
    world.append("n0")
    world.append("n0")
    world.sync("n3", "n0", 10)
    deliver_all(world, keep=stale)
    deliver_all(world)  # now the stale epoch-1 ack (written 5) reaches n0
    leader = world.nodes["n0"].leader
    assert leader is not None and leader.commit < 3  # n1 really holds only up to 2
    world.crash("n0")
    world.restart("n2")
    world.tick(EXPIRE)
    world.cut("n2", "n3")
    world.acquire("n2")  # epoch 4 elected by n1, n2, n4
    deliver_all(world)
    assert world.nodes["n2"].leader is not None
    assert world.nodes["n2"].tail() >= Tail(4, 3)
    world.check_always()


def test_failover_keeps_every_committed_chunk() -> None:
    """The plain case: commit in epoch 1, kill the leader, the new leader holds it all."""
    world = five_voters()
    world.acquire("n0")
    deliver_all(world)
    for _ in range(3):
        world.append("n0")
    for member in ("n1", "n2"):
        world.sync(member, "n0", 10)
    deliver_all(world)
    assert world.nodes["n0"].leader is not None
    assert world.nodes["n0"].leader.commit == 3
    world.crash("n0")
    world.tick(EXPIRE)
    world.acquire("n3")  # empty log; must catch up from n1 or n2
    deliver_all(world)
    world.catch_up("n3")
    assert leading(world, "n3")
    assert world.nodes["n3"].log[:4] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert len(world.committed) == 4


def test_slow_clock_leader_stops_confirming_before_its_lease_expires() -> None:
    """A leader whose clock runs 10 % slow: its lease expires in the MetaStore after
    TTL of real time, when its own clock shows 0.9 TTL; with the drift margin it has
    stopped confirming by then, so an ack arriving after a new leader took over
    confirms nothing."""
    names = ["n0", "n1", "n2"]
    world = World(names, cs.LeaseTiming(TTL, 1.5), [0.9, 1.0, 1.0])
    world.acquire("n0")
    deliver_all(world)
    world.append("n0")
    world.sync("n1", "n0", 10)
    deliver_all(world)
    leader = world.nodes["n0"].leader
    assert leader is not None and leader.commit == 1
    world.append("n0")
    world.sync("n1", "n0", 10)  # the ack for chunk 2 stays in flight
    world.tick(TTL + 0.2)  # lease gone in the MetaStore; n0's clock shows 9.18 s
    world.cut("n0", "n2")
    world.acquire("n2")
    assert world.record_leader == "n2"
    deliver_all(world)  # n1's ack reaches n0 after n2 took over: no confirm
    assert world.nodes["n0"].leader is None or world.nodes["n0"].leader.commit == 1


def test_newer_epoch_beats_a_longer_log() -> None:
    """The most up-to-date log is chosen by epoch first: a longer log of an older epoch
    (uncommitted chunks of a crashed leader) loses to a shorter, newer one."""
    world = World(["n0", "n1", "n2"], TIMING, [1.0] * 3)
    world.acquire("n0")  # epoch 1
    deliver_all(world)
    for _ in range(4):
        world.append("n0")  # (1, 1..4) on n0 only
    world.crash("n0")
    world.tick(EXPIRE)
    world.acquire("n1")  # epoch 2 elected by n1 and n2
    deliver_all(world)
    world.sync("n2", "n1", 10)
    deliver_all(world)
    leader = world.nodes["n1"].leader
    assert leader is not None and leader.commit == 0  # (2, 0) committed on n1 and n2
    world.crash("n1")
    world.restart("n0")
    world.tick(EXPIRE)
    world.acquire("n0")  # epoch 3: tails n0 (1, 4), n2 (2, 0)
    deliver_all(world)
    world.catch_up("n0")
    assert leading(world, "n0")
    assert world.nodes["n0"].log[0] == (2, 0)


def test_members_refuse_a_deposed_leader() -> None:
    """A leader whose lease lapsed but that has not noticed yet still serves a fetch;
    a member that adopted the newer epoch refuses it (and the old leader steps down)."""
    world = World(["n0", "n1", "n2"], TIMING, [1.0] * 3)
    world.acquire("n0")
    deliver_all(world)
    world.append("n0")  # (1, 1), on n0 only
    world.time += EXPIRE  # no tick: n0 has not looked at its clock yet
    world.cut("n0", "n2")
    world.acquire("n2")  # epoch 2, adopted by n1
    deliver_all(world)
    assert world.nodes["n0"].leader is not None  # n0 still believes it leads
    world.sync("n1", "n0", 10)
    assert (1, 1) not in world.nodes["n1"].log
    assert world.nodes["n0"].leader is None  # told of epoch 2 by the refusal


def lost_disk_sequence(world: World) -> None:
    """Issue 29's sequence: A committed on all three; n2 paused; B committed on n0 + n1;
    n0 crashes and n1 comes back with an empty disk; n2 wakes and asks for votes."""
    world.acquire("n0")  # epoch 1
    deliver_all(world)
    for _ in range(3):
        world.append("n0")  # batch A
    world.settle()
    assert all(len(world.nodes[n].log) == 4 for n in ("n0", "n1", "n2"))
    world.pause("n2")
    for _ in range(3):
        world.append("n0")  # batch B: on n0 and n1
    world.sync("n1", "n0", 10)
    deliver_all(world)
    assert max(world.committed) == 6
    world.crash("n0")
    world.lose_disk("n1")
    world.resume("n2")
    world.tick(EXPIRE)
    world.restart("n1")
    world.acquire("n2")  # epoch 2: n0 is down, n1 is the only other voter up
    deliver_all(world)


def test_a_member_that_lost_its_disk_never_votes() -> None:
    """Raft's amnesia hazard: with member disk identities n1 cannot vote, n2 is not
    elected without n0, the next election takes n0's log (A and B), and n1 rejoins as
    a learner and is promoted once it caught up."""
    world = World(["n0", "n1", "n2"], TIMING, [1.0] * 3)
    lost_disk_sequence(world)
    assert not leading(world, "n2")
    assert world.disks.lost == {"n1"}
    world.tick(EXPIRE)  # n2's election finds no majority: it steps down
    assert world.nodes["n2"].leader is None
    world.restart("n0")
    world.acquire("n0")  # epoch 3
    deliver_all(world)
    assert leading(world, "n0")
    for _ in range(4):
        world.append("n0")
        world.settle()
    assert world.demotions == 1
    assert world.members().voters == ("n0", "n1", "n2")
    assert world.disks.trusted("n1") and not world.disks.lost
    assert world.nodes["n1"].log == world.nodes["n0"].log
    world.check_always()


def test_without_disk_identities_the_empty_disk_elects_a_short_log() -> None:
    """The same sequence under the rules from before identities loses batch B: the
    check that catches it is the one the random search runs."""
    world = World(["n0", "n1", "n2"], TIMING, [1.0] * 3, amnesia_guard=False)
    with pytest.raises(InvariantViolation, match="lacks committed chunk"):
        lost_disk_sequence(world)
