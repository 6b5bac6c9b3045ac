"""The MetaStore contract, run against every backend: SQLite and a real etcd server."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierlog.errors import ConfigError, TierlogError
from tierlog.storage.errors import (
    AlreadyExistsError,
    EpochFencedError,
    InvalidKeyError,
    KeyDeletedError,
    LeaseHeldError,
    LeaseLostError,
    NotFoundError,
    PermanentError,
    TransientError,
    VersionConflictError,
)
from tierlog.storage.meta_store import (
    MAX_META_KEY_BYTES,
    MAX_META_VALUE_BYTES,
    CleanupItem,
    Lease,
    MetaStore,
    open_meta_store,
)

WAIT_LIMIT_S = 20.0  # bound for waits on lease expiry; never an assertion about speed


def acquire_when_free(store: MetaStore, name: str, holder: str, ttl: float) -> Lease:
    """Retry until the lease is free (an expired TTL), bounded by WAIT_LIMIT_S."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while True:
        try:
            return store.acquire_lease(name, holder, ttl)
        except LeaseHeldError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# --- keys --------------------------------------------------------------------------------


def test_fresh_namespace_is_empty(meta_store: MetaStore) -> None:
    assert meta_store.list("") == []
    assert meta_store.get("streams/none") is None
    assert meta_store.pending("cleanup") == []


def test_create_then_get(meta_store: MetaStore) -> None:
    created = meta_store.create("streams/s1", b"root-1", epoch=3)
    assert created.key == "streams/s1"
    assert created.value == b"root-1"
    assert created.epoch == 3
    assert created.version > 0
    assert meta_store.get("streams/s1") == created


def test_create_existing_fails_and_keeps_value(meta_store: MetaStore) -> None:
    first = meta_store.create("k", b"one")
    with pytest.raises(AlreadyExistsError):
        meta_store.create("k", b"two")
    assert meta_store.get("k") == first


def test_empty_value_round_trips(meta_store: MetaStore) -> None:
    created = meta_store.create("empty", b"")
    assert meta_store.get("empty") == created
    assert created.value == b""


def test_put_if_updates_value_epoch_and_version(meta_store: MetaStore) -> None:
    v1 = meta_store.create("k", b"a", epoch=1)
    v2 = meta_store.put_if("k", b"b", expected_version=v1.version, epoch=1)
    v3 = meta_store.put_if("k", b"c", expected_version=v2.version, epoch=5)
    assert v1.version < v2.version < v3.version
    assert (v3.value, v3.epoch) == (b"c", 5)
    assert meta_store.get("k") == v3


def test_put_if_wrong_version_conflicts(meta_store: MetaStore) -> None:
    v1 = meta_store.create("k", b"a")
    v2 = meta_store.put_if("k", b"b", v1.version, 0)
    with pytest.raises(VersionConflictError):
        meta_store.put_if("k", b"stale", v1.version, 0)
    with pytest.raises(VersionConflictError):
        meta_store.put_if("k", b"future", v2.version + 1000, 0)
    assert meta_store.get("k") == v2


def test_epoch_rule_lower_epoch_is_fenced(meta_store: MetaStore) -> None:
    v1 = meta_store.create("k", b"a", epoch=5)
    with pytest.raises(EpochFencedError):
        meta_store.put_if("k", b"deposed", v1.version, epoch=4)
    assert meta_store.get("k") == v1
    same = meta_store.put_if("k", b"same-epoch", v1.version, epoch=5)
    higher = meta_store.put_if("k", b"new-owner", same.version, epoch=6)
    with pytest.raises(EpochFencedError):
        meta_store.put_if("k", b"old-owner", higher.version, epoch=5)
    assert meta_store.get("k") == higher


def test_fenced_error_is_a_precondition_failure(meta_store: MetaStore) -> None:
    v1 = meta_store.create("k", b"a", epoch=2)
    with pytest.raises(TierlogError):
        meta_store.put_if("k", b"x", v1.version, epoch=1)


def test_put_if_on_missing_key_never_creates(meta_store: MetaStore) -> None:
    with pytest.raises(KeyDeletedError):
        meta_store.put_if("never", b"x", expected_version=1, epoch=0)
    assert meta_store.get("never") is None


def test_put_if_after_delete_is_deleted_and_stays_deleted(meta_store: MetaStore) -> None:
    v1 = meta_store.create("streams/s", b"ptr", epoch=1)
    meta_store.delete("streams/s")
    with pytest.raises(KeyDeletedError):
        meta_store.put_if("streams/s", b"late-commit", v1.version, epoch=1)
    assert meta_store.get("streams/s") is None
    assert meta_store.list("streams/") == []


