"""A bottomless log inside a Python program, without the server.

``BottomlessLog`` is the library surface ``tierlog`` exports: one stream on a local
directory (Osiris segment files) tiered to an object store, read back by offset or
timestamp as one log whichever tier holds the records. It composes the same parts the
server runs (``log.StreamLog``, ``tiering.StreamTierer``, ``read.TieredReader``) so a
program embedding it gets the server's formats and rules, not a second implementation:
its directory and bucket can later be served by ``tierlog serve`` with the same
metadata store.

What it leaves out on purpose: the stream protocol, replication, delayed delivery and
per-stream compression/encryption settings (fragments are written in the default
format); a process that needs them runs the server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from tierlog.errors import ConfigError
from tierlog.log.config import LogConfig
from tierlog.log.errors import LogClosedError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

Start = int | datetime | Literal["first", "last", "next"]
"""Where a read starts: an offset, a time (the first chunk written at or after it), or
one of the protocol's named positions."""

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Record:
    """One record read back: its offset, the time its chunk was written (ms since the
    epoch; every record of a chunk shares it) and its bytes as appended."""

    offset: int
    timestamp_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Appended:
    """What one append wrote: the offsets of its first and last record (None when a
    producer's publishing ids were all duplicates) and how many were dropped as such."""

    first_offset: int | None
    last_offset: int | None
    duplicates: int


