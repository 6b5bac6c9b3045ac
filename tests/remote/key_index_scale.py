"""The key-index scale run, shared by the bounded CI test and ``scripts/key_index_scale.py``.

A stream of ``records`` records is written straight into the remote tier as v1 fragments
(seeded, documented generator: record ``i`` is the 12-byte key ``k{i:011d}``, so its key is
the record itself; ``per_chunk`` records per chunk stamped 10 ms apart, ``per_fragment``
chunks per fragment) and committed to the stream manifest; every complete window of
``window_ms`` (chosen for about ``windows`` windows) is indexed in this process and committed
to the key-index manifest. Then keys drawn with a seeded generator are looked up through a
fresh lookup each (cold: no fragment index, manifest or file cached), with every GET counted
per window file and per record.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierlog.formats.chunk import decode_header, encode_chunk
from tierlog.formats.fragment import FragmentChunkInfo, FragmentPlacement, encode_fragment
from tierlog.remote.catalog import Catalog
from tierlog.remote.fragments import FragmentEntry, RemoteStream
from tierlog.remote.key_index_build import index_stream
from tierlog.remote.key_lookup import lookup_key
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.deletion import DeletionQueue

CHUNK_STEP_MS = 10
BASE_TS = 1_700_000_000_000


def record_key(i: int) -> bytes:
    return b"k%011d" % i


def key_is_record(record: memoryview) -> bytes:
    """The scale stream's record key: the record itself."""
    return bytes(record)


class CountingStore:
    """Delegates to a real store and counts GETs by object key (a lookup's cost)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gets: Counter[str] = Counter()
        self._lock = threading.Lock()  # lookups read windows from several threads

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        with self._lock:
            self.gets[key] += 1
        return self.inner.get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        with self._lock:
            self.gets[key] += 1
        return self.inner.get_suffix(key, length)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class ScaleResult:
    records: int
    windows: int
    fragments: int
    write_seconds: float
    index_seconds: float
    lookups: int
    lookup_seconds: float
    gets_per_window: float  # GETs per key per window searched, record GETs included
    gets_in_hit_window: float  # mean in the window holding the key, record included
    max_gets_in_a_window: int
    manifest_gets_per_lookup: float
    misses: list[bytes] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"records={self.records} windows={self.windows} fragments={self.fragments} "
            f"lookups={self.lookups} gets_per_key_per_window={self.gets_per_window:.2f} "
            f"gets_in_hit_window={self.gets_in_hit_window:.2f} "
            f"max_window_gets={self.max_gets_in_a_window} "
            f"manifest_gets_per_lookup={self.manifest_gets_per_lookup:.2f} "
            f"write_s={self.write_seconds:.1f} index_s={self.index_seconds:.1f} "
            f"lookup_ms={1000 * self.lookup_seconds / max(1, self.lookups):.1f}"
        )


def write_stream(
    store: ObjectStore,
    meta: MetaStore,
    prefix: str,
    name: str,
    records: int,
    per_chunk: int,
    per_fragment: int,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[str, int]:
    """Write the stream's fragments and commit them; ``(incarnation, fragments)``."""
    catalog = Catalog(meta)
    record = catalog.create("/", name)
    remote = RemoteStream(store, prefix, record.incarnation)
    committer = ManifestCommitter(remote, catalog, DeletionQueue(meta, 0.0), epoch=1)
    committer.load()
    chunk_no = 0
    offset = 0
    fragments = 0
    pending: list[FragmentEntry] = []
    while offset < records:
        first = offset
        chunks: list[bytes] = []
        infos: list[FragmentChunkInfo] = []
        for _ in range(per_fragment):
            if offset >= records:
                break
            n = min(per_chunk, records - offset)
            bodies = [record_key(i) for i in range(offset, offset + n)]
            stamp = BASE_TS + chunk_no * CHUNK_STEP_MS
            chunk = encode_chunk(0, offset, 1, stamp, bodies)
            crc = decode_header(chunk).data_crc
            chunks.append(chunk)
            infos.append(FragmentChunkInfo(offset, stamp, 1, len(chunk), n, crc, 0, n))
            offset += n
            chunk_no += 1
        parts, trailer = encode_fragment(FragmentPlacement(fragments, 0, 0), chunks, infos)
        key = remote.fragment_key(first)
        store.put(key, b"".join(parts))
        pending.append(
            FragmentEntry(
                key,
                trailer.first_offset,
                trailer.next_offset,
                trailer.min_timestamp,
                trailer.max_timestamp,
                trailer.data_size,
                trailer.chunk_count,
            )
        )
        fragments += 1
        if len(pending) >= 64:
            committer.commit(pending)
            pending = []
            say(f"written {offset} records")
    if pending:
        committer.commit(pending)
    return record.incarnation, fragments


def run_scale(
    store: ObjectStore,
    meta: MetaStore,
    prefix: str,
    *,
    records: int,
    windows: int = 55,
    per_chunk: int = 1000,
    per_fragment: int = 20,
    lookups: int = 20,
    seed: int = 20,
    say: Callable[[str], None] = lambda _: None,
) -> ScaleResult:
    started = time.perf_counter()
    name = f"scale-{seed}-{records}"
    _, fragments = write_stream(store, meta, prefix, name, records, per_chunk, per_fragment, say)
    written = time.perf_counter()
    chunks = -(-records // per_chunk)
    window_ms = max(CHUNK_STEP_MS, chunks * CHUNK_STEP_MS // windows)
    committed, built, _ = index_stream(
        meta, store, prefix, "/", name, window_ms, lambda keys: None, key_is_record
    )
    indexed = time.perf_counter()
    say(f"indexed {built} windows of {window_ms} ms")
    rng = random.Random(seed)
    indexed_until = committed.manifest.windows[-1].end
    last_indexed = (indexed_until - BASE_TS) // CHUNK_STEP_MS * per_chunk  # first not indexed
    per_window: list[float] = []
    in_hit: list[int] = []
    manifest_gets = 0
    misses: list[bytes] = []
    spent = 0.0
    for _ in range(lookups):
        i = rng.randrange(min(records, last_indexed))
        counting = CountingStore(store)
        t0 = time.perf_counter()
        found = lookup_key(
            meta,
            counting,  # type: ignore[arg-type]
            prefix,
            "/",
            name,
            record_key(i),
            key_of=key_is_record,
        )
        spent += time.perf_counter() - t0
        if found.records != [(i, record_key(i))]:
            misses.append(record_key(i))
        manifest_gets += sum(n for k, n in counting.gets.items() if k.endswith(".kim"))
        record_gets = sum(n for k, n in counting.gets.items() if k.endswith(".fragment"))
        window_gets = [n for k, n in counting.gets.items() if k.endswith(".kidx")]
        per_window.append((sum(window_gets) + record_gets) / found.windows)
        in_hit.append(max(window_gets) + record_gets)  # the window holding the key
    return ScaleResult(
        records=records,
        windows=len(committed.manifest.windows),
        fragments=fragments,
        write_seconds=written - started,
        index_seconds=indexed - written,
        lookups=lookups,
        lookup_seconds=spent,
        gets_per_window=sum(per_window) / max(1, len(per_window)),
        gets_in_hit_window=sum(in_hit) / max(1, len(in_hit)),
        max_gets_in_a_window=max(in_hit),
        manifest_gets_per_lookup=manifest_gets / max(1, lookups),
        misses=misses,
    )
