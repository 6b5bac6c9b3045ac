"""Amnesia-safe membership: the pure decisions (``cluster/disk_identity.py``), the
demotion rule of the member plan, the leader forgetting a demoted member's acks, the
record's fields (and records from before them), the directory's transactions on
SQLite, and the ``member.id`` file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierlog.cluster import state as cs
from tierlog.cluster.disk_identity import (
    FRESH,
    DiskSeen,
    MemberDisks,
    Standing,
    after_settling,
    standing,
)
from tierlog.cluster.errors import DiskNotTrustedError, MembershipChangeError
from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.member_plan import (
    Demote,
    NodesSeen,
    RemoveMember,
    StreamSeen,
    Wait,
    next_member_change,
)
from tierlog.cluster.members import Membership
from tierlog.cluster.membership import (
    ClusterDirectory,
    DiskClaim,
    NodeInfo,
    StreamMembers,
    stream_key,
)
from tierlog.log.config import LogConfig
from tierlog.log.member_id import (
    MEMBER_ID_FILE,
    holds_chunks,
    new_member_id,
    read_member_id,
    write_member_id,
)
from tierlog.log.writer import StreamLog
from tierlog.storage.meta_store import MetaStore, open_meta_store

THREE = Membership(("a", "b", "c"))
STREAM = "%2F_orders_1700000000000000000"
EMPTY = DiskSeen(None, False)


# -- the decision ----------------------------------------------------------------------
def test_standing_follows_the_record() -> None:
    disks = MemberDisks.of({"a": "id-a", "b": FRESH}, lost=())
    assert standing(THREE, disks, "a", DiskSeen("id-a", True)) is Standing.TRUSTED
    assert standing(THREE, disks, "a", DiskSeen("id-a", False)) is Standing.TRUSTED
    # emptied, replaced or another identity: never trusted
    assert standing(THREE, disks, "a", EMPTY) is Standing.MARK_LOST
    assert standing(THREE, disks, "a", DiskSeen("other", True)) is Standing.MARK_LOST
    # a place given and not taken yet: claimed whatever the directory holds
    assert standing(THREE, disks, "b", EMPTY) is Standing.CLAIM
    assert standing(THREE, disks, "b", DiskSeen("old", True)) is Standing.CLAIM
    # no identity recorded (a record from before identities): the upgrade rule
    assert standing(THREE, disks, "c", DiskSeen(None, True)) is Standing.CLAIM
    assert standing(THREE, disks, "c", EMPTY) is Standing.MARK_LOST
    assert standing(THREE, disks, "d", DiskSeen("x", True)) is Standing.NOT_MEMBER
    # recorded lost: sticky, even with the original disk back
    lost = disks.marked_lost("a")
    assert standing(THREE, lost, "a", DiskSeen("id-a", True)) is Standing.LOST
    # the only member: nobody else holds what it lost, nobody could demote it
    alone = Membership(("a",))
    assert standing(alone, disks, "a", EMPTY) is Standing.CLAIM
    assert standing(alone, lost, "a", DiskSeen("id-a", True)) is Standing.TRUSTED


def test_settling_claims_or_marks() -> None:
    disks = MemberDisks.created(THREE.voters)
    assert disks.as_dict() == {"a": "", "b": "", "c": ""}
    now, claimed = after_settling(THREE, disks, "a", EMPTY, "new-a")
    assert now is Standing.TRUSTED and claimed.id_of("a") == "new-a" and claimed.trusted("a")
    now, marked = after_settling(THREE, claimed, "a", DiskSeen("stale", True), "unused")
    assert now is Standing.LOST and marked.lost == {"a"} and not marked.trusted("a")
    assert after_settling(THREE, marked, "a", EMPTY, "x") == (Standing.LOST, marked)
    rejoined = marked.joined("a")
    assert rejoined.id_of("a") == FRESH and not rejoined.lost
    assert rejoined.removed("a").id_of("a") is None
    with pytest.raises(ValueError):
        disks.claimed("a", "")


def test_roles_shown_to_operators() -> None:
    record = StreamMembers(
        STREAM,
        Membership(("a", "b"), ("c",)),
        3,
        "a",
        1,
        7,
        3,
        MemberDisks.of({"a": "id-a", "b": "id-b", "c": FRESH}, lost={"b"}),
    )
    assert record.roles() == {"a": "voter", "b": "voter (disk lost)", "c": "learner (joining)"}


def test_record_round_trip_and_records_from_before_identities() -> None:
    record = StreamMembers(
        STREAM, THREE, 4, "a", 2, 0, 3, MemberDisks.of({"a": "id-a", "b": ""}, lost={"c"})
    )
    stored = json.loads(record.encode())
    assert stored["disks"] == {"a": "id-a", "b": ""} and stored["lost_disks"] == ["c"]

    class Stored:
        value = record.encode()
        version = 9

    again = StreamMembers.decode(STREAM, Stored)  # type: ignore[arg-type]
    assert again.disks == record.disks
    old = {"voters": ["a", "b"], "learners": [], "epoch": 1, "leader": None}
    old["leader_lease_epoch"] = 0

    class Legacy:
        value = json.dumps(old).encode()
        version = 1

    legacy = StreamMembers.decode(STREAM, Legacy)  # type: ignore[arg-type]
    assert legacy.disks == MemberDisks() and legacy.disks.id_of("a") is None


# -- the member plan -----------------------------------------------------------------
def seen(
    written: dict[str, int], lost: frozenset[str], learners: tuple[str, ...] = ()
) -> StreamSeen:
    return StreamSeen("a", Membership(("a", "b", "c"), learners), 3, 10, written, lost)


def test_a_lost_voter_is_demoted_once_the_others_hold_the_commit() -> None:
    nodes = NodesSeen(frozenset({"a", "b", "c"}))
    # b's written offset came from the disk it lost: it counts for nothing
    waiting = next_member_change(seen({"a": 10, "b": 10, "c": 4}, frozenset({"b"})), nodes)
    assert isinstance(waiting, Wait) and "b" in waiting.reason
    step = next_member_change(seen({"a": 10, "b": NO_CHUNK, "c": 10}, frozenset({"b"})), nodes)
    assert step == Demote("b", "voter b lost its disk")
    # a lost learner's change is abandoned
    learner = seen({"a": 10, "b": 10, "c": 10}, frozenset({"d"}), ("d",))
    nodes4 = NodesSeen(frozenset({"a", "b", "c", "d"}))
    assert next_member_change(learner, nodes4) == RemoveMember("d", "learner d lost its disk")


def test_demotion_is_one_change() -> None:
    assert THREE.demote("b") == Membership(("a", "c"), ("b",))
    with pytest.raises(MembershipChangeError):
        THREE.add_learner("d").demote("b")
    with pytest.raises(MembershipChangeError):
        Membership(("a",)).demote("a")
    with pytest.raises(MembershipChangeError):
        THREE.demote("d")


def test_a_demoted_member_is_promoted_only_on_what_it_writes_again() -> None:
    """The leader heard b write everything (from the disk b then lost); once b is
    demoted those acks are forgotten: no promotion until it writes the commit again."""
    timing = cs.LeaseTiming(10.0, 1.0)
    state = cs.LeaderState("a", 5, THREE, Tail(3, 4), timing, acquired_at=100.0)
    state.start(100.0)
    state.handle(cs.EpochAdopted("b", 5, Tail(3, 4)), 100.0)
    state.handle(cs.LocalWritten(5, 5), 100.0)
    assert state.handle(cs.MemberAcked("b", 5, 5), 100.0) == [cs.Commit(5)]
    effects = state.handle(cs.MembersChanged(THREE.demote("b")), 100.0)
    assert effects == [] and state.written("b") == NO_CHUNK
    state.handle(cs.MemberAcked("c", 5, 5), 100.0)  # a and c now hold the commit
    assert state.handle(cs.MemberAcked("b", 5, 2), 100.0) == []
    assert state.handle(cs.MemberAcked("b", 5, 5), 100.0) == [cs.PromoteLearner("b", 5, 5)]


# -- the directory (SQLite) ----------------------------------------------------------
@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    store = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    yield store
    store.close()


def claim(seen: DiskSeen, new_id: str = "f" * 32) -> DiskClaim:
    return DiskClaim(seen, lambda: new_id)


def test_the_directory_ties_leading_to_the_disk(meta: MetaStore) -> None:
    directory = ClusterDirectory(meta)
    leases = {
        n: directory.register_node(NodeInfo(n, f"{n}:1", f"{n}:2", f"{n}:3"), 30.0)[1]
        for n in ("a", "b", "c")
    }
    directory.create_stream(STREAM, ("a", "b", "c"))
    lead = directory.acquire_leadership(STREAM, "a", leases["a"], disk=claim(EMPTY, "a" * 32))
    assert directory.require_stream(STREAM).disks.id_of("a") == "a" * 32
    assert directory.settle_disk(STREAM, "b", claim(EMPTY, "b" * 32)) is Standing.TRUSTED
    directory.resign(lead)
    # b comes back with an empty directory: it may not lead, and is recorded lost
    with pytest.raises(DiskNotTrustedError):
        directory.acquire_leadership(STREAM, "b", leases["b"], disk=claim(EMPTY))
    record = directory.require_stream(STREAM)
    assert record.disks.lost == {"b"} and record.leader is None
    assert directory.settle_disk(STREAM, "b", claim(DiskSeen("b" * 32, True))) is Standing.LOST
    # a (its own disk) leads, demotes b, and b takes a fresh place as a learner
    lead = directory.acquire_leadership(
        STREAM, "a", leases["a"], disk=claim(DiskSeen("a" * 32, True))
    )
    lead = directory.demote_voter(lead, "b")
    record = directory.require_stream(STREAM)
    assert record.membership == Membership(("a", "c"), ("b",)) and not record.disks.lost
    assert record.replication_factor == 3
    with pytest.raises(MembershipChangeError):  # not claimed yet
        directory.promote_learner(lead, "b", 10, 10)
    assert directory.settle_disk(STREAM, "b", claim(EMPTY, "e" * 32)) is Standing.TRUSTED
    lead = directory.promote_learner(lead, "b", 10, 10)
    record = directory.require_stream(STREAM)
    assert record.membership.voters == ("a", "b", "c") and record.disks.trusted("b")


def test_records_from_before_identities_are_claimed_by_logs_that_hold_chunks(
    meta: MetaStore,
) -> None:
    """The upgrade: a member whose log holds chunks keeps its place (and records its
    identity); an empty directory cannot be told from a lost one."""
    directory = ClusterDirectory(meta)
    _, lease = directory.register_node(NodeInfo("a", "a:1", "a:2", "a:3"), 30.0)
    old = {"voters": ["a", "b", "c"], "learners": [], "epoch": 3, "leader": None}
    old["leader_lease_epoch"] = 0
    meta.create(stream_key(STREAM), json.dumps(old).encode(), epoch=3)
    assert directory.settle_disk(STREAM, "b", claim(DiskSeen(None, True), "b" * 32)) is (
        Standing.TRUSTED
    )
    assert directory.settle_disk(STREAM, "c", claim(EMPTY)) is Standing.LOST
    lead = directory.acquire_leadership(
        STREAM, "a", lease, disk=claim(DiskSeen(None, True), "a" * 32)
    )
    assert lead.epoch == 4
    record = directory.require_stream(STREAM)
    assert record.disks.as_dict() == {"a": "a" * 32, "b": "b" * 32}
    assert record.disks.lost == {"c"}


# -- the member.id file --------------------------------------------------------------
def test_member_id_file(tmp_path: Path) -> None:
    stream_dir = str(tmp_path / "s")
    assert read_member_id(stream_dir) is None and not holds_chunks(stream_dir)
    member_id = new_member_id()
    write_member_id(stream_dir, member_id)  # creates the directory
    assert read_member_id(stream_dir) == member_id
    path = os.path.join(stream_dir, MEMBER_ID_FILE)
    raw = bytearray(Path(path).read_bytes())
    raw[10] ^= 0xFF
    Path(path).write_bytes(bytes(raw))
    assert read_member_id(stream_dir) is None  # damaged: carries no identity
    log_dir = str(tmp_path / "log")
    stream_log = StreamLog.create_follower(log_dir, LogConfig())
    try:
        assert not holds_chunks(log_dir)
        stream_log.start_epoch(1)
        stream_log.sync_to_disk()
        assert holds_chunks(log_dir)
    finally:
        stream_log.close()


# -- the node's edge (server/disk_trust.py) ------------------------------------------
async def test_the_node_claims_its_place_and_finds_its_directory_gone(
    meta: MetaStore, tmp_path: Path
) -> None:
    """A new stream's member claims its place (an empty follower log and its identity
    in the directory, then the record); restarted with the directory emptied, it is
    not admitted and the record says its disk is lost."""
    import asyncio
    import shutil
    from typing import Any

    from tierlog.server.disk_trust import DiskTrust

    async def run(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    directory = ClusterDirectory(meta)
    directory.create_stream(STREAM, ("a", "b"))
    streams = tmp_path / "streams"
    trust = DiskTrust("b", directory, str(streams), run)
    assert await trust.admit(directory.require_stream(STREAM), LogConfig())
    stream_dir = streams / STREAM
    member_id = read_member_id(str(stream_dir))
    assert member_id is not None and (stream_dir / "00000000000000000000.segment").exists()
    record = directory.require_stream(STREAM)
    assert record.disks.id_of("b") == member_id and record.roles()["b"] == "voter"
    assert await trust.admit(record, LogConfig())  # remembered: no second claim
    assert directory.require_stream(STREAM).version == record.version

    shutil.rmtree(stream_dir)  # the disk is replaced while the node is down
    restarted = DiskTrust("b", directory, str(streams), run)
    assert not await restarted.admit(record, LogConfig())
    lost = directory.require_stream(STREAM)
    assert lost.disks.lost == {"b"} and lost.roles()["b"] == "voter (disk lost)"
    assert not stream_dir.exists()  # a lost member creates nothing
    assert not await restarted.admit(lost, LogConfig())
    assert restarted.status() == {"disks_lost": [STREAM]}
    restarted.keep([])  # the stream was deleted
    assert restarted.status() == {"disks_lost": []}
