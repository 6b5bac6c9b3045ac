"""Single active consumer groups (``cluster/consumer_groups.py``): the rules by example,
and random subscribe / unsubscribe / disconnect / step-down-answer sequences.

The stateful test plays the connections too, as the server does: a consumer told
"active" starts delivering once it answered (here: at once, or later), one told
"inactive" stops at once; it checks that no two consumers of a group ever deliver, that
the state never holds two actives, and that a group whose active consumer left has a new
one (plain groups at once; super-stream groups once the former active one answered).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tierlog.cluster.consumer_groups import ConsumerGroups, GroupKey, Notify

PLAIN = GroupKey("/", "s", "app")


def test_first_is_active_others_wait_next_takes_over() -> None:
    groups = ConsumerGroups()
    assert groups.register(PLAIN, "a", 1) == (True, [Notify("a", 1, PLAIN, True)])
    assert groups.register(PLAIN, "b", 1) == (False, [])
    assert groups.register(PLAIN, "c", 7) == (False, [])
    assert groups.unregister(PLAIN, "b", 1) == []  # a waiting one leaves: nothing changes
    assert groups.active_consumers(PLAIN) == [("a", 1)]
    assert groups.owner_down("a") == [Notify("c", 7, PLAIN, True)]
    assert groups.unregister(PLAIN, "c", 7) == []
    assert groups.groups() == []  # an empty group is dropped


def test_groups_are_per_vhost_stream_and_name() -> None:
    groups = ConsumerGroups()
    keys = [
        PLAIN,
        GroupKey("/", "s", "other"),
        GroupKey("/", "t", "app"),
        GroupKey("v", "s", "app"),
    ]
    for key in keys:
        assert groups.register(key, "a", len(key.name))[0]


def test_super_stream_partitions_spread_and_rebalance_through_step_down() -> None:
    groups = ConsumerGroups()
    parts = [GroupKey("/", f"inv-{i}", "app") for i in range(3)]
    for i, key in enumerate(parts):
        assert groups.register(key, "a", i, partition_index=i)[0]
    # b joins every partition: partition 1 (1 % 2) moves to b, through a's step-down
    effects = [
        groups.register(key, "b", 10 + i, partition_index=i)[1] for i, key in enumerate(parts)
    ]
    assert effects == [[], [Notify("a", 1, parts[1], False, stepping_down=True)], []]
    assert groups.active_consumers(parts[1]) == []  # nobody delivers until a answered
    assert groups.stepped_down(parts[1], "a", 1) == [Notify("b", 11, parts[1], True)]
    assert groups.stepped_down(parts[1], "a", 1) == []  # a stale answer does nothing
    # b's connection dies: partition 1 back to a at once (nobody to wait for)
    assert groups.owner_down("b") == [Notify("a", 1, parts[1], True)]


def test_a_stepping_down_consumer_that_leaves_counts_as_answered() -> None:
    groups = ConsumerGroups()
    key = GroupKey("/", "inv-1", "app")
    groups.register(key, "a", 1, partition_index=1)
    assert groups.register(key, "b", 2, partition_index=1)[1] == [
        Notify("a", 1, key, False, stepping_down=True)
    ]
    assert groups.owner_down("a") == [Notify("b", 2, key, True)]


class GroupsMachine(RuleBasedStateMachine):
    """Three groups (one plain, two partitions of a super stream) and four connections
    with up to two subscriptions each."""

    KEYS = (PLAIN, GroupKey("/", "p-0", "app"), GroupKey("/", "p-1", "app"))
    INDEX = {PLAIN: -1, KEYS[1]: 0, KEYS[2]: 1}

    def __init__(self) -> None:
        super().__init__()
        self.groups = ConsumerGroups()
        self.members: dict[tuple[str, int], GroupKey] = {}  # (owner, sub) → its group
        self.delivering: set[tuple[str, int]] = set()  # answered "active", not yet told off
        self.unanswered: list[Notify] = []  # ConsumerUpdates the clients did not answer yet
        self.lost_active = False  # the plain group's active consumer just left

    def _apply(self, effects: list[Notify]) -> None:
        for effect in effects:
            member = (str(effect.owner), effect.subscription_id)
            assert self.members.get(member) == effect.group
            if not effect.active:
                self.delivering.discard(member)  # the server stops it before asking
            self.unanswered.append(effect)

    def _leave(self, member: tuple[str, int]) -> None:
        self.members.pop(member)
        self.delivering.discard(member)
        self.unanswered = [n for n in self.unanswered if (n.owner, n.subscription_id) != member]

    @rule(
        owner=st.sampled_from("abcd"),
        sub=st.integers(0, 1),
        key=st.sampled_from(KEYS),
    )
    def subscribe(self, owner: str, sub: int, key: GroupKey) -> None:
        if (owner, sub) in self.members:
            return
        self.members[(owner, sub)] = key
        active, effects = self.groups.register(key, owner, sub, self.INDEX[key])
        assert active == self.groups.is_active(key, owner, sub)
        self._apply(effects)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(sorted(self.members)))
        key = self.members[member]
        was_active = self.groups.is_active(key, *member)
        self._leave(member)
        effects = self.groups.unregister(key, *member)
        self._apply(effects)
        if key == PLAIN and was_active and self.groups.consumers(PLAIN):
            # a waiting consumer is activated at once
            assert [(n.owner, n.active) for n in effects][:1] != []
            assert effects[0].active

    @precondition(lambda self: self.members)
    @rule(owner=st.sampled_from("abcd"))
    def disconnect(self, owner: str) -> None:
        for member in [m for m in self.members if m[0] == owner]:
            self._leave(member)
        self._apply(self.groups.owner_down(owner))

    @precondition(lambda self: self.unanswered)
    @rule(data=st.data())
    def client_answers(self, data: st.DataObject) -> None:
        notify = data.draw(st.sampled_from(self.unanswered))
        self.unanswered.remove(notify)
        member = (str(notify.owner), notify.subscription_id)
        if notify.active:
            if self.groups.is_active(notify.group, *member):
                self.delivering.add(member)  # starts at the answer's offset
        elif notify.stepping_down:
            self._apply(self.groups.stepped_down(notify.group, *member))

    @invariant()
    def never_two_active(self) -> None:
        for key in self.KEYS:
            assert len(self.groups.active_consumers(key)) <= 1
            delivering = [m for m in self.delivering if self.members[m] == key]
            assert len(delivering) <= 1, (key, delivering)

    @invariant()
    def someone_is_active_unless_a_step_down_is_awaited(self) -> None:
        for key in self.KEYS:
            if self.groups.consumers(key) and not self.groups.waiting_for_step_down(key):
                assert len(self.groups.active_consumers(key)) == 1
            if self.groups.waiting_for_step_down(key):
                # the awaited answer is still to come: never a group stuck for ever
                assert any(n.group == key and n.stepping_down for n in self.unanswered)

    @invariant()
    def owner_index_matches(self) -> None:
        owned = {
            o: {k for k in self.KEYS if any(c[0] == o for c in self.groups.consumers(k))}
            for o in "abcd"
        }
        assert {o: ks for o, ks in owned.items() if ks} == {
            str(o): ks for o, ks in self.groups._owned.items()
        }

    @invariant()
    def state_matches_members(self) -> None:
        for key in self.KEYS:
            held = {(str(o), s) for o, s, _ in self.groups.consumers(key)}
            assert held == {m for m, k in self.members.items() if k == key}


GroupsMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
test_groups_machine = GroupsMachine.TestCase
