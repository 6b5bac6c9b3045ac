"""The `world` fixture: one stream with a catalog entry, a local log and tierers on a
real object store (filesystem and SeaweedFS) and a SQLite MetaStore."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.object_store import FaultyObjectStore
from tierlog.formats.fragment import decode_index, decode_trailer, index_range
from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

SMALL = TieringConfig(
    fragment_bytes=8 * 1024,
    max_fragment_age=0.2,
    max_uploads=3,
    debounce_count=3,
    debounce_seconds=0.05,
    retry_base=0.01,
    retry_max=0.05,
)
LOG = LogConfig(max_segment_bytes=40_000)


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    store = SqliteMetaStore(str(tmp_path / "meta.db"))
    yield store
    store.close()


class World:
    """One stream: catalog entry, local log, and a way to start tierers on it."""

    def __init__(self, tmp_path: Path, store: ObjectStore, meta: MetaStore) -> None:
        self.data_dir = str(tmp_path / "data")
        self.store = FaultyObjectStore(store)
        self.meta = meta
        self.catalog = Catalog(meta)
        self.deletions = DeletionQueue(meta, grace_seconds=0.0)
        self.record: StreamRecord = self.catalog.create("/", "orders")
        self.log = StreamLog.create(
            self.data_dir, "/", "orders", LOG, created_ns=self.record.created_ns
        )
        assert os.path.basename(self.log.stream_dir) == self.record.incarnation
        self.tierers: list[StreamTierer] = []

    def tierer(self, epoch: int = 1, meta: MetaStore | None = None) -> StreamTierer:
        catalog = Catalog(meta) if meta is not None else self.catalog
        t = StreamTierer(
            self.log, self.store, catalog, self.deletions, epoch=epoch, config=SMALL, m=4
        )
        self.tierers.append(t)
        return t

    def append(self, batches: int, per_batch: int = 20, size: int = 100) -> None:
        for b in range(batches):
            self.log.append([os.urandom(size) for _ in range(per_batch)])
            del b

    def local_chunks(self) -> dict[int, bytes]:
        with LogReader(self.log, OffsetSpec.first(), user_only=False) as reader:
            return {c.header.chunk_id: bytes(c.raw or b"") for c in reader.chunks()}

    def remote_chunks(self, tierer: StreamTierer) -> dict[int, bytes]:
        tree: ManifestTree = tierer.committer.tree
        out: dict[int, bytes] = {}
        for loc in tree.iter_fragments(tierer.remote.load):
            data = self.store.get(loc.key)
            trailer = decode_trailer(data)
            start, end = index_range(trailer.data_size, trailer.chunk_count)
            index = decode_index(data[start:end], trailer)
            for i in range(len(index)):
                info, pos = index.chunk(i)
                assert info.chunk_id not in out, "a chunk is in two fragments"
                out[info.chunk_id] = data[pos : pos + info.size]
        return out

    def close(self) -> None:
        for t in self.tierers:
            t.stop(flush=False, timeout=5)
        self.log.close()


@pytest.fixture
def world(tmp_path: Path, object_store: ObjectStore, meta: MetaStore) -> Iterator[World]:
    w = World(tmp_path, object_store, meta)
    yield w
    w.close()
