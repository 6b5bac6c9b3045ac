"""Finding a stream's records by key through its key index: the Python entry point behind
``tierlog lookup`` and the admin API's ``GET /api/streams/{s}/messages?key=``.

Reads the key-index manifest once, then for each window overlapping the time range two
ranged GETs of the window file (slot entry, the slot's items; up to ``WINDOW_READERS``
windows at a time) and one per matching record
(its chunk's frame; a v2 fragment's index once more, shared by the windows of one lookup).
Records are returned as they were published, in offset order; only committed windows are
searched (records newer than the last indexed window are not found until the index job
has run).
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from tierlog.errors import ConfigError
from tierlog.formats.fragment import FragmentIndex
from tierlog.formats.key_index_manifest import WindowEntry
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.key_index_files import (
    KeyOf,
    file_of_window,
    key_of_setting,
    read_candidates,
    window_candidates,
)
from tierlog.remote.key_index_manifest import KeyIndexManifestStore
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore

WINDOW_READERS = 8
"""Window files whose slots are read at the same time by one lookup."""


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """The records found and what the lookup cost."""

    records: list[tuple[int, bytes]]
    windows: int  # window files searched

    def to_json(self) -> list[dict[str, Any]]:
        """The records as ``tierlog dump`` prints them: offset and base64 record."""
        return [
            {"offset": offset, "body": base64.b64encode(record).decode("ascii")}
            for offset, record in self.records
        ]


def parse_timestamp(text: str, what: str) -> int:
    """A bound of a lookup's time range: milliseconds since the epoch, or an ISO-8601
    date-time (UTC unless it names a zone)."""
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"{what} must be milliseconds since the epoch or an ISO-8601 time, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def stream_hash_name(record: StreamRecord) -> str:
    """The stream name keys are hashed with (as the index job writes them)."""
    return record.name if record.vhost == "/" else f"{record.vhost}/{record.name}"


def lookup_key(
    meta: MetaStore,
    store: ObjectStore,
    prefix: str,
    vhost: str,
    stream: str,
    key: bytes,
    *,
    from_timestamp: int | None = None,
    to_timestamp: int | None = None,
    key_of: KeyOf | None = None,
) -> KeyLookup:
    """Every indexed record of ``stream`` whose key is ``key`` (chunk timestamps, ms, in
    ``[from_timestamp, to_timestamp]`` when given), each window searched with the record
    key it was built on (``key_of`` overrides it). StreamNotFoundError for an unknown
    stream; KeyIndexManifestError / CorruptFragmentError when the index or a record is
    damaged (never a wrong record)."""
    record = Catalog(meta).require(vhost, stream)
    index = KeyIndexManifestStore(
        meta, store, prefix, record.incarnation, settings=lambda: record.settings
    ).read()
    windows = [
        w
        for w in index.manifest.windows
        if (from_timestamp is None or w.end > from_timestamp)
        and (to_timestamp is None or w.start <= to_timestamp)
    ]

    def candidates(window: WindowEntry) -> np.ndarray:
        return window_candidates(
            store,
            stream_hash_name(record),
            file_of_window(prefix, record.incarnation, window),
            key,
            from_timestamp,
            to_timestamp,
        )

    # the windows' slot reads are independent: they go in parallel (the GETs are the same)
    with ThreadPoolExecutor(min(WINDOW_READERS, max(1, len(windows)))) as pool:
        per_window = list(pool.map(candidates, windows))
    fragment_indexes: dict[str, FragmentIndex] = {}
    found: list[tuple[int, bytes]] = []
    for window, items in zip(windows, per_window, strict=True):
        if len(items):
            found += read_candidates(
                store,
                prefix,
                record.incarnation,
                items,
                key,
                key_of if key_of is not None else key_of_setting(window.key),
                fragment_indexes,
            )
    searched = len(windows)
    return KeyLookup(sorted(found), searched)
