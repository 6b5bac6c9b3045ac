"""Single active consumer on one node: the I/O shell around ``cluster.consumer_groups``.

``SacCoordinator`` (one per broker) feeds the pure group state with what connections do
(Subscribe, Unsubscribe, a connection that ended, a step-down answered) and carries out
its notifications through the ``SacMember`` port each connection provides: the
connection sends the ConsumerUpdate request and stops or starts delivering. The
connection side (``handlers/sac.py``) tracks its ConsumerUpdate requests in
``UpdateRequests`` and closes a client that leaves one unanswered past
``[limits] request_timeout_seconds``, as RabbitMQ does (``request_timeout``, 60 s).

Effects are carried out synchronously, in order, on the event loop: a deactivation is
applied before the activation that follows it, and a caller sends its own response
(Subscribe OK) before registering, so ConsumerUpdate never precedes it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from tierlog.cluster.consumer_groups import NO_PARTITION, ConsumerGroups, GroupKey, Notify


class SacMember(Protocol):
    """What the coordinator needs of a connection (the connection provides it)."""

    def consumer_update(self, subscription_id: int, active: bool, stepping_down: bool) -> None:
        """Tell the client (ConsumerUpdate) that its subscription is now active or no
        longer; an inactive one stops delivering at once, an active one starts at the
        offset the client answers."""
        ...


class PartitionLookup(Protocol):
    """Where a stream sits in a super stream (the super-stream catalog provides it)."""

    def __call__(self, vhost: str, super_stream: str, stream: str) -> int | None:
        """The partition index of ``stream`` in ``super_stream``, None when it is none of
        its partitions (or the super stream does not exist)."""
        ...


class SacCoordinator:
    """Every single-active-consumer group of this node.

    ``partitions`` places a subscription with the ``super-stream`` property in its
    super stream; without it (or for a stream that is no partition of that super stream)
    the group is a plain one, as RabbitMQ's is for an unknown super stream (index -1)."""

    def __init__(self, partitions: PartitionLookup | None = None) -> None:
        self.groups = ConsumerGroups()
        self.partitions = partitions

    def partition_index(self, vhost: str, super_stream: str, stream: str) -> int:
        if self.partitions is None:
            return NO_PARTITION
        index = self.partitions(vhost, super_stream, stream)
        return NO_PARTITION if index is None else index

    def register(
        self,
        key: GroupKey,
        member: SacMember,
        subscription_id: int,
        partition_index: int = NO_PARTITION,
    ) -> bool:
        active, effects = self.groups.register(key, member, subscription_id, partition_index)
        self._carry_out(effects)
        return active

    def unregister(self, key: GroupKey, member: SacMember, subscription_id: int) -> None:
        self._carry_out(self.groups.unregister(key, member, subscription_id))

    def member_down(self, member: SacMember) -> None:
        self._carry_out(self.groups.owner_down(member))

    def stepped_down(self, key: GroupKey, member: SacMember, subscription_id: int) -> None:
        self._carry_out(self.groups.stepped_down(key, member, subscription_id))

    def is_active(self, key: GroupKey, member: SacMember, subscription_id: int) -> bool:
        return self.groups.is_active(key, member, subscription_id)

    @staticmethod
    def _carry_out(effects: list[Notify]) -> None:
        for effect in effects:
            member: SacMember = effect.owner  # type: ignore[assignment]
            member.consumer_update(effect.subscription_id, effect.active, effect.stepping_down)


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """A ConsumerUpdate this connection sent and the client has not answered yet."""

    subscription_id: int
    group: GroupKey
    active: bool
    stepping_down: bool


class UpdateRequests:
    """The ConsumerUpdate requests of one connection, by correlation id (the server's own
    sequence: a client's correlation ids live in the other direction)."""

    def __init__(self) -> None:
        self._next = 0
        self.pending: dict[int, UpdateRequest] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def open(self, request: UpdateRequest) -> int:
        self._next = (self._next + 1) & 0xFFFFFFFF
        self.pending[self._next] = request
        return self._next

    def arm(self, correlation_id: int, timer: asyncio.TimerHandle) -> None:
        """The deadline of the answer (cancelled when it comes)."""
        self._timers[correlation_id] = timer

    def take(self, correlation_id: int) -> UpdateRequest | None:
        timer = self._timers.pop(correlation_id, None)
        if timer is not None:
            timer.cancel()
        return self.pending.pop(correlation_id, None)

    def forget(self, subscription_id: int) -> None:
        """The subscription ended: an answer for it changes nothing any more."""
        for corr in [c for c, r in self.pending.items() if r.subscription_id == subscription_id]:
            self.take(corr)

    def close(self) -> None:
        for corr in list(self.pending):
            self.take(corr)
