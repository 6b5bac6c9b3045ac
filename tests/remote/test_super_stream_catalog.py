"""The super-stream catalog entry on every MetaStore backend (SQLite, etcd, etcd with TLS
and auth): create-only creation, resuming a creation left ``creating``, the
version-checked state moves, deletion, and the entry's separation from the streams'
catalog; the definition checks and RabbitMQ's partition naming."""

from __future__ import annotations

import pytest

from tierlog.errors import ConfigError
from tierlog.remote.catalog import Catalog
from tierlog.remote.errors import SuperStreamExistsError, SuperStreamNotFoundError
from tierlog.remote.super_streams import (
    CREATING,
    DELETING,
    READY,
    SuperStreamCatalog,
    SuperStreamDefinition,
    partitions_for,
)
from tierlog.storage.errors import VersionConflictError
from tierlog.storage.meta_store import MetaStore


def definition(
    name: str = "invoices", keys: tuple[str, ...] = ("eu", "us", "eu")
) -> SuperStreamDefinition:
    parts = tuple(f"{name}-{i}" for i in range(len(keys)))
    return SuperStreamDefinition("/", name, parts, keys, {"max-age": "1h"})


def test_create_resume_ready_delete(meta_store: MetaStore) -> None:
    catalog = SuperStreamCatalog(meta_store)
    record, resumed = catalog.begin_create(definition())
    assert (record.state, resumed) == (CREATING, False)
    with pytest.raises(SuperStreamNotFoundError):
        catalog.ready("/", "invoices")  # Route / Partitions do not see it yet
    again, resumed = catalog.begin_create(definition())  # same definition: resumed
    assert (again, resumed) == (record, True)
    with pytest.raises(SuperStreamExistsError):
        catalog.begin_create(definition(keys=("eu", "us", "apac")))  # another: taken
    ready = catalog.mark(record, READY)
    assert catalog.ready("/", "invoices") == ready
    assert ready.route("eu") == ["invoices-0", "invoices-2"]
    assert ready.route("apac") == []
    assert ready.arguments == {"max-age": "1h"}
    with pytest.raises(SuperStreamExistsError):
        catalog.begin_create(definition())  # ready: never resumed
    with pytest.raises(VersionConflictError):
        catalog.mark(record, READY)  # a stale record (another node moved it meanwhile)
    assert Catalog(meta_store).list() == []  # not a stream of the streams' catalog
    assert [r.name for r in catalog.list()] == ["invoices"]
    deleting = catalog.begin_delete("/", "invoices")
    assert deleting.state == DELETING
    assert catalog.begin_delete("/", "invoices") == deleting  # again: idempotent
    with pytest.raises(SuperStreamExistsError):
        catalog.begin_create(definition())  # until the deletion finished
    catalog.remove(deleting)
    catalog.remove(deleting)
    assert catalog.get("/", "invoices") is None
    with pytest.raises(SuperStreamNotFoundError):
        catalog.begin_delete("/", "invoices")
    assert catalog.begin_create(definition())[1] is False  # the name is free again


def test_vhosts_and_names_are_kept_apart(meta_store: MetaStore) -> None:
    catalog = SuperStreamCatalog(meta_store)
    for vhost in ("/", "prod/eu", "prod"):
        catalog.begin_create(SuperStreamDefinition(vhost, "eu", ("p",), ("k",)))
    expected = {("/", "eu"), ("prod/eu", "eu"), ("prod", "eu")}
    assert {(r.vhost, r.name) for r in catalog.list()} == expected
    assert catalog.get("prod", "eu") is not None and catalog.get("prod/eu", "x") is None


@pytest.mark.parametrize(
    ("partitions", "keys"),
    [
        (("a", "b"), ("k",)),  # one binding key per partition
        (("a", "a"), ("k", "l")),  # a partition twice
        ((), ()),  # no partition
        (("a/b",), ("k",)),  # not a stream name
        (tuple(f"p{i}" for i in range(1001)), tuple(str(i) for i in range(1001))),
    ],
)
def test_bad_definitions_are_refused(partitions: tuple[str, ...], keys: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        SuperStreamDefinition("/", "s", partitions, keys).check()


def test_partition_names_as_rabbitmq_streams_cli() -> None:
    assert partitions_for("inv", count=3) == (("inv-0", "inv-1", "inv-2"), ("0", "1", "2"))
    assert partitions_for("inv", binding_keys=["eu", "us"]) == (("inv-eu", "inv-us"), ("eu", "us"))
    for bad in ({}, {"count": 0}, {"count": 2, "binding_keys": ["a"]}, {"count": 1001}):
        with pytest.raises(ConfigError):
            partitions_for("inv", **bad)  # type: ignore[arg-type]
