"""Object and metadata stores opened once per Python process and shared by its tasks.

Spark reuses Python workers across tasks; opening an S3 client (and its connection pool) or
an SQLite connection per task would cost more than reading a small fragment. Read-only
users skip the S3 create-only probe (it writes), and a path-based store that does not
exist is refused rather than created empty (``tierlog.spark.stores``). Stores are never
pickled: readers carry URIs and look the stores up here on whichever process they run.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from tierlog.remote.catalog import Catalog
from tierlog.spark.stores import require_existing
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store

_lock = threading.Lock()
_objects: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStore] = {}
_metas: dict[str, MetaStore] = {}


def object_store(uri: str, settings: tuple[tuple[str, str], ...] = ()) -> ObjectStore:
    """The shared store for ``uri`` (``settings`` are extra S3 settings, as strings)."""
    key = (uri, settings)
    with _lock:
        store = _objects.get(key)
        if store is None:
            require_existing(uri, "objectStore")
            options: dict[str, object] = dict(settings)
            if urlsplit(uri).scheme == "s3":
                options["probe"] = False
            store = open_object_store(uri, **options)
            _objects[key] = store
        return store


def meta_store(uri: str) -> MetaStore:
    with _lock:
        store = _metas.get(uri)
        if store is None:
            require_existing(uri, "metaStore")
            store = open_meta_store(uri)
            _metas[uri] = store
        return store


def catalog(uri: str) -> Catalog:
    return Catalog(meta_store(uri))


def close_all() -> None:
    """Close every shared store (tests and benches; workers just exit)."""
    with _lock:
        for store in _objects.values():
            store.close()
        for meta in _metas.values():
            meta.close()
        _objects.clear()
        _metas.clear()
