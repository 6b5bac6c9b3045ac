"""Single active consumer: the pure state of consumer groups (no I/O, no server imports).

A group is every single-active-consumer subscription of one (vhost, stream, consumer name).
The rules are RabbitMQ's (``rabbit_stream_sac_coordinator`` in rabbitmq-server):

- **Plain group** (``partition_index == -1``): the first consumer is active, later ones
  wait in arrival order. When the active one leaves (Unsubscribe, its connection died),
  the first waiting one is activated at once.
- **Super-stream partition** (``partition_index >= 0``, the ``super-stream`` Subscribe
  property): the active consumer is ``consumers[partition_index % len(consumers)]``, so
  the partitions of a super stream spread over the group's consumers (every partition has
  its own group, the same consumers subscribe to each). When a consumer comes or goes and
  that choice changes, the current active one is told to step down first; the chosen one
  is activated only once the former one answered its ConsumerUpdate (``stepped_down``), so
  the two never deliver at the same time. A former active consumer that leaves instead
  of answering counts as an answer.

The owner of a consumer (its connection) is opaque here: anything hashable. Effects are
returned as ``Notify`` records for the caller to carry out (send ConsumerUpdate). The
invariant every operation keeps: at most one consumer of a group is active, and one is
active whenever the group is not waiting for a former active consumer to step down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_PARTITION = -1
"""``partition_index`` of a group that is not a super-stream partition."""


@dataclass(frozen=True, slots=True)
class GroupKey:
    vhost: str
    stream: str
    name: str


@dataclass(frozen=True, slots=True)
class Notify:
    """Tell a consumer it is now active (``active``) or no longer active.

    ``stepping_down``: the consumer loses its turn to another one of a super-stream
    group; the group waits for its answer (``ConsumerGroups.stepped_down``)."""

    owner: object
    subscription_id: int
    group: GroupKey
    active: bool
    stepping_down: bool = False


@dataclass(slots=True)
class _Consumer:
    owner: object
    subscription_id: int
    active: bool = False


@dataclass(slots=True)
class _Group:
    partition_index: int
    consumers: list[_Consumer] = field(default_factory=list)
    stepping_down: tuple[object, int] | None = None
    """The former active consumer whose step-down answer the group waits for."""

    def find(self, owner: object, subscription_id: int) -> _Consumer | None:
        for consumer in self.consumers:
            if consumer.owner == owner and consumer.subscription_id == subscription_id:
                return consumer
        return None

    def active(self) -> _Consumer | None:
        for consumer in self.consumers:
            if consumer.active:
                return consumer
        return None

    def chosen(self) -> _Consumer:
        """The consumer that should be active (the group is not empty)."""
        if self.partition_index < 0:
            return self.consumers[0]
        return self.consumers[self.partition_index % len(self.consumers)]


class ConsumerGroups:
    """Every single-active-consumer group of one coordinator (a node, or a stream's
    leader). Each method returns the notifications to send, in order."""

    def __init__(self) -> None:
        self._groups: dict[GroupKey, _Group] = {}
        self._owned: dict[object, set[GroupKey]] = {}  # owner → groups it has consumers in

    def register(
        self,
        key: GroupKey,
        owner: object,
        subscription_id: int,
        partition_index: int = NO_PARTITION,
    ) -> tuple[bool, list[Notify]]:
        """Add a consumer; returns whether it is active at once, and the notifications
        (the active newcomer's own included). A group keeps the partition index it was
        created with, as RabbitMQ does."""
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(partition_index)
        if group.find(owner, subscription_id) is not None:
            raise ValueError(f"consumer {subscription_id} of {owner!r} already in {key}")
        consumer = _Consumer(owner, subscription_id)
        group.consumers.append(consumer)
        self._owned.setdefault(owner, set()).add(key)
        effects = self._settle(key, group)
        return consumer.active, effects

    def unregister(self, key: GroupKey, owner: object, subscription_id: int) -> list[Notify]:
        """Remove a consumer (Unsubscribe, stream gone); unknown ones are ignored."""
        group = self._groups.get(key)
        if group is None:
            return []
        consumer = group.find(owner, subscription_id)
        if consumer is None:
            return []
        group.consumers.remove(consumer)
        if not any(c.owner == owner for c in group.consumers):
            self._disown(owner, key)
        if group.stepping_down == (owner, subscription_id):
            group.stepping_down = None  # gone instead of answering: as good as an answer
        return self._settle(key, group)

    def owner_down(self, owner: object) -> list[Notify]:
        """Remove every consumer of a connection that ended."""
        effects: list[Notify] = []
        for key in sorted(self._owned.pop(owner, ()), key=lambda k: (k.vhost, k.stream, k.name)):
            group = self._groups[key]
            group.consumers = [c for c in group.consumers if c.owner != owner]
            if group.stepping_down is not None and group.stepping_down[0] == owner:
                group.stepping_down = None
            effects.extend(self._settle(key, group))
        return effects

    def stepped_down(self, key: GroupKey, owner: object, subscription_id: int) -> list[Notify]:
        """The former active consumer answered its step-down ConsumerUpdate: the chosen
        consumer is activated. A stale answer (the group moved on) does nothing."""
        group = self._groups.get(key)
        if group is None or group.stepping_down != (owner, subscription_id):
            return []
        group.stepping_down = None
        return self._settle(key, group)

    def _disown(self, owner: object, key: GroupKey) -> None:
        keys = self._owned.get(owner)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._owned[owner]

    def _settle(self, key: GroupKey, group: _Group) -> list[Notify]:
        """Bring the group to its rule: drop it when empty; else make the chosen consumer
        active, directly when none is active, through a step-down when another one is."""
        if not group.consumers:
            del self._groups[key]
            return []
        if group.stepping_down is not None:
            return []  # the chosen one is activated once the former one answered
        chosen = group.chosen()
        current = group.active()
        if current is chosen:
            return []
        if current is None:
            chosen.active = True
            return [Notify(chosen.owner, chosen.subscription_id, key, True)]
        current.active = False
        group.stepping_down = (current.owner, current.subscription_id)
        return [Notify(current.owner, current.subscription_id, key, False, stepping_down=True)]

    # ----------------------------------------------------------------- queries

    def is_active(self, key: GroupKey, owner: object, subscription_id: int) -> bool:
        group = self._groups.get(key)
        consumer = group.find(owner, subscription_id) if group is not None else None
        return consumer is not None and consumer.active

    def active_consumers(self, key: GroupKey) -> list[tuple[object, int]]:
        """(owner, subscription id) of the group's active consumers: never more than one."""
        group = self._groups.get(key)
        if group is None:
            return []
        return [(c.owner, c.subscription_id) for c in group.consumers if c.active]

    def consumers(self, key: GroupKey) -> list[tuple[object, int, bool]]:
        """(owner, subscription id, active) of every consumer, in arrival order."""
        group = self._groups.get(key)
        if group is None:
            return []
        return [(c.owner, c.subscription_id, c.active) for c in group.consumers]

    def waiting_for_step_down(self, key: GroupKey) -> bool:
        group = self._groups.get(key)
        return group is not None and group.stepping_down is not None

    def groups(self) -> list[GroupKey]:
        return list(self._groups)