def test_delete_missing_and_version_mismatch(meta_store: MetaStore) -> None:
    with pytest.raises(NotFoundError):
        meta_store.delete("missing")
    v1 = meta_store.create("k", b"a")
    v2 = meta_store.put_if("k", b"b", v1.version, 0)
    with pytest.raises(VersionConflictError):
        meta_store.delete("k", expected_version=v1.version)
    assert meta_store.get("k") == v2
    meta_store.delete("k", expected_version=v2.version)
    assert meta_store.get("k") is None
    with pytest.raises(NotFoundError):
        meta_store.delete("k", expected_version=v2.version)


def test_versions_never_reused_after_delete_and_recreate(meta_store: MetaStore) -> None:
    seen: list[int] = []
    for round_ in range(3):
        v = meta_store.create("streams/s", f"gen-{round_}".encode(), epoch=1)
        seen.append(v.version)
        v = meta_store.put_if("streams/s", b"upd", v.version, 1)
        seen.append(v.version)
        meta_store.create(f"other/{round_}", b"x")  # writes elsewhere also move the counter
        meta_store.delete("streams/s")
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    # A writer holding a version from an earlier incarnation can never match a new one.
    recreated = meta_store.create("streams/s", b"new", epoch=1)
    assert recreated.version > max(seen)
    for old in seen:
        with pytest.raises(VersionConflictError):
            meta_store.put_if("streams/s", b"x", old, 1)


def test_list_is_sorted_and_exact_on_prefix(meta_store: MetaStore) -> None:
    keys = ["s/b", "s/a", "s/a/x", "sa", "s", "t/a", "s/é", "s/z"]
    for k in keys:
        meta_store.create(k, k.encode())
    listed = meta_store.list("s/")
    assert [v.key for v in listed] == sorted(k for k in keys if k.startswith("s/"))
    assert all(v.value == v.key.encode() for v in listed)
    assert [v.key for v in meta_store.list("")] == sorted(keys)
    assert [v.key for v in meta_store.list("s/a")] == ["s/a", "s/a/x"]
    assert meta_store.list("nothing/") == []
    assert {v.key: v for v in meta_store.list("")}["s/b"] == meta_store.get("s/b")


def test_data_survives_reopen(meta_store_uri: str) -> None:
    with open_meta_store(meta_store_uri) as store:
        v1 = store.create("k", b"a", epoch=2)
        store.enqueue("q", b"job")
        lease = store.acquire_lease("owner", "node-a", 30)
    with open_meta_store(meta_store_uri) as store:
        assert store.get("k") == v1
        assert [i.payload for i in store.pending("q")] == [b"job"]
        v2 = store.put_if("k", b"b", v1.version, 2)
        assert v2.version > v1.version
        with pytest.raises(LeaseHeldError):
            store.acquire_lease("owner", "node-b", 30)
        store.release_lease(lease)
        assert store.acquire_lease("owner", "node-b", 30).epoch > lease.epoch


def test_closed_store_raises_typed_error(meta_store_uri: str) -> None:
    store = open_meta_store(meta_store_uri)
    store.close()
    store.close()  # idempotent
    with pytest.raises(PermanentError):
        store.get("k")


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00/."),
        min_size=1,
        max_size=40,
    ),
    value=st.binary(max_size=2048),
    epoch=st.integers(min_value=0, max_value=(1 << 63) - 1),
)
def test_any_valid_key_and_value_round_trip(
    meta_store: MetaStore, name: str, value: bytes, epoch: int
) -> None:
    key = f"h/{uuid.uuid4().hex}/{name}"
    created = meta_store.create(key, value, epoch)
    assert meta_store.get(key) == created
    assert meta_store.list(f"{key[:35]}") == [created]
    updated = meta_store.put_if(key, value[::-1], created.version, epoch)
    assert meta_store.get(key) == updated
    meta_store.delete(key, expected_version=updated.version)
    assert meta_store.get(key) is None


# --- cleanup queue --------------------------------------------------------------------


def test_delete_enqueues_cleanup_in_same_step(meta_store: MetaStore) -> None:
    meta_store.create("streams/s1", b"ptr")
    meta_store.delete("streams/s1", cleanup=("stream-cleanup", b"incarnation-1"))
    assert meta_store.get("streams/s1") is None
    items = meta_store.pending("stream-cleanup")
    assert [i.payload for i in items] == [b"incarnation-1"]
    assert items[0].queue == "stream-cleanup"


