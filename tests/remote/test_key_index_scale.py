"""Key lookup at scale on SeaweedFS with a cold cache: a stream over at least 50 windows,
GETs per key per window counted (record included). CI=true runs a bounded profile (about
200k records, < 30 s); ``scripts/key_index_scale.py`` runs the 10 M-record one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.plugins.seaweed import SeaweedServer, _open_s3
from tests.remote.key_index_scale import run_scale
from tierlog.storage.sqlite_meta_store import SqliteMetaStore

RECORDS = 200_000 if os.environ.get("CI") == "true" else 400_000


@pytest.mark.s3
def test_lookup_gets_per_key_per_window_at_scale(seaweed: SeaweedServer, tmp_path: Path) -> None:
    store = _open_s3(seaweed, f"scale/{uuid.uuid4().hex}")
    meta = SqliteMetaStore(str(tmp_path / "meta.db"))
    try:
        result = run_scale(store, meta, "", records=RECORDS, windows=60, per_chunk=1000, lookups=12)
        print(result.line())
        assert result.windows >= 50
        assert result.misses == []  # every key found, exactly its one record
        assert result.manifest_gets_per_lookup == 1  # once per lookup, not per window
        assert result.max_gets_in_a_window <= 3  # slot entry + slot items + the record
        assert result.gets_per_window <= 3
    finally:
        meta.close()
        store.close()
