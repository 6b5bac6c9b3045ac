"""A stream with data in both tiers for the corruption matrix, and the oracle.

The pristine stream is built once (local segments, fragments and manifest in a filesystem
object store, pointer in a SQLite MetaStore): its oldest segments exist only remotely, the
middle ones in both tiers, its tail only locally. Each example works on a copy, damages one
file, then restarts the stream the way the server does (recovery with remote repair, the
tierer's resolution) and reads everything back through the cross-tier reader.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from tierlog.errors import TierlogError
from tierlog.log.config import LogConfig
from tierlog.log.errors import DamagedSegmentError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.open_repairing import DamageReport, open_repairing
from tierlog.log.writer import StreamLog
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.strategies import ReadStrategy
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.catalog import Catalog
from tierlog.remote.encryption import Keyring, set_process_keyring
from tierlog.remote.key_index_build import index_stream
from tierlog.remote.key_lookup import lookup_key
from tierlog.remote.settings import StreamSettings
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.sqlite_meta_store import SqliteMetaStore
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.segment_repair import repair_from_remote
from tierlog.tiering.state import TieringConfig
from tierlog.tiering.tierer import StreamTierer

LOG = LogConfig(max_segment_bytes=6_000)
TIERING = TieringConfig(
    fragment_bytes=2 * 1024,
    max_fragment_age=0.05,
    max_uploads=2,
    debounce_count=2,
    debounce_seconds=0.01,
    retry_base=0.01,
    retry_max=0.05,
)
M = 2  # small fan-out: the manifest has branches


COLD = StreamSettings(compression="zstd", dictionary=True, encryption="aes-256-gcm")
"""The encrypted campaign stream's settings: its fragments, dictionaries, manifest,
key-index files and key-index manifest are all sealed."""
CAMPAIGN_KEYS = Keyring([("campaign", bytes(range(32)))])
KEY_WINDOW_MS = 5
ENCRYPTED_CAMPAIGN = "encrypted-tiered-stream"
"""The file kinds' ``campaign`` of the stream built with ``build(..., encrypted=True)``."""
LOOKUP_KEY = b"7/1"


def campaign_key(record: memoryview) -> bytes:
    """The campaign records' key: what precedes the first colon (``b"7/1"``)."""
    return bytes(record).partition(b":")[0]


@dataclass
class CampaignStream:
    root: str
    incarnation: str
    confirmed: list[tuple[int, bytes]] = field(default_factory=list)
    next_offset: int = 0
    encrypted: bool = False
    lookup_expected: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def stream_dir(self) -> str:
        return os.path.join(self.root, "streams", self.incarnation)

    @property
    def objects(self) -> str:
        return os.path.join(self.root, "objects")

    @property
    def meta_path(self) -> str:
        return os.path.join(self.root, "meta.db")

    def copy_to(self, root: str) -> CampaignStream:
        if os.path.exists(root):
            shutil.rmtree(root)
        shutil.copytree(self.root, root)
        return CampaignStream(
            root,
            self.incarnation,
            self.confirmed,
            self.next_offset,
            self.encrypted,
            self.lookup_expected,
        )

    def tierer(self, log: StreamLog, store: FsObjectStore, catalog: Catalog) -> StreamTierer:
        deletions = DeletionQueue(catalog.meta, grace_seconds=3600.0)
        if self.encrypted:
            set_process_keyring(CAMPAIGN_KEYS)
        return StreamTierer(
            log,
            store,
            catalog,
            deletions,
            epoch=max(1, log.max_epoch),
            config=TIERING,
            m=M,
            settings=(lambda: COLD) if self.encrypted else None,
        )

    def lookup(self, meta: SqliteMetaStore, store: FsObjectStore) -> list[tuple[int, bytes]]:
        """The encrypted stream's records with ``LOOKUP_KEY``, through its key index."""
        set_process_keyring(CAMPAIGN_KEYS)
        found = lookup_key(meta, store, "", "/", "matrix", LOOKUP_KEY, key_of=campaign_key)
        return found.records


