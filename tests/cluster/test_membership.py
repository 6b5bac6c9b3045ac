"""Cluster coordination on every MetaStore backend (SQLite and a real etcd): node
registration on one lease per node, stream member records, the leadership-acquisition
transaction (membership check + epoch bump), leaders attached to node leases, member
changes by the current leader only."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.support import waiting
from tierlog.cluster.disk_identity import DiskSeen, Standing
from tierlog.cluster.errors import (
    LeaderAliveError,
    MembershipChangeError,
    NotAMemberError,
    StaleEpochError,
    StreamUnavailableError,
)
from tierlog.cluster.membership import ClusterDirectory, DiskClaim, Leadership, NodeInfo
from tierlog.remote.catalog import pointer_key
from tierlog.storage.errors import LeaseHeldError, LeaseLostError, VersionConflictError
from tierlog.storage.meta_store import Lease, MetaStore, open_meta_store

TTL = 30.0
SHORT_TTL = 1.0  # etcd's minimum with the test server's raft timings
WAIT_LIMIT_S = 20.0
STREAM = "%2F_orders_1700000000000000000"


def info(name: str) -> NodeInfo:
    return NodeInfo(name, f"{name}:5552", f"{name}:15672", f"{name}:5553")


def register(directory: ClusterDirectory, name: str, ttl: float = TTL) -> Lease:
    return directory.register_node(info(name), ttl)[1]


def wait_until(predicate: Callable[[], bool]) -> None:
    waiting.wait_until(predicate, WAIT_LIMIT_S)


def test_nodes_register_on_one_lease_each(meta_store: MetaStore) -> None:
    directory = ClusterDirectory(meta_store)
    published, lease = directory.register_node(info("a"), TTL)
    register(directory, "b")
    assert published.lease_epoch == lease.epoch
    assert directory.node("a") == published
    assert [n.name for n in directory.live_nodes()] == ["a", "b"]
    with pytest.raises(LeaseHeldError):
        directory.register_node(info("a"), TTL)  # a second process with the same name
    directory.release_node(lease)
    assert [n.name for n in directory.live_nodes()] == ["b"]
    again, new_lease = directory.register_node(info("a"), TTL)
    assert new_lease.epoch > lease.epoch and again.lease_epoch == new_lease.epoch
    assert directory.node_alive("a", new_lease.epoch)
    assert not directory.node_alive("a", lease.epoch)


def test_read_lease_reports_holder_and_expiry(meta_store: MetaStore) -> None:
    assert meta_store.read_lease("cluster/node-lease/x") is None
    lease = meta_store.acquire_lease("cluster/node-lease/x", "x", SHORT_TTL)
    seen = meta_store.read_lease("cluster/node-lease/x")
    assert seen is not None and (seen.holder, seen.epoch) == ("x", lease.epoch)
    wait_until(lambda: meta_store.read_lease("cluster/node-lease/x") is None)


def test_acquisition_checks_membership_and_bumps_the_epoch(meta_store: MetaStore) -> None:
    directory = ClusterDirectory(meta_store)
    leases = {n: register(directory, n) for n in ("a", "b", "c", "d")}
    created = directory.create_stream(STREAM, ["a", "b", "c"])
    assert created.epoch == 0 and created.leader is None
    with pytest.raises(StreamUnavailableError):
        directory.leader_of(STREAM)
    with pytest.raises(NotAMemberError):
        directory.acquire_leadership(STREAM, "d", leases["d"])
    first = directory.acquire_leadership(STREAM, "a", leases["a"])
    assert first.epoch == 1
    assert directory.leader_of(STREAM).name == "a"
    with pytest.raises(LeaderAliveError):
        directory.acquire_leadership(STREAM, "b", leases["b"])
    # The leader re-acquiring (e.g. after a restart) still takes a new epoch.
    assert directory.acquire_leadership(STREAM, "a", leases["a"]).epoch == 2


def test_epoch_is_above_pointer_and_disk_epochs(meta_store: MetaStore) -> None:
    directory = ClusterDirectory(meta_store)
    lease = register(directory, "a")
    directory.create_stream(STREAM, ["a"])
    meta_store.create(pointer_key(STREAM), b'{"root": null, "epoch": 7}', epoch=7)
    assert directory.acquire_leadership(STREAM, "a", lease).epoch == 8
    assert directory.acquire_leadership(STREAM, "a", lease, seen_epochs=[3, 12]).epoch == 13
    assert directory.require_stream(STREAM).epoch == 13


def test_leader_attached_to_its_node_lease(meta_store: MetaStore) -> None:
    directory = ClusterDirectory(meta_store)
    short = register(directory, "a", SHORT_TTL)
    b = register(directory, "b")
    for i in range(3):  # several streams, one lease
        directory.create_stream(f"{STREAM}{i}", ["a", "b"])
        directory.acquire_leadership(f"{STREAM}{i}", "a", short)
    wait_until(lambda: not directory.node_alive("a", short.epoch))
    for i in range(3):
        with pytest.raises(StreamUnavailableError):
            directory.leader_of(f"{STREAM}{i}")
        taken = directory.acquire_leadership(f"{STREAM}{i}", "b", b)
        assert taken.epoch == 2
        assert directory.leader_of(f"{STREAM}{i}").name == "b"


def test_acquisition_on_an_expired_node_lease_is_refused(meta_store: MetaStore) -> None:
    """A node cut from the MetaStore still holds its old lease object; acquiring with
    it after the lease expired would record a leader every other node sees as dead
    (its new registration carries a new lease epoch), so it is refused."""
    directory = ClusterDirectory(meta_store)
    short = register(directory, "a", SHORT_TTL)
    directory.create_stream(STREAM, ["a"])
    first = directory.acquire_leadership(STREAM, "a", short)
    assert first.lease_epoch == short.epoch
    wait_until(lambda: not directory.node_alive("a", short.epoch))
    before = directory.require_stream(STREAM)
    with pytest.raises(LeaseLostError):
        directory.acquire_leadership(STREAM, "a", short)
    assert directory.require_stream(STREAM) == before
    again = register(directory, "a")
    taken = directory.acquire_leadership(STREAM, "a", again)
    assert taken.lease_epoch == again.epoch > short.epoch
    assert directory.leader_of(STREAM).name == "a"


def test_concurrent_acquisitions_elect_one_leader_per_epoch(meta_store_uri: str) -> None:
    stores = [open_meta_store(meta_store_uri) for _ in range(4)]
    try:
        directories = [ClusterDirectory(s) for s in stores]
        names = ["a", "b", "c", "d"]
        leases = [register(d, n) for d, n in zip(directories, names, strict=True)]
        directories[0].create_stream(STREAM, names)
        results: list[Leadership | Exception] = []
        barrier = threading.Barrier(4)

        def take(i: int) -> None:
            barrier.wait()
            try:
                results.append(directories[i].acquire_leadership(STREAM, names[i], leases[i]))
            except (LeaderAliveError, VersionConflictError) as exc:
                results.append(exc)

        threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if isinstance(r, Leadership)]
        assert len(winners) == 1 and winners[0].epoch == 1
        assert directories[0].leader_of(STREAM).name == winners[0].node
    finally:
        for s in stores:
            s.close()


def test_member_changes_only_by_the_current_leader_one_at_a_time(
    meta_store: MetaStore,
) -> None:
    directory = ClusterDirectory(meta_store)
    leases = {n: register(directory, n) for n in ("a", "b", "c", "d")}
    directory.create_stream(STREAM, ["a", "b", "c"])
    old = directory.acquire_leadership(STREAM, "a", leases["a"])
    directory.resign(old)
    assert directory.require_stream(STREAM).leader is None
    lead = directory.acquire_leadership(STREAM, "b", leases["b"])
    assert lead.epoch == 2
    with pytest.raises(StaleEpochError):
        directory.add_learner(old, "d")  # a deposed leader cannot change members
    lead = directory.add_learner(lead, "d")
    assert directory.require_stream(STREAM).membership.learners == ("d",)
    with pytest.raises(MembershipChangeError):
        directory.remove_member(lead, "a")  # a change is in progress
    with pytest.raises(MembershipChangeError):
        directory.promote_learner(lead, "d", learner_written=9, commit_offset=10)
    with pytest.raises(NotAMemberError):
        directory.acquire_leadership(STREAM, "d", leases["d"])  # learners never lead
    with pytest.raises(MembershipChangeError):  # it never took its place (no disk claimed)
        directory.promote_learner(lead, "d", learner_written=10, commit_offset=10)
    claim = DiskClaim(DiskSeen(None, False), lambda: "d" * 32)
    assert directory.settle_disk(STREAM, "d", claim) is Standing.TRUSTED
    lead = directory.promote_learner(lead, "d", learner_written=10, commit_offset=10)
    lead = directory.remove_member(lead, "a")
    record = directory.require_stream(STREAM)
    assert record.membership.voters == ("b", "c", "d") and record.epoch == 2
    directory.resign(old)  # a stale resign is a no-op
    assert directory.require_stream(STREAM).leader == "b"
