"""Member changes run by a stream's leader, and a node leaving the streams it held.

After every directory scan the node's cluster service calls ``after_scan``:

* **Leader side.** For every stream this node leads (its election over and a chunk of
  its epoch committed), ``member_plan.next_member_change`` decides the next step from
  the leader's own state (members, their written offsets, the commit offset), the live
  nodes and the retiring ones; the step is carried out here, one at a time per stream:
  a learner is added (a directory transaction fenced by the leader's epoch), the
  learner's node sees itself a member on its next scan and follows the leader from its
  first local segment, and ``LeaderState`` promotes it once it holds everything up to
  the commit offset (``promote``, the ``PromoteLearner`` effect); a member is removed;
  or a retiring leader hands the stream over (``Resign``: tiering finishes up to the
  commit offset, then the leadership is given up so another voter takes over).
* **Member side.** A node no longer a member of a stream it follows (removed) stops
  following it; the log stays on disk.
* **Retirement.** While this node is retiring it leads nothing (the service asks
  ``retiring_here`` before every take-over) and, once it is a member of no stream,
  releases its node lease and marks its retirement done.

Admin requests (``request_change``) add or remove one member of a stream on the node
that leads it; they set the stream's replication factor with the change, so the leader
keeps to it afterwards.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tierlog.cluster.errors import MembershipChangeError, NotLeaderError, StaleEpochError
from tierlog.cluster.log_history import NO_CHUNK
from tierlog.cluster.member_plan import (
    AddLearner,
    Demote,
    NodesSeen,
    RemoveMember,
    Resign,
    Step,
    StreamSeen,
    Wait,
    holds_commit,
    next_member_change,
)
from tierlog.cluster.membership import Leadership
from tierlog.cluster.node import DirectoryView, StreamLeader
from tierlog.cluster.retirement import Retirement, Retirements
from tierlog.cluster.state import MembersChanged, Phase, PromoteLearner
from tierlog.errors import TierlogError
from tierlog.logs import get_logger
from tierlog.server.cluster_gates import MemberEvents
from tierlog.server.delayed_intake import is_system_stream, parent_stream_name

if TYPE_CHECKING:
    from tierlog.server.cluster_service import ClusterService

log = get_logger("tierlog.server.cluster")

TIERING_FLUSH_SECONDS = 30.0
"""How long a retiring leader waits for the remote tier to hold its committed chunks
before it hands the stream over anyway (the next leader tiers the rest)."""


@dataclass(frozen=True, slots=True)
class ChangeResult:
    """The outcome of an admin member change on the leader."""

    members: tuple[str, ...]
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    replication_factor: int

    def to_json(self) -> dict[str, Any]:
        return {
            "members": list(self.members),
            "voters": list(self.voters),
            "learners": list(self.learners),
            "replication_factor": self.replication_factor,
        }


class MemberChanges:
    """The member changes of the streams one node leads, and its own retirement."""

    def __init__(self, service: ClusterService) -> None:
        self.service = service
        self.retirements = Retirements(service.directory.meta)
        self.retiring: frozenset[str] = frozenset()
        self.retirement: Retirement | None = None  # this node's, if it is retiring
        self.retired = False  # this node finished retiring and released its lease
        self.waiting: dict[str, str] = {}  # incarnation -> what its next change waits for
        self._busy: set[str] = set()  # incarnations with a change being carried out
        self.changes = 0
        self._refreshed_at: float | None = None
        self._refresh_lock = asyncio.Lock()

    @property
    def retiring_here(self) -> bool:
        """This node is retiring: it takes no stream over and opens none as leader."""
        return self.retirement is not None

    # -- every scan -------------------------------------------------------------------
    async def refresh(self, max_age: float = 0.0) -> None:
        """Read the retirement records: before any decision to lead (a scan's take-overs,
        opening a stream at start-up), so a retiring node never leads, even right after
        it restarted. ``max_age``: reuse a read at most that old (start-up opens many
        streams)."""
        async with self._refresh_lock:  # concurrent openings wait for one read
            started = time.monotonic()
            if self._refreshed_at is not None and started - self._refreshed_at <= max_age:
                return
            read = self.retirements.all
            retirements: dict[str, Retirement] = await self.service._directory(read)
            self.retiring = frozenset(retirements)
            self.retirement = retirements.get(self.service.name)
            if self.retirement is None:
                self.retired = False
            self._refreshed_at = started

    async def after_scan(self, view: DirectoryView) -> None:
        service = self.service
        await self._stop_following(view)
        nodes = NodesSeen(frozenset(view.nodes), self.retiring, member_counts(view))
        for incarnation in list(self.waiting):
            if incarnation not in service.node.leaders:
                del self.waiting[incarnation]
        for incarnation, leader in list(service.node.leaders.items()):
            place = view.streams.get(incarnation)
            if place is None or incarnation in self._busy:
                continue
            if place.record.version < leader.leadership.version:
                continue  # the scan read the record before our last change
            seen = self._seen(leader, place.record.target_voters, place.record.disks.lost)
            if seen is None:
                continue
            step = next_member_change(seen, replace(nodes, prefer=self._companions(leader, view)))
            if isinstance(step, AddLearner) and service.hub is None:
                step = Wait("adding a member needs replication between nodes (cluster.secret)")
            self._carry(leader, step)
        await self._finish_retirement(view)

    def _companions(self, leader: StreamLeader, view: DirectoryView) -> frozenset[str]:
        """For a delayed stream's system stream: the members of its stream, which spares
        are taken from first, so both keep the same members and can be led on one node
        (the scheduler needs both there)."""
        handle = self.service.handles.get(leader.incarnation)
        broker = self.service.broker
        if handle is None or broker is None or not is_system_stream(handle.name):
            return frozenset()
        parent = parent_stream_name(broker, handle.vhost, handle.name)
        if parent is None:
            return frozenset()
        parent_handle = broker.get(handle.vhost, parent)
        opening = broker.opening(handle.vhost, parent)
        record = parent_handle.record if parent_handle is not None else None
        if record is None and opening is not None:
            record = opening.record
        place = view.streams.get(record.incarnation) if record is not None else None
        return frozenset(place.record.membership.members) if place is not None else frozenset()

    def _seen(
        self, leader: StreamLeader, replication_factor: int, lost: frozenset[str] = frozenset()
    ) -> StreamSeen | None:
        state = leader.state
        if leader.stepped_down or state.phase is not Phase.LEADING:
            return None
        if state.epoch_start is None or state.commit < state.epoch_start:
            return None  # the members' written offsets are not known in this epoch yet
        membership = state.membership
        return StreamSeen(
            self.service.name,
            membership,
            replication_factor,
            state.commit,
            {m: state.written(m) for m in membership.members},
            lost,
        )

    def _carry(self, leader: StreamLeader, step: Step | None) -> None:
        incarnation = leader.incarnation
        if step is None:
            self.waiting.pop(incarnation, None)
            return
        if isinstance(step, Wait):
            if self.waiting.get(incarnation) != step.reason:
                log.info(
                    "cluster_member_change_waiting", incarnation=incarnation, reason=step.reason
                )
            self.waiting[incarnation] = step.reason
            return
        self.waiting.pop(incarnation, None)
        self._busy.add(incarnation)
        task = self._run(leader, step)
        self.service._spawn(task)

    async def _run(self, leader: StreamLeader, step: Step) -> None:
        try:
            if isinstance(step, AddLearner):
                await self._change(leader, "add", step.node, step.reason)
            elif isinstance(step, RemoveMember):
                await self._change(leader, "remove", step.node, step.reason)
            elif isinstance(step, Demote):
                await self._change(leader, "demote", step.node, step.reason)
            elif isinstance(step, Resign):
                await self._hand_over(leader, step.reason)
        except (TierlogError, OSError) as exc:
            log.warning(
                "cluster_member_change_failed",
                incarnation=leader.incarnation,
                step=type(step).__name__,
                error=repr(exc),
            )
        finally:
            self._busy.discard(leader.incarnation)

    # -- the directory transactions ------------------------------------------------------
    async def _change(
        self,
        leader: StreamLeader,
        action: str,
        node: str,
        reason: str,
        replication_factor: int | None = None,
    ) -> Leadership:
        """Add a learner or remove a member in the directory (fenced by the leader's
        epoch), then tell the leader's state machine and the replication hub."""
        service = self.service
        directory = service.directory
        incarnation = leader.incarnation
        try:
            if action == "demote":
                leadership: Leadership = await service._directory(
                    directory.demote_voter, leader.leadership, node
                )
            else:
                fn = directory.add_learner if action == "add" else directory.remove_member
                leadership = await service._directory(
                    fn, leader.leadership, node, replication_factor
                )
        except StaleEpochError as exc:
            service._step_down(incarnation, f"deposed while changing members: {exc}")
            raise
        self.changes += 1
        log.info(
            "cluster_member_changed",
            incarnation=incarnation,
            action=action,
            member=node,
            reason=reason,
            voters=",".join(leadership.membership.voters),
            learners=",".join(leadership.membership.learners),
        )
        self._members_changed(leader, leadership)
        return leadership

    def _members_changed(self, leader: StreamLeader, leadership: Leadership) -> None:
        service = self.service
        incarnation = leader.incarnation
        if service.node.leaders.get(incarnation) is not leader:
            return  # stepped down meanwhile: the directory holds the change already
        leader.leadership = leadership
        hub = service.hub
        others = tuple(m for m in leadership.membership.members if m != service.name)
        if hub is not None and incarnation in hub.led:
            hub.led[incarnation].members = others
        elif hub is not None and others:
            # a stream that had no other member: serve the newcomer's fetches from now on
            handle = service.handles.get(incarnation)
            if handle is not None:
                hub.lead(
                    incarnation,
                    handle.log,
                    leader.epoch,
                    others,
                    MemberEvents(service, incarnation),
                    executor=handle.executor,
                )
                hub.serve(incarnation)
                if leader.committed != NO_CHUNK:
                    hub.set_commit(incarnation, leader.committed)
        service._feed(incarnation, MembersChanged(leadership.membership))

    async def promote(self, leader: StreamLeader, effect: PromoteLearner) -> None:
        """``PromoteLearner``: make a caught-up learner a voter in the directory, then
        tell the leader's state machine. A failed attempt hands the state machine its
        current membership back, so it tries again once the learner is heard from; a
        newer epoch means this leader is deposed."""
        service = self.service
        incarnation = leader.incarnation
        try:
            leadership = await service._directory(
                service.directory.promote_learner,
                leader.leadership,
                effect.member,
                effect.written,
                effect.commit,
            )
        except StaleEpochError as exc:
            service._step_down(incarnation, f"deposed while promoting {effect.member}: {exc}")
            return
        except (TierlogError, OSError) as exc:
            log.warning(
                "cluster_promotion_failed",
                incarnation=incarnation,
                member=effect.member,
                error=repr(exc),
            )
            service._feed(incarnation, MembersChanged(leader.leadership.membership))
            return
        log.info(
            "cluster_learner_promoted",
            incarnation=incarnation,
            member=effect.member,
            written=effect.written,
            commit=effect.commit,
        )
        self._members_changed(leader, leadership)

    async def _hand_over(self, leader: StreamLeader, reason: str) -> None:
        """A retiring leader: let the remote tier catch up with the commit offset, then
        step down and clear the leadership so another voter takes the stream over
        (publishes waiting for a confirm are refused; clients resend to the new leader)."""
        service = self.service
        incarnation = leader.incarnation
        handle = service.handles.get(incarnation)
        lifecycle = service.broker.lifecycle if service.broker is not None else None
        tierer_of = getattr(lifecycle, "tierer_of", None)
        tierer = tierer_of(handle.record) if handle is not None and tierer_of else None
        commit = leader.committed
        tiered = True
        if tierer is not None and commit != NO_CHUNK:
            started = time.monotonic()
            tiered = await asyncio.get_running_loop().run_in_executor(
                None, tierer.wait_durable, commit + 1, TIERING_FLUSH_SECONDS
            )
            log.info(
                "cluster_retiring_tiered",
                incarnation=incarnation,
                commit=commit,
                tiered=tiered,
                seconds=round(time.monotonic() - started, 3),
            )
        if service.node.leaders.get(incarnation) is not leader or leader.stepped_down:
            return
        log.info("cluster_stream_handed_over", incarnation=incarnation, reason=reason)
        service._step_down(incarnation, f"handed over: {reason}")

    # -- admin requests -----------------------------------------------------------------
    async def request_change(self, incarnation: str, action: str, node: str) -> ChangeResult:
        """An operator's member change, on the leader: ``add`` a node (it joins as a
        learner; the replication factor grows by one) or ``remove`` a member (a voter:
        the factor shrinks by one; a learner: the change it was part of is abandoned).
        ``NotLeaderError`` when this node does not lead the stream;
        ``MembershipChangeError`` when the change breaks a rule."""
        service = self.service
        leader = service.node.leaders.get(incarnation)
        if leader is None or leader.stepped_down or leader.state.phase is not Phase.LEADING:
            raise NotLeaderError(f"{service.name} does not lead {incarnation}")
        if incarnation in self._busy:
            raise MembershipChangeError("a member change of this stream is being carried out")
        record = await service._directory(service.directory.require_stream, incarnation)
        membership = leader.state.membership
        factor = record.target_voters
        if action == "add":
            if service.hub is None:
                raise MembershipChangeError("adding members needs replication: cluster.secret")
            if node not in service.view.nodes:
                raise MembershipChangeError(f"node {node!r} is not live")
            if node in self.retiring:
                raise MembershipChangeError(f"node {node!r} is retiring")
            factor = max(factor, len(membership.voters) + 1)
        elif action == "remove":
            if node in membership.voters:
                staying = tuple(v for v in membership.voters if v != node)
                seen = self._seen(leader, factor, record.disks.lost)
                if seen is None or not holds_commit(seen, staying):
                    raise MembershipChangeError(
                        f"the voters staying after {node!r} leaves do not hold the commit"
                        " offset on a majority yet; try again"
                    )
                factor = max(1, factor - 1)
            else:
                factor = min(factor, len(membership.voters))
        else:
            raise MembershipChangeError(f"unknown member change {action!r}")
        self._busy.add(incarnation)
        try:
            leadership = await self._change(
                leader, action, node, "requested by an operator", factor
            )
        finally:
            self._busy.discard(incarnation)
        m = leadership.membership
        return ChangeResult(m.members, m.voters, m.learners, factor)

    # -- this node leaving ----------------------------------------------------------------
    async def _stop_following(self, view: DirectoryView) -> None:
        """Stop following streams this node is no longer a member of (removed)."""
        followers = self.service.followers
        if followers is None:
            return
        for incarnation in list(followers.streams):
            place = view.streams.get(incarnation)
            if place is None:
                continue  # deleted: the deletion path closes it
            if self.service.name not in place.record.membership.members:
                await followers.stop(incarnation)
                log.info("cluster_stream_unfollowed", incarnation=incarnation, reason="removed")

    def holds(self, view: DirectoryView) -> list[str]:
        """The streams this node is still a member of (or leads here)."""
        name = self.service.name
        held = {i for i, p in view.streams.items() if name in p.record.membership.members}
        return sorted(held | set(self.service.node.leaders))

    async def _finish_retirement(self, view: DirectoryView) -> None:
        """A retiring node that holds no stream member any more releases its node lease
        (it is then no live node for anyone) and marks its retirement done."""
        service = self.service
        if self.retirement is None or self.retired or self.holds(view):
            return
        lease = service.lease
        if lease is not None and lease.held:
            await asyncio.get_running_loop().run_in_executor(service._lease_thread, lease.release)
        self.retired = True
        service.registered.clear()
        await service._directory(self.retirements.mark_retired, service.name)
        log.info("cluster_node_retired", node=service.name)

    def status(self) -> dict[str, Any]:
        return {
            "retiring": self.retiring_here,
            "retired": self.retired,
            "member_changes": self.changes,
            "changes_waiting": dict(sorted(self.waiting.items())),
        }


def member_counts(view: DirectoryView) -> dict[str, int]:
    """How many stream members each node holds (voters and learners)."""
    counts: dict[str, int] = {}
    for place in view.streams.values():
        for member in place.record.membership.members:
            counts[member] = counts.get(member, 0) + 1
    return counts