def build(root: str, encrypted: bool = False) -> CampaignStream:
    """The pristine stream: remote-only head, both tiers in the middle, local-only tail."""
    os.makedirs(root)
    meta = SqliteMetaStore(os.path.join(root, "meta.db"))
    store = FsObjectStore(os.path.join(root, "objects"))
    catalog = Catalog(meta)
    record = catalog.create("/", "matrix", COLD if encrypted else None)
    log = StreamLog.create(
        os.path.join(root, "streams"), "/", "matrix", LOG, created_ns=record.created_ns
    )
    stream = CampaignStream(root, record.incarnation, encrypted=encrypted)
    tierer = stream.tierer(log, store, catalog)
    tierer.start()
    for i in range(60):
        bodies = [
            b"%d/%d:" % (i, j) + bytes([i % 251]) * (40 + (i * 13 + j) % 90) for j in range(5)
        ]
        log.append(bodies, producer="p", publishing_ids=list(range(i * 5 + 1, i * 5 + 6)))
        if i % 17 == 0:
            log.store_offset("c", i)
    assert tierer.flush(timeout=30)
    freed = tierer.apply_local_retention(max_bytes=2 * LOG.max_segment_bytes, max_age_seconds=None)
    assert freed, "the head must be remote-only"
    tierer.stop(flush=False)
    for i in range(60, 70):  # the tail: local only
        log.append(
            [b"tail-%d" % i] * 3, producer="p", publishing_ids=[i * 5 + 1, i * 5 + 2, i * 5 + 3]
        )
    stream.next_offset = log.next_offset
    log.close()
    if encrypted:  # its key index: sealed window files and a sealed key-index manifest
        index, built, _ = index_stream(
            meta, store, "", "/", "matrix", KEY_WINDOW_MS, lambda keys: None, campaign_key
        )
        assert built >= 1 and index.uid is not None
        stream.lookup_expected = stream.lookup(meta, store)
        assert stream.lookup_expected, "the lookup key must be indexed"
    stream.confirmed = read_all(stream)[0]
    meta.close()
    store.close()
    assert stream.confirmed and stream.confirmed[0][0] == 0
    return stream


@dataclass
class Outcome:
    records: list[tuple[int, bytes]]
    report: DamageReport
    error: TierlogError | None
    next_offset: int | None  # where a new append landed (None when refused)
    lookup: list[tuple[int, bytes]] | None = None  # the encrypted stream's key lookup


def read_all(
    stream: CampaignStream, append_after: bool = False
) -> tuple[list[tuple[int, bytes]], int | None]:
    meta = SqliteMetaStore(stream.meta_path)
    store = FsObjectStore(stream.objects)
    catalog = Catalog(meta)
    log = StreamLog.open(stream.stream_dir, LOG, adopt_disk_epoch=True)
    tierer = stream.tierer(log, store, catalog)
    try:
        tierer.start()
        return _read(log, tierer, append_after)
    finally:
        tierer.stop(flush=False)
        log.close()
        meta.close()
        store.close()


def _read(
    log: StreamLog, tierer: StreamTierer, append_after: bool
) -> tuple[list[tuple[int, bytes]], int | None]:
    with TieredReader(
        log, ManifestSource(tierer), OffsetSpec.first(), strategy=ReadStrategy.NOT_IN_DISK
    ) as reader:
        records = [(o, bytes(b)) for o, b in reader.records()]
    appended = log.append([b"after-restart"]).first_offset if append_after else None
    return records, appended


def restart_and_read(stream: CampaignStream) -> Outcome:
    """Restart as the server does: recovery (remote repair, else refuse and move aside),
    resolution, then one read of everything and one new append."""
    if stream.encrypted:
        set_process_keyring(CAMPAIGN_KEYS)
    meta = SqliteMetaStore(stream.meta_path)
    store = FsObjectStore(stream.objects)
    catalog = Catalog(meta)
    report = DamageReport()

    def repair(exc: DamagedSegmentError) -> bool:
        try:
            return repair_from_remote(catalog, store, "", exc) > 0
        except (TierlogError, OSError):
            return False

    log: StreamLog | None = None
    tierer: StreamTierer | None = None
    try:
        try:
            log = open_repairing(stream.stream_dir, LOG, repair, report)
            tierer = stream.tierer(log, store, catalog)
            tierer.start()
            records, appended = _read(log, tierer, append_after=True)
            found = stream.lookup(meta, store) if stream.encrypted else None
        except TierlogError as exc:
            return Outcome([], report, exc, None)
        return Outcome(records, report, None, appended, found)
    finally:
        if tierer is not None:
            tierer.stop(flush=False)
        if log is not None:
            log.close()
        meta.close()
        store.close()