def test_failed_delete_enqueues_nothing(meta_store: MetaStore) -> None:
    with pytest.raises(NotFoundError):
        meta_store.delete("missing", cleanup=("q", b"x"))
    v = meta_store.create("k", b"a")
    with pytest.raises(VersionConflictError):
        meta_store.delete("k", expected_version=v.version + 1, cleanup=("q", b"y"))
    assert meta_store.pending("q") == []
    assert meta_store.get("k") == v


def test_pending_is_oldest_first_and_per_queue(meta_store: MetaStore) -> None:
    meta_store.enqueue("q", b"1")
    meta_store.create("k", b"v")
    meta_store.delete("k", cleanup=("q", b"2"))
    meta_store.enqueue("q/sub", b"other-queue")
    meta_store.enqueue("qq", b"other-queue-2")
    meta_store.enqueue("q", b"3")
    items = meta_store.pending("q")
    assert [i.payload for i in items] == [b"1", b"2", b"3"]
    ids = [i.item_id for i in items]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [i.payload for i in meta_store.pending("q/sub")] == [b"other-queue"]
    assert [i.payload for i in meta_store.pending("qq")] == [b"other-queue-2"]


def test_complete_is_idempotent_and_targeted(meta_store: MetaStore) -> None:
    a = meta_store.enqueue("q", b"a")
    b = meta_store.enqueue("q", b"b")
    meta_store.complete(a)
    meta_store.complete(a)
    assert meta_store.pending("q") == [b]
    meta_store.complete(b)
    assert meta_store.pending("q") == []


def test_items_seen_and_completed_from_another_connection(meta_store_uri: str) -> None:
    with open_meta_store(meta_store_uri) as producer, open_meta_store(meta_store_uri) as worker:
        producer.create("streams/x", b"p")
        producer.delete("streams/x", cleanup=("q", b"x"))
        (item,) = worker.pending("q")
        # A worker may rebuild an item from its id (e.g. from a log) and still complete it.
        worker.complete(CleanupItem(item.item_id, item.queue, item.payload))
        assert producer.pending("q") == []


def test_wait_for_items_times_out_when_nothing_new(meta_store: MetaStore) -> None:
    meta_store.enqueue("q", b"old")
    meta_store.pending("q")
    assert meta_store.wait_for_items("q", 0.3) is False
    assert meta_store.wait_for_items("q", 0) is False


def test_wait_for_items_sees_item_enqueued_before_the_wait(meta_store: MetaStore) -> None:
    assert meta_store.pending("q") == []
    meta_store.enqueue("q", b"between-scan-and-wait")
    assert meta_store.wait_for_items("q", 5.0) is True
    assert meta_store.wait_for_items("q", 0) is True


def test_wait_for_items_without_scan_reports_existing_items(meta_store: MetaStore) -> None:
    meta_store.enqueue("q", b"x")
    assert meta_store.wait_for_items("q", 0) is True


def test_wait_for_items_ignores_other_queues(meta_store: MetaStore) -> None:
    meta_store.pending("q")
    meta_store.enqueue("q/other", b"x")
    meta_store.enqueue("qq", b"x")
    assert meta_store.wait_for_items("q", 0.3) is False


@pytest.mark.parametrize("same_instance", [True, False], ids=["same-store", "other-store"])
def test_wait_for_items_wakes_on_delete_cleanup(meta_store_uri: str, same_instance: bool) -> None:
    with open_meta_store(meta_store_uri) as waiter, open_meta_store(meta_store_uri) as other:
        writer = waiter if same_instance else other
        writer.create("streams/s", b"p")
        assert waiter.pending("q") == []
        woke: list[bool] = []
        thread = threading.Thread(target=lambda: woke.append(waiter.wait_for_items("q", 15.0)))
        thread.start()
        time.sleep(0.3)  # let the waiter block first (the test holds either way)
        writer.delete("streams/s", cleanup=("q", b"cleanup-s"))
        thread.join(30)
        assert woke == [True]
        assert [i.payload for i in waiter.pending("q")] == [b"cleanup-s"]


# --- leases ----------------------------------------------------------------------------


