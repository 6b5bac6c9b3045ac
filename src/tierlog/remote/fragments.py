"""Fragment objects of one stream's remote tier: the one entry type and metadata reads.

``FragmentEntry`` is what every user of the remote tier knows about one fragment object:
its key and the range, timestamps and sizes its manifest entry (and its trailer) record.
The tierer commits them, the manifest walker yields them, Spark plans and jobs ship them.
A leaf of the manifest may also be a whole offloaded segment (``is_segment``): its key is
then the segment's data object, ``index_key`` its index object, ``uid`` the offload
attempt's UUID and ``data_size`` the segment file's size.
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass

from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import TRAILER_SIZE, FragmentIndex, FragmentTrailer
from tierlog.formats.fragment_v2 import (
    decode_index,
    decode_trailer,
    index_region,
    index_tail_guess,
)
from tierlog.formats.manifest import ENTRY_FRAGMENT, ENTRY_SEGMENT, ZERO_UID
from tierlog.remote import keys
from tierlog.remote.encryption import opener_for
from tierlog.remote.errors import CorruptFragmentError
from tierlog.storage.errors import InvalidKeyError, NotFoundError
from tierlog.storage.object_store import ObjectStore


@dataclass(frozen=True, slots=True)
class FragmentEntry:
    """One fragment object: its key, offsets ``[first, next)``, chunk timestamps (ms),
    bytes of chunk data and chunk count."""

    key: str
    first_offset: int
    next_offset: int
    min_timestamp: int
    max_timestamp: int
    data_size: int
    chunk_count: int
    entry_kind: int = ENTRY_FRAGMENT
    uid: bytes = ZERO_UID

    @property
    def is_segment(self) -> bool:
        """A whole offloaded segment (data + index object) rather than a fragment."""
        return self.entry_kind == ENTRY_SEGMENT

    @property
    def uuid(self) -> uuid_module.UUID:
        """The offload attempt's UUID (segments only)."""
        return uuid_module.UUID(bytes=self.uid)

    @property
    def object_keys(self) -> tuple[str, ...]:
        """Every object this entry names: the fragment, or a segment's data and index."""
        return (self.key, self.index_key) if self.is_segment else (self.key,)

    @property
    def index_key(self) -> str:
        """The index object of an offloaded segment (ValueError for a fragment)."""
        if not self.is_segment:
            raise ValueError(f"{self.key} is a fragment: it has no index object")
        return self.key[: -len(".data")] + ".index"


def segment_entry(
    prefix: str,
    stream_dir: str,
    first_offset: int,
    next_offset: int,
    uuid: uuid_module.UUID,
    *,
    min_timestamp: int,
    max_timestamp: int,
    segment_size: int,
    chunk_count: int,
) -> FragmentEntry:
    """The manifest leaf of an offloaded segment."""
    return FragmentEntry(
        keys.segment_data_key(prefix, stream_dir, first_offset, uuid),
        first_offset,
        next_offset,
        min_timestamp,
        max_timestamp,
        segment_size,
        chunk_count,
        ENTRY_SEGMENT,
        uuid.bytes,
    )


@dataclass(frozen=True, slots=True)
class RemoteFragment:
    """A fragment's metadata as read back from its object: trailer and chunk index."""

    key: str
    trailer: FragmentTrailer
    index: FragmentIndex

    def entry(self) -> FragmentEntry:
        t = self.trailer
        return FragmentEntry(
            key=self.key,
            first_offset=t.first_offset,
            next_offset=t.next_offset,
            min_timestamp=t.min_timestamp,
            max_timestamp=t.max_timestamp,
            data_size=t.data_size,
            chunk_count=t.chunk_count,
        )


