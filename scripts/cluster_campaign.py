"""Long runs of the cluster property test, and proof that it can fail.

``campaign``: runs the 3- and 5-node simulations, and the 3-node one where nodes also
lose their disk, for many examples and prints how much they exercised (confirms,
elections, runs that committed in two or more epochs, lost disks and demotions).

``mutations``: breaks one replication rule at a time (by patching the pure machines)
and reruns the simulation; each mutation must be caught (an invariant violation). A
mutation that survives means the test lost its teeth.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python scripts/cluster_campaign.py campaign --examples 2000
    PYTHONPATH=src .venv/bin/python scripts/cluster_campaign.py mutations --examples 2000
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tests.cluster.test_stateful as stateful
from hypothesis import Phase, settings
from hypothesis.stateful import RuleBasedStateMachine
from tests.cluster.world import InvariantViolation

from tierlog.cluster import log_history
from tierlog.cluster import state as cs
from tierlog.cluster.disk_identity import Standing
from tierlog.cluster.log_history import NO_CHUNK, tail_of
from tierlog.cluster.members import quorum_value

MACHINES: dict[str, type[RuleBasedStateMachine]] = {
    "3": stateful.Cluster3,
    "5": stateful.Cluster5,
    "3+disk-loss": stateful.Cluster3Disks,
}


def run(
    size: str, examples: int, steps: int, stats: collections.Counter[str], shrink: bool = True
) -> None:
    machine = MACHINES[size]
    original = machine.teardown

    def teardown(self: Any) -> None:
        world = self.world
        stats[f"runs{size}"] += 1
        stats[f"confirms{size}"] += world.confirms
        stats[f"elections{size}"] += world.elections
        if world.disk_losses:
            stats[f"disk_losses{size}"] += world.disk_losses
            stats[f"demotions{size}"] += world.demotions
        stats[f"multi_epoch_commit_runs{size}"] += (
            len({by for _, by in world.committed.values()}) >= 2
        )
        original(self)

    machine.teardown = teardown  # type: ignore[method-assign]
    try:
        case = machine.TestCase
        case.settings = settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            phases=list(Phase) if shrink else [Phase.generate],
        )
        case().runTest()
    finally:
        machine.teardown = original  # type: ignore[method-assign]


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _count_any_epoch_acks(self: cs.LeaderState, event: Any, now: float) -> list[cs.Effect]:
    if isinstance(event, cs.MemberAcked):  # count acks sent while following older epochs
        event = cs.MemberAcked(event.member, self.epoch, event.written)
    return ORIGINAL_HANDLE(self, event, now)


def _commit_old_copies(self: cs.LeaderState) -> int:
    if self.epoch_start is None:
        return NO_CHUNK
    return quorum_value(self._written, self.membership.voters, NO_CHUNK)


def _no_drift(self: cs.LeaderState) -> float:
    return self._renewed_at + self.timing.ttl


def _keep_whole_log(local: Any, leader: Any) -> int:
    return tail_of(local).chunk_id


def _best_by_offset(self: cs.LeaderState, effects: list[cs.Effect]) -> None:
    voters = [m for m in self._adopted if self.membership.is_voter(m)]
    if len(voters) < cs.majority(len(self.membership.voters)):
        return
    best_member = max(voters, key=lambda m: self._adopted[m].chunk_id)
    best = self._adopted[best_member]
    self._best = (best_member, best)
    if best.chunk_id > self.own_tail.chunk_id:
        self.phase = cs.Phase.CATCHING_UP
        effects.append(cs.CatchUp(best_member, best))
    else:
        self._lead(effects)


def _elect_without_majority(self: cs.LeaderState, effects: list[cs.Effect]) -> None:
    self._best = (self.node, self.own_tail)
    self._lead(effects)


def _accept_old_epochs(self: cs.MemberEpoch, epoch: int) -> bool:
    self.highest = max(self.highest, epoch)
    return True


ORIGINAL_HANDLE = cs.LeaderState.handle


def _every_disk_trusted(*_args: Any) -> Standing:
    return Standing.TRUSTED


def _votes_with_a_lost_disk() -> contextlib.AbstractContextManager[None]:
    """The decision from before member disk identities: every member votes, whatever
    its directory holds (the simulator imports ``standing`` by name)."""
    import tests.cluster.world as world_module

    return patched(world_module, "standing", _every_disk_trusted)


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "count acks of older epochs": lambda: patched(cs.LeaderState, "handle", _count_any_epoch_acks),
    "commit by counting old-epoch copies": lambda: patched(
        cs.LeaderState, "candidate_commit", _commit_old_copies
    ),
    "no drift margin on the lease": lambda: patched(cs.LeaderState, "confirm_deadline", _no_drift),
    "no truncation of divergent suffix": lambda: patched(
        log_history, "common_prefix_end", _keep_whole_log
    ),
    "most up-to-date by offset only": lambda: patched(
        cs.LeaderState, "_maybe_elected", _best_by_offset
    ),
    "lead without a majority": lambda: patched(
        cs.LeaderState, "_maybe_elected", _elect_without_majority
    ),
    "members accept older epochs": lambda: patched(cs.MemberEpoch, "check", _accept_old_epochs),
    "members vote with a lost disk": _votes_with_a_lost_disk,
}


def campaign(examples: int, steps: int) -> None:
    stats: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    for size in MACHINES:
        run(size, examples, steps, stats)
    print(dict(stats), f"elapsed_s={time.monotonic() - started:.1f}")


def run_scenarios() -> str | None:
    """The scripted interleavings of ``tests/cluster/test_scenarios.py``; the first
    failure, if any."""
    import tests.cluster.test_scenarios as scenarios

    for name in sorted(dir(scenarios)):
        if name.startswith("test_"):
            try:
                getattr(scenarios, name)()
            except AssertionError as exc:
                return f"scenario {name}: {(str(exc) or repr(exc)).splitlines()[0][:100]}"
    return None


def mutations(examples: int, steps: int) -> int:
    survivors = 0
    for label, make in MUTATIONS.items():
        caught = None
        started = time.monotonic()
        with make():
            # The simulator imports common_prefix_end by name: patch its copy too.
            import tests.cluster.world as world_module

            with patched(world_module, "common_prefix_end", log_history.common_prefix_end):
                for size in MACHINES:
                    try:
                        run(size, examples, steps, collections.Counter(), shrink=False)
                    except (InvariantViolation, AssertionError) as exc:
                        caught = f"N={size}: {(str(exc) or repr(exc)).splitlines()[0][:110]}"
                        break
            if caught is None:
                caught = run_scenarios()
        verdict = "CAUGHT" if caught else "SURVIVED"
        survivors += caught is None
        print(f"{verdict:8} {label} ({time.monotonic() - started:.1f}s) {caught or ''}", flush=True)
    return survivors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["campaign", "mutations"])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    if args.mode == "campaign":
        campaign(args.examples, args.steps)
        return 0
    return 1 if mutations(args.examples, args.steps) else 0


if __name__ == "__main__":
    sys.exit(main())