class BottomlessLog:
    """One stream: appends go to the local log (durable when ``append`` returns) and are
    copied to the object store in fragments in the background; ``read`` crosses tiers.

    Open it with ``BottomlessLog.open``; close it (or use ``with``) to tier what is left
    and release the files. One process at a time may open a stream's directory.
    """

    def __init__(
        self,
        record: StreamRecord,
        log: StreamLog,
        tierer: StreamTierer,
        meta: MetaStore,
        store: ObjectStore,
        local_max_bytes: int | None,
    ) -> None:
        self.record = record
        self._log = log
        self._tierer = tierer
        self._meta = meta
        self._store = store
        self._manifest = ManifestSource(tierer)
        self._local_max_bytes = local_max_bytes
        self._lock = threading.Lock()  # the log has one writer: appends and local retention
        self._closed = False

    # -- opening ------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        object_store: str,
        name: str,
        *,
        vhost: str = "/",
        meta_store: str | None = None,
        prefix: str = "",
        segment_bytes: int = 500 * MIB,
        fragment_bytes: int = 64 * MIB,
        max_fragment_age_seconds: float = 60.0,
        local_max_bytes: int | None = None,
    ) -> BottomlessLog:
        """Open stream ``name`` under ``directory``, creating it if it does not exist.

        ``object_store``: a URI (``file:///abs/dir``, ``s3://bucket/prefix?endpoint=...``,
        see ``docs/library.md``). ``meta_store``: where the stream's catalog entry and
        manifest pointer live (default ``sqlite:///{directory}/meta.db``). With
        ``local_max_bytes`` the local log keeps about that many bytes of what the object
        store already holds (never anything it does not), freed on ``flush`` and
        ``free_local``.
        """
        root = os.path.abspath(os.fspath(directory))
        if local_max_bytes is not None and local_max_bytes < 0:
            raise ConfigError("local_max_bytes must be >= 0")
        config = TieringConfig(
            fragment_bytes=fragment_bytes,
            max_fragment_age=max_fragment_age_seconds,
            segment_bytes=segment_bytes,
        )
        log_config = LogConfig(max_segment_bytes=segment_bytes)
        os.makedirs(root, exist_ok=True)
        meta = open_meta_store(meta_store or f"sqlite://{os.path.join(root, 'meta.db')}")
        store: ObjectStore | None = None
        log: StreamLog | None = None
        try:
            store = open_object_store(object_store)
            catalog = Catalog(meta)
            record = catalog.get(vhost, name)
            if record is None:
                record = catalog.create(vhost, name)
            stream_dir = os.path.join(root, record.incarnation)
            if os.path.isdir(stream_dir):
                log = StreamLog.open(stream_dir, log_config)
            else:
                log = StreamLog.create(root, vhost, name, log_config, record.created_ns)
            tierer = StreamTierer(
                log, store, catalog, DeletionQueue(meta), prefix=prefix, config=config
            )
            tierer.start()
        except BaseException:
            if log is not None:
                log.close()
            if store is not None:
                store.close()
            meta.close()
            raise
        return cls(record, log, tierer, meta, store, local_max_bytes)

    # -- writing ------------------------------------------------------------------------
    def append(
        self,
        bodies: Sequence[bytes],
        *,
        producer: str | None = None,
        publishing_ids: Sequence[int] | None = None,
    ) -> Appended:
        """Append ``bodies`` as one chunk (more if it exceeds the chunk limit), durable on
        disk when this returns. With ``producer`` and one publishing id per body, ids not
        above the producer's last are dropped as duplicates (resends after a crash)."""
        self._check_open()
        if not bodies:
            raise ValueError("append needs at least one record")
        with self._lock:
            result = self._log.append(list(bodies), producer, publishing_ids)
        return Appended(result.first_offset, result.last_offset, len(result.dropped))

    def flush(self, timeout: float = 60.0) -> bool:
        """Copy everything appended so far to the object store now; True once the
        manifest commit names it. Frees local segments past ``local_max_bytes``."""
        self._check_open()
        done = self._tierer.flush(timeout)
        if self._local_max_bytes is not None:
            self.free_local()
        return done

    def free_local(self) -> list[int]:
        """Delete the oldest local segments the object store holds, keeping about
        ``local_max_bytes`` (0 when it was not given); the first offsets freed."""
        self._check_open()
        with self._lock:
            return self._tierer.apply_local_retention(self._local_max_bytes or 0, None)

    # -- reading ------------------------------------------------------------------------
    def read(self, start: Start = "first", count: int | None = None) -> Iterator[Record]:
        """Records from ``start`` up to what is appended now (it does not wait for more),
        from whichever tier holds them; at most ``count``. An offset older than anything
        either tier keeps raises ``OffsetOvertakenError`` rather than skipping."""
        self._check_open()
        spec = _spec(start)
        left = count
        with TieredReader(self._log, self._manifest, spec) as reader:
            for chunk in reader.chunks():
                timestamp = chunk.header.timestamp
                for offset, body in chunk.records():
                    if left is not None:
                        if left <= 0:
                            return
                        left -= 1
                    yield Record(offset, timestamp, bytes(body))

    # -- state ----------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        """The oldest offset either tier holds."""
        tree = self._tierer.committed_tree()
        local_first = self._log.first_offset
        return local_first if tree.is_empty else min(tree.first_offset, local_first)

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._log.next_offset

    @property
    def tiered_offset(self) -> int:
        """Records below this offset are in the object store."""
        return self._tierer.durable_next

    def close(self, timeout: float = 60.0) -> None:
        """Tier what is left (within ``timeout``), stop the background work, release."""
        if self._closed:
            return
        self._closed = True
        try:
            self._tierer.stop(flush=True, timeout=timeout)
        finally:
            self._log.close()
            self._store.close()
            self._meta.close()

    def __enter__(self) -> BottomlessLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"stream {self.record.name!r} is closed")


def _spec(start: Start) -> OffsetSpec:
    if isinstance(start, bool):
        raise TypeError("start must be an offset, a datetime or first/last/next")
    if isinstance(start, int):
        if start < 0:
            raise ValueError("an offset is >= 0")
        return OffsetSpec.offset(start)
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise ValueError("give the start time with its time zone (e.g. UTC)")
        return OffsetSpec.timestamp(int(start.timestamp() * 1000))
    named = {"first": OffsetSpec.first, "last": OffsetSpec.last, "next": OffsetSpec.next}
    if start not in named:
        raise ValueError(f"start {start!r}: expected an offset, a datetime or first/last/next")
    return named[start]()
