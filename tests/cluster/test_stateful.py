"""Random interleavings of appends, acks, crashes, restarts, pauses, clock jumps,
partitions, lease expiry, member changes and lost disks against the pure replication machines,
with 3 and 5 simulated nodes (see ``tests/cluster/world.py`` for the invariants).

One rule draws an action by weight: progress (acquire, deliver, sync, renew, append,
settle) is drawn more often than faults so runs get past elections and commit in
several epochs, which is where the interesting interleavings are.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.cluster.world import World
from tierlog.cluster.state import LeaseTiming

TTL = 10.0
DRIFT = 1.5  # > clock-rate error (10 %) x TTL
RATES = [1.0, 0.9, 1.1, 0.95, 1.05]

WEIGHTED_ACTIONS = (
    ["settle"] * 4
    + ["append"] * 4
    + ["deliver"] * 4
    + ["sync"] * 4
    + ["acquire"] * 2
    + ["renew"] * 2
    + ["tick"] * 3
    + ["catch_up", "drop", "crash", "restart", "pause", "resume", "cut", "cut_meta", "heal"]
    + ["add_member", "remove_member"]
)
WITH_DISK_LOSS = (*WEIGHTED_ACTIONS, "lose_disk")
TICKS = [0.05, 0.5, 2.0, 4.0, 7.0, 11.0]


def make_machine(
    size: int, disk_loss: bool = False, amnesia_guard: bool = True
) -> type[RuleBasedStateMachine]:
    """The search over ``size`` nodes; ``disk_loss``: nodes also lose their disk (a
    machine of its own, so the other searches keep their pace through elections);
    ``amnesia_guard=False`` runs the rules from before member disk identities (a
    member votes whatever its disk holds)."""
    names = [f"n{i}" for i in range(size)]
    node = st.sampled_from(names)
    actions = WITH_DISK_LOSS if disk_loss else WEIGHTED_ACTIONS

    class ClusterMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.world = World(
                names, LeaseTiming(TTL, DRIFT), RATES[:size], amnesia_guard=amnesia_guard
            )

        @rule(action=st.sampled_from(actions), a=node, b=node, n=st.integers(0, 50))
        def act(self, action: str, a: str, b: str, n: int) -> None:
            w = self.world
            if action == "settle":
                w.settle()
            elif action == "append":
                for _ in range(1 + n % 3):
                    w.append(a)
            elif action == "deliver":
                w.deliver(n)
            elif action == "drop":
                w.deliver(n, drop=True)
            elif action == "sync":
                w.sync(a, b, 1 + n % 4)
            elif action == "acquire":
                w.acquire(a)
            elif action == "renew":
                w.renew(a)
            elif action == "tick":
                w.tick(TICKS[n % len(TICKS)])
            elif action == "catch_up":
                w.catch_up(a)
            elif action == "crash":
                w.crash(a)
            elif action == "restart":
                w.restart(a)
            elif action == "pause":
                w.pause(a)
            elif action == "resume":
                w.resume(a)
            elif action == "cut":
                w.cut(a, b)
            elif action == "cut_meta":
                w.meta_cut.add(a)
            elif action == "heal":
                w.heal()
            elif action == "add_member":
                w.change_members(a, b, add=True)
            elif action == "remove_member":
                w.change_members(a, b, add=False)
            elif action == "lose_disk" and n % 2 == 0:
                w.lose_disk(a)  # rarer than a crash: two lost of three voters end the run

        @invariant()
        def always(self) -> None:
            self.world.check_always()

    ClusterMachine.__name__ = f"Cluster{size}{'Disks' if disk_loss else ''}Machine"
    return ClusterMachine


Cluster3 = make_machine(3)
Cluster5 = make_machine(5)
Cluster3Disks = make_machine(3, disk_loss=True)

TestCluster3 = Cluster3.TestCase
TestCluster5 = Cluster5.TestCase
TestCluster3Disks = Cluster3Disks.TestCase
TestCluster3.settings = settings(settings.default, stateful_step_count=80)
TestCluster5.settings = settings(settings.default, stateful_step_count=80)
TestCluster3Disks.settings = settings(settings.default, stateful_step_count=80)
