"""Executor side: read a ``ReadTask``'s fragments and decode them to Arrow record batches.

One GET of each whole fragment into one buffer (the next fragment is fetched on a
background thread while the current one decodes: S3 latency overlaps the decode), then
``fragment_to_record_batch`` (vectorised, no per-record Python) with row filters only when
the bounds cut into the fragment, then a cast to the exact Arrow schema Spark expects
(timestamps as UTC microseconds).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa

from tierlog.read.errors import FragmentExpiredError
from tierlog.remote.dictionaries import DictionaryCache, as_v1_fragment
from tierlog.remote.fragments import FragmentEntry
from tierlog.remote.segments import entry_runs, read_segment_index, run_chunks
from tierlog.spark.arrow_batch import chunks_to_record_batch, fragment_to_record_batch
from tierlog.spark.connections import object_store
from tierlog.spark.planning import ReadTask
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """What a task needs besides its fragments (picklable, shipped with the reader)."""

    object_store: str
    store_settings: tuple[tuple[str, str], ...]
    include_amqp: bool
    skip_expired: bool
    verify_crc: bool
    trace_dir: str | None


def read_task(
    task: ReadTask, settings: ReadSettings, schema: pa.Schema | None = None
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``task``'s rows, one per fragment (cast to ``schema`` if given)."""
    store = object_store(settings.object_store, settings.store_settings)
    fragments = task.fragments
    if not fragments:
        return
    if fragments[0].is_segment:  # planning gives an offloaded segment a task of its own
        for batch in _read_segment(store, task, fragments[0], settings):
            if batch.num_rows:
                yield batch if schema is None else batch.cast(schema)
        return
    dictionaries = DictionaryCache(store)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierlog-fetch") as pool:
        fetch = partial(_fetch, store, dictionaries=dictionaries, sealed=task.sealed)
        pending: Future[memoryview | None] = pool.submit(fetch, fragments[0])
        for i, fragment in enumerate(fragments):
            data = pending.result()
            if i + 1 < len(fragments):
                pending = pool.submit(fetch, fragments[i + 1])
            if data is None:
                if settings.skip_expired:
                    continue
                raise _expired(task, fragment)
            if settings.trace_dir:
                _trace(settings.trace_dir, task.incarnation, fragment)
            batch = _decode(data, task, fragment, settings)
            if batch.num_rows:
                yield batch if schema is None else batch.cast(schema)


def _expired(task: ReadTask, entry: FragmentEntry) -> FragmentExpiredError:
    """A fragment or segment the plan named is gone: say how to go on."""
    return FragmentExpiredError(
        entry.key,
        f"stream {task.stream!r}: fragment [{entry.first_offset}, {entry.next_offset}) "
        f"({entry.key}) was removed after the read was planned (retention); re-run the "
        "query, or read with option onExpired=skip to skip removed fragments",
    )


def _read_segment(
    store: ObjectStore, task: ReadTask, segment: FragmentEntry, settings: ReadSettings
) -> Iterator[pa.RecordBatch]:
    """An offloaded segment, one ranged GET and one batch per block (so a task holds one
    block, not the segment); blocks outside the bounds are not fetched."""
    try:
        index = read_segment_index(store, segment, require_sealed=task.sealed)
    except NotFoundError:
        if settings.skip_expired:
            return
        raise _expired(task, segment) from None
    if settings.trace_dir:
        _trace(settings.trace_dir, task.incarnation, segment)
    records = index.records
    ids = records["chunk_id"].astype(np.int64)
    stamps = records["timestamp"].astype(np.int64)
    positions = records["position"].astype(np.int64)
    sizes = records["size"].astype(np.int64)
    b = task.bounds
    for lo, hi, end in entry_runs(index, 0):
        block_next = int(ids[hi]) if hi < len(ids) else segment.next_offset
        if (b.min_offset is not None and block_next <= b.min_offset) or (
            b.max_offset is not None and int(ids[lo]) > b.max_offset
        ):
            continue
        if (b.min_ts is not None and int(stamps[hi - 1]) < b.min_ts) or (
            b.max_ts is not None and int(stamps[lo]) > b.max_ts
        ):
            continue
        start = int(index.stored_starts[lo])
        try:
            data = store.get_view(segment.key, start, end)
        except NotFoundError:
            if settings.skip_expired:
                return
            raise _expired(task, segment) from None
        if index.entries.sealed:  # frames opened (and their entry headers checked) here
            data = memoryview(b"".join(run_chunks(index, lo, hi, data)))
            start = 0
            at = np.concatenate(([0], np.cumsum(sizes[lo:hi])[:-1])).astype(np.int64)
        else:
            at = positions[lo:hi] - start
        yield chunks_to_record_batch(
            data,
            task.stream,
            positions=at,
            sizes=sizes[lo:hi],
            include_amqp=settings.include_amqp,
            min_offset=b.min_offset,
            max_offset=b.max_offset,
            min_ts=b.min_ts,
            max_ts=b.max_ts,
            verify_crc=settings.verify_crc,
        )


def _fetch(
    store: ObjectStore,
    fragment: FragmentEntry,
    *,
    dictionaries: DictionaryCache,
    sealed: bool,
) -> memoryview | None:
    """The whole fragment with its chunks in the clear (a compressed or encrypted v2
    fragment is decoded here, on the fetch thread); None when it expired. ``sealed``: the
    stream's manifest is sealed, so a plaintext fragment is refused."""
    try:
        data = store.get_view(fragment.key)
    except NotFoundError:
        return None
    plain = as_v1_fragment(store, fragment.key, data, dictionaries, require_encrypted=sealed)
    return memoryview(plain).cast("B")


def _decode(
    data: memoryview, task: ReadTask, fragment: FragmentEntry, settings: ReadSettings
) -> pa.RecordBatch:
    b = task.bounds
    if b.covers(fragment):
        return fragment_to_record_batch(
            data, task.stream, include_amqp=settings.include_amqp, verify_crc=settings.verify_crc
        )
    return fragment_to_record_batch(
        data,
        task.stream,
        include_amqp=settings.include_amqp,
        min_offset=b.min_offset,
        max_offset=b.max_offset,
        min_ts=b.min_ts,
        max_ts=b.max_ts,
        verify_crc=settings.verify_crc,
    )


def _trace(trace_dir: str, incarnation: str, fragment: FragmentEntry) -> None:
    """Testing aid: one marker file per fragment read (works across worker processes)."""
    name = f"{incarnation}.{fragment.first_offset:020d}.{uuid.uuid4().hex[:12]}"
    with open(os.path.join(trace_dir, name), "wb"):
        pass


def traced_reads(trace_dir: str) -> list[tuple[str, int]]:
    """(incarnation, fragment first offset) of every traced read, sorted."""
    out = []
    for name in os.listdir(trace_dir):
        incarnation, offset, _ = name.rsplit(".", 2)
        out.append((incarnation, int(offset)))
    return sorted(out)
