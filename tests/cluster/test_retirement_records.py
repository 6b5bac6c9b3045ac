"""Retirement records and the replication factor in the MetaStore (SQLite), and the
``tierlog node`` command's failure modes.

* A retirement request is idempotent, is marked retired once, and can be withdrawn.
* The stream record keeps its replication factor through an acquisition, a member change
  and a resignation; a record written before the field counts its voters.
* ``tierlog node retire`` against an admin listener that is not there ends in one line
  on stderr and the generic error exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tierlog.cli import EXIT_ERROR, main
from tierlog.cluster.disk_identity import DiskSeen
from tierlog.cluster.errors import ClusterError, MembershipChangeError
from tierlog.cluster.membership import (
    ClusterDirectory,
    DiskClaim,
    NodeInfo,
    StreamMembers,
    stream_key,
)
from tierlog.cluster.retirement import Retirement, Retirements, retiring_key
from tierlog.storage.meta_store import MetaStore, open_meta_store

STREAM = "%2F_orders_1700000000000000000"


@pytest.fixture
def meta(tmp_path: Path) -> MetaStore:
    store = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    yield store  # type: ignore[misc]
    store.close()


def test_retirement_requests_are_idempotent_marked_once_and_withdrawn(meta: MetaStore) -> None:
    retirements = Retirements(meta)
    first = retirements.request("n1")
    assert retirements.request("n1") == first  # asking again keeps the first request
    assert set(retirements.all()) == {"n1"}
    assert not first.retired
    done = retirements.mark_retired("n1")
    assert done is not None and done.retired and done.requested_ms == first.requested_ms
    assert retirements.mark_retired("n1") == done
    assert retirements.withdraw("n1")
    assert not retirements.withdraw("n1")
    assert retirements.get("n1") is None and retirements.mark_retired("n1") is None


def test_a_damaged_retirement_record_is_a_typed_error(meta: MetaStore) -> None:
    meta.create(retiring_key("n1"), b"{not json")
    with pytest.raises(ClusterError):
        Retirements(meta).all()
    assert Retirement.decode(Retirement("n2", 5, 7).encode()) == Retirement("n2", 5, 7)


def test_the_replication_factor_is_kept_by_every_rewrite(meta: MetaStore) -> None:
    directory = ClusterDirectory(meta)
    _, lease = directory.register_node(NodeInfo("a", "a:1", "a:2", "a:3"), 30.0)
    record = directory.create_stream(STREAM, ("a", "b"))
    assert record.replication_factor == 2
    leadership = directory.acquire_leadership(STREAM, "a", lease)
    assert directory.require_stream(STREAM).replication_factor == 2
    leadership = directory.add_learner(leadership, "c", replication_factor=3)
    assert directory.require_stream(STREAM).replication_factor == 3
    directory.settle_disk(STREAM, "c", DiskClaim(DiskSeen(None, False), lambda: "c" * 32))
    assert directory.require_stream(STREAM).replication_factor == 3  # a claim keeps it too
    leadership = directory.promote_learner(leadership, "c", 10, 10)
    after = directory.require_stream(STREAM)
    assert after.membership.voters == ("a", "b", "c") and after.replication_factor == 3
    with pytest.raises(MembershipChangeError):
        directory.remove_member(leadership, "b", replication_factor=0)
    leadership = directory.remove_member(leadership, "b", replication_factor=2)
    directory.resign(leadership)
    final = directory.require_stream(STREAM)
    assert final.leader is None and final.replication_factor == 2
    assert final.membership.voters == ("a", "c")


def test_a_record_without_the_field_counts_its_voters(meta: MetaStore) -> None:
    old = {
        "voters": ["a", "b", "c"],
        "learners": [],
        "epoch": 1,
        "leader": None,
        "leader_lease_epoch": 0,
    }
    stored = meta.create(stream_key(STREAM), json.dumps(old).encode(), epoch=1)
    record = StreamMembers.decode(STREAM, stored)
    assert record.replication_factor == 0 and record.target_voters == 3


def test_node_retire_against_no_admin_listener_fails_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["node", "retire", "n1", "--admin", "http://127.0.0.1:1"])
    assert code == EXIT_ERROR
    err = capsys.readouterr().err
    assert (
        err.startswith("error: POST http://127.0.0.1:1/api/nodes/n1/retire")
        and err.count("\n") == 1
    )


def test_node_status_counts_a_dead_retiring_node_holding_nothing_as_retired() -> None:
    from tierlog.cluster.members import Membership
    from tierlog.cluster.node import DirectoryView, StreamPlace
    from tierlog.server.cluster_admin import node_status

    record = StreamMembers(STREAM, Membership(("a", "b")), 3, "b", 7, 1)
    a = NodeInfo("a", "a:1", "a:2", "a:3", 1)
    b = NodeInfo("b", "b:1", "b:2", "b:3", 7)
    view = DirectoryView({STREAM: StreamPlace(record, b)}, {"a": a, "b": b})
    asked = Retirement("a", 1)
    status = node_status("a", a, view, asked, {STREAM: "/orders"})
    assert status["retiring"] and not status["retired"]
    assert status["streams_left"] == [{"stream": "/orders", "incarnation": STREAM, "role": "voter"}]
    assert node_status("b", b, view, None, {})["streams"][0]["role"] == "leader"
    gone = DirectoryView({}, {"b": b})  # a is dead and was removed everywhere
    assert node_status("a", a, gone, asked, {})["retired"] is True
    still_member = DirectoryView({STREAM: StreamPlace(record, b)}, {"b": b})
    assert node_status("a", a, still_member, asked, {})["retired"] is False
