"""The server's scheduled collection in-process (filesystem store, SQLite MetaStore): what
one node collects. Live streams only when it leads them (their tiering runs here), and
deleted incarnations only while it holds the ``gc/deleted-incarnations`` lease, so two
nodes never collect the same garbage at once."""

from __future__ import annotations

import time
from pathlib import Path

from tierlog.metrics import Metrics
from tierlog.remote import keys
from tierlog.remote.catalog import Catalog
from tierlog.server.config import ServerConfig
from tierlog.server.gc_service import DELETED_LEASE, GcService
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

LATER = 2 * 86400.0  # the services' clock runs past the default grace period


def service(store: FsObjectStore, catalog: Catalog, leading: list[str]) -> GcService:
    return GcService(
        ServerConfig().validate(),
        store,
        catalog,
        Metrics(),
        lambda: leading,
        clock=lambda: time.time() + LATER,
    )


def plant(store: FsObjectStore, incarnation: str) -> list[str]:
    planted = [
        keys.fragment_key("", incarnation, 0),
        keys.root_key("", incarnation, keys.new_uid()),
    ]
    for key in planted:
        store.put(key, b"x")
    return planted


def listed(store: FsObjectStore) -> set[str]:
    return {m.key for m in store.list("stream/")}


def test_deleted_incarnations_are_collected_only_by_the_lease_holder(tmp_path: Path) -> None:
    store = FsObjectStore(tmp_path / "objects")
    meta = SqliteMetaStore(str(tmp_path / "meta.db"))
    catalog = Catalog(meta)
    gone = plant(store, "%2F_gone_1")
    other = meta.acquire_lease(DELETED_LEASE, "n2", 60)  # another node collects now
    gc = service(store, catalog, [])
    run = gc.collect()
    assert not run.deleted_lease and set(gone) <= listed(store)
    meta.release_lease(other)
    run = gc.collect()
    assert run.deleted_lease and run.deleted == 2 and listed(store) == set()
    assert gc.metrics.registry.get_sample_value("tierlog_gc_deleted_objects_total") == 2
    assert meta.read_lease(DELETED_LEASE) is None  # released after the run


def test_a_live_stream_is_collected_only_where_it_is_led(tmp_path: Path) -> None:
    store = FsObjectStore(tmp_path / "objects")
    meta = SqliteMetaStore(str(tmp_path / "meta.db"))
    catalog = Catalog(meta)
    record = catalog.create("/", "s")
    inc = record.incarnation
    orphan_root = keys.root_key("", inc, keys.new_uid())
    store.put(orphan_root, b"x")
    tail = keys.fragment_key("", inc, 0)  # at the committed next offset: adoptable
    store.put(tail, b"x")
    assert service(store, catalog, []).collect().deleted == 0  # another node leads it
    assert orphan_root in listed(store)
    run = service(store, catalog, [inc]).collect()
    assert run.deleted == 1 and listed(store) == {tail}