def test_lease_acquire_held_release(meta_store: MetaStore) -> None:
    lease = meta_store.acquire_lease("stream/s1", "node-a", 30)
    assert (lease.name, lease.holder) == ("stream/s1", "node-a")
    assert lease.epoch >= 1
    assert lease.expires_at > time.time()
    with pytest.raises(LeaseHeldError):
        meta_store.acquire_lease("stream/s1", "node-b", 30)
    with pytest.raises(LeaseHeldError):
        meta_store.acquire_lease("stream/s1", "node-a", 30)
    other = meta_store.acquire_lease("stream/s2", "node-b", 30)  # names are independent
    meta_store.release_lease(lease)
    again = meta_store.acquire_lease("stream/s1", "node-b", 30)
    assert again.epoch > lease.epoch
    assert again.holder == "node-b"
    meta_store.release_lease(other)


def test_lease_renew_extends(meta_store: MetaStore) -> None:
    lease = meta_store.acquire_lease("l", "node-a", 30)
    renewed = meta_store.renew_lease(lease, 30)
    assert (renewed.name, renewed.holder, renewed.epoch) == ("l", "node-a", lease.epoch)
    assert renewed.expires_at >= lease.expires_at
    with pytest.raises(LeaseHeldError):
        meta_store.acquire_lease("l", "node-b", 30)


def test_expired_lease_is_taken_with_higher_epoch(meta_store: MetaStore) -> None:
    first = meta_store.acquire_lease("l", "node-a", 1)
    second = acquire_when_free(meta_store, "l", "node-b", 30)
    assert second.epoch > first.epoch
    with pytest.raises(LeaseLostError):
        meta_store.renew_lease(first, 1)
    # Releasing a lost lease is a no-op that leaves the new holder alone.
    meta_store.release_lease(first)
    with pytest.raises(LeaseHeldError):
        meta_store.acquire_lease("l", "node-c", 30)
    assert meta_store.renew_lease(second, 30).epoch == second.epoch


def test_renew_after_release_is_lost(meta_store: MetaStore) -> None:
    lease = meta_store.acquire_lease("l", "node-a", 30)
    meta_store.release_lease(lease)
    meta_store.release_lease(lease)  # idempotent
    with pytest.raises(LeaseLostError):
        meta_store.renew_lease(lease, 30)


def test_lease_epochs_strictly_increase_over_many_acquisitions(meta_store: MetaStore) -> None:
    epochs = []
    for i in range(5):
        lease = meta_store.acquire_lease("l", f"node-{i}", 30)
        epochs.append(lease.epoch)
        meta_store.release_lease(lease)
    assert epochs == sorted(set(epochs))


# --- bad input ---------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "..",
    "a/../b",
    "../a",
    "a/..",
    "/abs",
    "a\x00b",
    "k" * (MAX_META_KEY_BYTES + 1),
    "é" * (MAX_META_KEY_BYTES // 2 + 1),  # under the limit in characters, over in bytes
    "\ud800",
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=lambda k: repr(k)[:20])
def test_bad_keys_rejected_everywhere(meta_store: MetaStore, key: str) -> None:
    calls = [
        lambda: meta_store.get(key),
        lambda: meta_store.create(key, b"v"),
        lambda: meta_store.put_if(key, b"v", 1, 0),
        lambda: meta_store.delete(key),
        lambda: meta_store.enqueue(key, b"p"),
        lambda: meta_store.pending(key),
        lambda: meta_store.wait_for_items(key, 0),
        lambda: meta_store.acquire_lease(key, "h", 5),
        lambda: meta_store.acquire_lease("l", key, 5),
    ]
    for call in calls:
        with pytest.raises(InvalidKeyError):
            call()
    assert meta_store.list("") == []