def read_known_fragment(store: ObjectStore, entry: FragmentEntry) -> RemoteFragment:
    """Trailer and index of a fragment its manifest entry describes, checked against the
    entry: one suffix GET sized from the entry's chunk count holds both for v1 fragments and
    for v2 fragments without bloom filters; otherwise one more ranged GET fetches the rest.

    Raises NotFoundError when the object is gone, CorruptFragmentError when its bytes are
    bad or contradict the entry."""
    key = entry.key
    tail = store.get_suffix(key, index_tail_guess(entry.chunk_count))
    try:
        trailer = decode_trailer(tail)
        start, end = index_region(trailer)
        tail_start = trailer.total_size - len(tail)
        whole = len(tail) < index_tail_guess(entry.chunk_count)  # the object is shorter
        if tail_start < 0 or (whole and tail_start) or end + TRAILER_SIZE != trailer.total_size:
            raise CorruptFragmentError(f"{key}: trailer sizes do not match the object")
        if start >= tail_start:
            region = memoryview(tail)[start - tail_start : end - tail_start]
        else:
            head = store.get(key, start, tail_start)
            if len(head) != tail_start - start:
                raise CorruptFragmentError(f"{key}: index read gave {len(head)} bytes")
            region = memoryview(head + tail[: end - tail_start])
        index = decode_index(region, trailer, opener_for(key))
    except FormatError as exc:
        raise CorruptFragmentError(f"{key}: {exc}") from exc
    mismatch = trailer_mismatch(entry, trailer)
    if mismatch:
        raise CorruptFragmentError(f"{key}: trailer does not match its manifest entry: {mismatch}")
    return RemoteFragment(key, trailer, index)


def trailer_mismatch(entry: FragmentEntry, trailer: FragmentTrailer) -> str:
    """How a fragment's trailer contradicts its manifest entry ("" when it does not)."""
    pairs = (
        ("first_offset", trailer.first_offset, entry.first_offset),
        ("next_offset", trailer.next_offset, entry.next_offset),
        ("min_ts", trailer.min_timestamp, entry.min_timestamp),
        ("max_ts", trailer.max_timestamp, entry.max_timestamp),
        ("data_size", trailer.data_size, entry.data_size),
        ("chunks", trailer.chunk_count, entry.chunk_count),
    )
    return "; ".join(f"{n}: trailer {a} != manifest {e}" for n, a, e in pairs if a != e)


class RemoteStream:
    """Key naming and metadata reads for one stream incarnation."""

    def __init__(self, store: ObjectStore, prefix: str, stream_dir: str) -> None:
        self.store = store
        self.prefix = prefix
        self.stream_dir = stream_dir

    def fragment_key(self, first_offset: int) -> str:
        return keys.fragment_key(self.prefix, self.stream_dir, first_offset)

    def root_key(self, uid: bytes) -> str:
        return keys.root_key(self.prefix, self.stream_dir, uid)

    def load(self, key: str) -> bytes:
        return self.store.get(key)

    def read_fragment(self, first_offset: int) -> RemoteFragment | None:
        """Trailer (one suffix GET) and index (one ranged GET); None if absent.

        Raises CorruptFragmentError when the object is not a valid fragment (bad CRC,
        truncated) or its trailer names another first offset than its key.
        """
        key = self.fragment_key(first_offset)
        try:
            tail = self.store.get_suffix(key, TRAILER_SIZE)
        except NotFoundError:
            return None
        try:
            trailer = decode_trailer(tail)
            start, end = index_region(trailer)
            index = decode_index(self.store.get(key, start, end), trailer, opener_for(key))
        except FormatError as exc:
            raise CorruptFragmentError(f"{key}: {exc}") from exc
        if trailer.first_offset != first_offset:
            raise CorruptFragmentError(f"{key}: trailer says first offset {trailer.first_offset}")
        return RemoteFragment(key, trailer, index)

    def uncommitted_offsets(self, start: int, limit: int) -> list[int]:
        """First offsets of up to ``limit`` fragment objects at or after ``start``, in
        offset order, as one listing shows them (a listing may miss recent objects)."""
        after = self.fragment_key(start - 1) if start > 0 else None
        out: list[int] = []
        for meta in self.store.list(keys.data_prefix(self.prefix, self.stream_dir), after):
            try:
                parsed = keys.parse_key(meta.key, self.prefix)
            except InvalidKeyError:
                continue  # not ours: never adopted, never in the way
            if isinstance(parsed, keys.FragmentKey) and parsed.first_offset >= start:
                out.append(parsed.first_offset)
                if len(out) >= limit:
                    break
        return out
