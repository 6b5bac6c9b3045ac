"""The manifest follower (one thread for every followed stream, bounded pointer reads)
and the MetaStore consumer offsets of read-only nodes, on both MetaStore backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.read.manifest_follower import ManifestFollower
from tierlog.remote.catalog import Catalog
from tierlog.remote.consumer_offsets import ConsumerOffsets
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.meta_store import MetaStore


def test_offsets_only_go_up_within_an_epoch(meta_store: MetaStore) -> None:
    offsets = ConsumerOffsets(meta_store)
    inc = "vh_stream_1"
    assert offsets.query(inc, "c/1") is None
    assert offsets.store(inc, "c/1", 10, epoch=2)
    assert offsets.store(inc, "c/1", 12, epoch=2)
    assert not offsets.store(inc, "c/1", 11, epoch=2)  # older store arriving late
    assert not offsets.store(inc, "c/1", 99, epoch=1)  # a node that saw an older writer
    stored = offsets.query(inc, "c/1")
    assert stored is not None and (stored.offset, stored.epoch) == (12, 2)
    assert offsets.store(inc, "c/1", 3, epoch=3)  # a newer writer epoch replaces it
    assert offsets.store(inc, "other", 1, epoch=3)
    assert offsets.store("vh_stream_2", "c/1", 5, epoch=3)
    listed = offsets.list(inc)
    assert {k: v.offset for k, v in listed.items()} == {"c/1": 3, "other": 1}
    # a writer took c/1 over into its log at offset 500; a store here clears the mark
    assert listed["c/1"].taken_at is None
    assert offsets.mark_taken(inc, listed["c/1"], "c/1", 500)
    assert not offsets.mark_taken(inc, listed["c/1"], "c/1", 600)  # changed meanwhile
    taken = offsets.query(inc, "c/1")
    assert taken is not None and (taken.offset, taken.taken_at) == (3, 500)
    assert offsets.store(inc, "c/1", 4, epoch=3)
    again = offsets.query(inc, "c/1")
    assert again is not None and (again.offset, again.taken_at) == (4, None)
    listed = offsets.list(inc)
    assert not offsets.remove(inc, "c/1", listed["c/1"].version + 1000)  # changed meanwhile
    assert offsets.remove(inc, "c/1", listed["c/1"].version)
    assert sorted(offsets.remove_all(inc)) == ["other"]
    assert offsets.list(inc) == {}
    assert offsets.query("vh_stream_2", "c/1") is not None
    with pytest.raises(ValueError):
        offsets.store(inc, "x", -1, epoch=0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_follower_polls_each_stream_once_per_round_within_the_budget(
    tmp_path: Path, meta_store: MetaStore
) -> None:
    catalog = Catalog(meta_store)
    store = FsObjectStore(tmp_path / "objects")
    records = [catalog.create("/", f"s{i}") for i in range(4)]
    clock = Clock()
    follower = ManifestFollower(
        catalog, store, "", interval=1.0, max_reads_per_second=1000.0, clock=clock
    )
    changes: list[str] = []
    for r in records:
        follower.follow(r.incarnation, lambda r=r: changes.append(r.name))  # type: ignore[misc]
    wait = follower.poll_due()
    assert follower.reads == 4 and sorted(changes) == ["s0", "s1", "s2", "s3"]
    assert 0.9 <= wait <= 1.0
    assert follower.poll_due() > 0 and follower.reads == 4  # nobody is due yet
    clock.now += 1.0
    follower.poll_due()
    assert follower.reads == 8 and len(changes) == 4  # pointers unchanged: no wake-up
    # with many streams a round stretches to n / rate seconds
    slow = ManifestFollower(catalog, store, "", interval=0.1, max_reads_per_second=2.0, clock=clock)
    for r in records:
        slow.follow(r.incarnation)
    assert slow.poll_due() == pytest.approx(2.0, abs=0.3)  # 4 streams / 2 per second
    # streams nobody reads here are not polled (a reader refreshes them itself)
    reading = {"s1"}
    for r in records:
        follower.follow(r.incarnation, active=lambda r=r: r.name in reading)  # type: ignore[misc]
    clock.now += 1.0
    follower.poll_due()
    assert follower.reads == 9
    follower.unfollow(records[0].incarnation)
    assert len(follower.followed()) == 3
    with pytest.raises(ValueError):
        ManifestFollower(catalog, store, "", interval=0)


def test_deleting_a_stream_removes_its_metastore_offsets(
    tmp_path: Path, meta_store: MetaStore
) -> None:
    from tierlog.tiering.cleanup import run_stream_cleanups

    catalog = Catalog(meta_store)
    store = FsObjectStore(tmp_path / "objects")
    gone = catalog.create("/", "gone")
    kept = catalog.create("/", "kept")
    offsets = ConsumerOffsets(meta_store)
    offsets.store(gone.incarnation, "c", 5, epoch=1)
    offsets.store(kept.incarnation, "c", 6, epoch=1)
    catalog.delete("/", "gone")
    assert run_stream_cleanups(catalog, store) == [gone.incarnation]
    assert offsets.list(gone.incarnation) == {}
    assert offsets.query(kept.incarnation, "c") is not None