def test_bad_prefixes_values_epochs_rejected(meta_store: MetaStore) -> None:
    for prefix in ["..", "a/../", "/a", "a\x00", "p" * (MAX_META_KEY_BYTES + 1)]:
        with pytest.raises(InvalidKeyError):
            meta_store.list(prefix)
    too_big = b"x" * (MAX_META_VALUE_BYTES + 1)
    with pytest.raises(InvalidKeyError):
        meta_store.create("k", too_big)
    with pytest.raises(InvalidKeyError):
        meta_store.create("k", "text")  # type: ignore[arg-type]
    for epoch in [-1, 1 << 63, True, 1.5]:
        with pytest.raises(InvalidKeyError):
            meta_store.create("k", b"v", epoch)  # type: ignore[arg-type]
    v = meta_store.create("k", b"v", 1)
    with pytest.raises(InvalidKeyError):
        meta_store.put_if("k", too_big, v.version, 1)
    for version in [0, -3, None]:
        with pytest.raises(InvalidKeyError):
            meta_store.put_if("k", b"v", version, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        meta_store.delete("k", cleanup=("q", too_big))
    for ttl in [0, -1, float("nan"), 10**9]:
        with pytest.raises(InvalidKeyError):
            meta_store.acquire_lease("l", "h", ttl)
    assert meta_store.get("k") == v
    assert meta_store.pending("q") == []
    # The largest allowed key and value are accepted.
    big_key = "k" * MAX_META_KEY_BYTES
    big = meta_store.create(big_key, b"x" * MAX_META_VALUE_BYTES)
    assert meta_store.get(big_key) == big


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "nonsense",
        "mysql://host/db",
        "sqlite://relative.db",
        "sqlite:relative.db",
        "sqlite:///db?mode=memory",
        "etcd://",
        "etcd:///prefix",
        "etcd://127.0.0.1/prefix",
        "etcd://127.0.0.1:notaport/prefix",
        "etcd://127.0.0.1:99999/prefix",
        "etcd://127.0.0.1:2379/a/../b",
    ],
)
def test_invalid_uris_raise_config_error(uri: str) -> None:
    with pytest.raises(ConfigError):
        open_meta_store(uri)


def test_sqlite_missing_directory_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        open_meta_store(f"sqlite://{tmp_path}/no/such/dir/meta.db")


def test_sqlite_not_a_database_is_permanent_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_bytes(b"this is not an sqlite database" * 100)
    with pytest.raises(PermanentError):
        open_meta_store(f"sqlite://{bogus}")
    with pytest.raises(PermanentError):
        open_meta_store(f"sqlite://{tmp_path}")  # a directory


@pytest.mark.etcd
@pytest.mark.timeout(60)
def test_unreachable_etcd_is_a_prompt_transient_error() -> None:
    from tests.plugins.etcd import free_port

    with pytest.raises(TransientError):
        open_meta_store(f"etcd://127.0.0.1:{free_port()}/x", timeout=1.0)


@pytest.mark.etcd
def test_etcd_prefixes_are_isolated(etcd_server: str) -> None:
    a_uri = f"etcd://{etcd_server}/iso-{uuid.uuid4().hex}"
    b_uri = f"etcd://{etcd_server}/iso-{uuid.uuid4().hex}"
    with open_meta_store(a_uri) as a, open_meta_store(b_uri) as b:
        a.create("k", b"a")
        a.enqueue("q", b"a")
        a.acquire_lease("l", "h", 30)
        assert b.get("k") is None
        assert b.list("") == []
        assert b.pending("q") == []
        b.acquire_lease("l", "h", 30)


@pytest.mark.etcd
def test_etcd_foreign_value_is_a_typed_error(etcd_server: str) -> None:
    """A key written by something else (no epoch header) is reported, not mis-read."""
    import asyncio

    import aetcd

    prefix = f"foreign-{uuid.uuid4().hex}"
    host, port = etcd_server.split(":")

    async def write_foreign() -> None:
        async with aetcd.Client(host=host, port=int(port)) as client:
            await client.put(f"{prefix}/kv/k".encode(), b"abc")

    asyncio.run(write_foreign())
    with open_meta_store(f"etcd://{etcd_server}/{prefix}") as store, pytest.raises(PermanentError):
        store.get("k")


def test_sqlite_write_lock_held_too_long_is_transient(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "meta.db"
    with open_meta_store(f"sqlite://{path}", busy_timeout=0.2) as store:
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(TransientError):
                store.create("k", b"v")
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert store.create("k", b"v").value == b"v"  # usable again once the lock is gone


@pytest.mark.etcd
@pytest.mark.timeout(120)
def test_etcd_going_away_is_transient(tmp_path: Path) -> None:
    """A private etcd is stopped under an open store: calls fail typed, close still works."""
    from tests.plugins.etcd import find_or_install_etcd, start_etcd, stop_process

    proc, port = start_etcd(find_or_install_etcd(), tmp_path)
    try:
        store = open_meta_store(f"etcd://127.0.0.1:{port}/gone", timeout=1.0)
        store.create("k", b"v")
        assert store.pending("q") == []
    finally:
        stop_process(proc)
    with pytest.raises(TransientError):
        store.get("k")
    with pytest.raises(TransientError):
        store.put_if("k", b"w", 1, 0)
    with pytest.raises(TransientError):
        store.wait_for_items("q", 0.5)
    with pytest.raises(TransientError):
        store.acquire_lease("l", "h", 5)
    store.close()
