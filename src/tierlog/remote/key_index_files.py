"""Key index files of a stream in the object store: build one per time window from the
stream's fragments, and look a key up.

Key: ``{prefix}/stream/{stream-dir}/kindex/{window-start:020d}.{slots}.{items}.kidx``. The
slot and item counts are in the key, so a lookup needs no header read: one ranged GET of the
slot entry, one of the slot's items, then one ranged GET per matching record (its chunk's
frame; a v2 fragment also needs its index, one more GET unless cached). Files are written
once (create-only put); a rebuilt window gets the same key and the same bytes.

A record's key is chosen by ``KeyOf`` (default: the AMQP ``message-id`` property).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tierlog.formats.amqp import decode_message
from tierlog.formats.chunk import ChunkHeader, check_crc, decode_header, iter_records
from tierlog.formats.encryption import SEALED_HEADER
from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import FragmentIndex
from tierlog.formats.fragment_v2 import FragmentIndexV2, decode_fragment, stored_sizes
from tierlog.formats.key_index import (
    FLAG_CODED_FRAME,
    ITEM_DTYPE,
    KeyIndexHeader,
    encode_key_index,
    key_hash,
    lookup,
    slots_for,
)
from tierlog.formats.key_index_manifest import WindowEntry
from tierlog.remote import keys
from tierlog.remote.dictionaries import DictionaryCache, frame_decoder
from tierlog.remote.encryption import opener_for
from tierlog.remote.errors import CorruptFragmentError
from tierlog.remote.fragments import FragmentEntry, RemoteStream
from tierlog.remote.sealing import RangedOpener, is_sealed, key_block_of, seal_ranged
from tierlog.remote.settings import StreamSettings, check_index_key
from tierlog.storage.errors import AlreadyExistsError
from tierlog.storage.object_store import ObjectStore

KeyOf = Callable[[memoryview], bytes | None]
HEAD_PROBE = 256
"""Bytes enough for a sealed file's header, key block and frame size."""
_NAME = re.compile(r"(\d{20})\.(\d+)\.(\d+)\.kidx")


def message_id_key(record: memoryview) -> bytes | None:
    """The AMQP ``message-id`` of a record (None when it has none or is not AMQP)."""
    try:
        value = decode_message(record).properties.get("message_id")
    except FormatError:
        return None
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    return str(value).encode()


_PROPERTY_OF = {
    "message-id": "message_id",
    "correlation-id": "correlation_id",
    "subject": "subject",
}


def _as_key(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def key_of_setting(index_key: str) -> KeyOf:
    """The ``KeyOf`` of a stream's ``index_key`` setting (see ``StreamSettings``): an AMQP
    property, or ``property:<name>`` for an application property. Records that are not
    AMQP messages or lack the key are not indexed."""
    if index_key == "message-id":
        return message_id_key
    check_index_key(index_key)
    name = _PROPERTY_OF.get(index_key)

    def key_of(record: memoryview) -> bytes | None:
        try:
            message = decode_message(record)
        except FormatError:
            return None
        if name is not None:
            return _as_key(message.properties.get(name))
        return _as_key(message.application_properties.get(index_key[len("property:") :]))

    return key_of


def index_prefix(prefix: str, stream_dir: str) -> str:
    return keys.stream_prefix(prefix, stream_dir) + "kindex/"


@dataclass(frozen=True, slots=True)
class KeyIndexFile:
    """One window file; ``key_block`` / ``frame_size`` are set when it is sealed (the
    key-index manifest keeps them, so a ranged read needs no header GET)."""

    key: str
    window_start: int
    slot_count: int
    item_count: int
    key_block: bytes = b""
    frame_size: int = 0

    @property
    def header(self) -> KeyIndexHeader:
        return KeyIndexHeader(self.slot_count, self.item_count, self.window_start)

    def reader(self, store: ObjectStore) -> Callable[[int, int], bytes]:
        """Reads plaintext ranges ``[start, end)`` of the file: one GET each."""
        if not self.key_block:
            return lambda start, end: store.get(self.key, start, end)
        opener = RangedOpener(self.key, self.key_block, self.frame_size, self.header.total_size)
        return lambda start, end: opener.read(
            start, end, lambda lo, hi: store.get(self.key, lo, hi)
        )


def window_file_key(prefix: str, stream_dir: str, window: WindowEntry) -> str:
    return (
        f"{index_prefix(prefix, stream_dir)}{window.start:020d}.{window.slots}.{window.items}.kidx"
    )


def file_of_window(prefix: str, stream_dir: str, window: WindowEntry) -> KeyIndexFile:
    return KeyIndexFile(
        window_file_key(prefix, stream_dir, window),
        window.start,
        window.slots,
        window.items,
        window.key_block,
        window.frame_size,
    )


def parse_index_key(key: str) -> KeyIndexFile | None:
    m = _NAME.fullmatch(key.rpartition("/")[2])
    if not m:
        return None
    return KeyIndexFile(key, int(m.group(1)), int(m.group(2)), int(m.group(3)))


def _entry_data(chunk: bytes | memoryview, header: ChunkHeader) -> memoryview:
    return memoryview(chunk)[header.data_start : header.data_start + header.data_length]


def _chunks(
    store: ObjectStore, entry: FragmentEntry, dictionaries: DictionaryCache
) -> Iterator[tuple[bytes | memoryview, int, int, int]]:
    """(chunk bytes, frame position, stored size, item flags) of every chunk of a fragment."""
    data = memoryview(store.get(entry.key))
    try:
        index = decode_fragment(data, opener_for(entry.key))
    except FormatError as exc:
        raise CorruptFragmentError(f"{entry.key}: {exc}") from exc
    decoder = frame_decoder(entry.key, index, dictionaries)
    positions = index.records["position"].astype(np.int64).tolist()
    sizes = stored_sizes(index).astype(np.int64).tolist()
    for i, (p, s) in enumerate(zip(positions, sizes, strict=True)):
        frame = data[p : p + s]
        try:
            chunk = decoder.decode(i, frame) if decoder is not None else frame
        except FormatError as exc:
            raise CorruptFragmentError(f"{entry.key}: {exc}") from exc
        yield chunk, p, s, FLAG_CODED_FRAME if decoder is not None else 0


def build_window(
    store: ObjectStore,
    prefix: str,
    stream_dir: str,
    stream: str,
    fragments: Sequence[FragmentEntry],
    window_start: int,
    window_end: int,
    key_of: KeyOf = message_id_key,
    settings: StreamSettings | None = None,
) -> KeyIndexFile:
    """Index the records of ``fragments`` whose chunk timestamp is in
    ``[window_start, window_end)`` and store the file (sealed in small frames when
    ``settings`` ask for encryption; an existing file, from an earlier run, is kept)."""
    hashes: list[int] = []
    offsets: list[int] = []
    stamps: list[int] = []
    owners: list[int] = []
    positions: list[int] = []
    sizes: list[int] = []
    flag_list: list[int] = []
    dictionaries = DictionaryCache(store)
    for entry in fragments:
        if entry.max_timestamp < window_start or entry.min_timestamp >= window_end:
            continue
        for chunk, position, size, flags in _chunks(store, entry, dictionaries):
            header = decode_header(chunk)
            if header.chunk_type != 0 or not window_start <= header.timestamp < window_end:
                continue
            data = _entry_data(chunk, header)
            for offset, record in iter_records(header.chunk_id, data, header.num_entries):
                key = key_of(record)
                if key is None:
                    continue
                hashes.append(key_hash(stream, key))
                offsets.append(offset)
                stamps.append(header.timestamp)
                owners.append(entry.first_offset)
                positions.append(position)
                sizes.append(size)
                flag_list.append(flags)
    items = np.zeros(len(hashes), dtype=ITEM_DTYPE)
    items["hash"] = np.array(hashes, dtype=np.uint64)
    items["offset"] = offsets
    items["timestamp"] = stamps
    items["fragment"] = owners
    items["frame_position"] = positions
    items["frame_size"] = sizes
    items["flags"] = flag_list
    slots = slots_for(len(items))
    body = encode_key_index(items, window_start, slots)
    name = f"{index_prefix(prefix, stream_dir)}{window_start:020d}.{slots}.{len(items)}.kidx"
    sealed = seal_ranged(settings, name, body) if settings is not None else None
    try:
        store.put_if_absent(name, sealed.data if sealed is not None else body)
    except AlreadyExistsError:  # an earlier run: the same records, sealed under its own key
        return _existing_file(store, name, window_start, slots, len(items))
    if sealed is None:
        return KeyIndexFile(name, window_start, slots, len(items))
    return KeyIndexFile(name, window_start, slots, len(items), sealed.key_block, sealed.frame_size)


def _existing_file(
    store: ObjectStore, name: str, window_start: int, slots: int, items: int
) -> KeyIndexFile:
    """The file an earlier run stored under ``name``: its key block when it is sealed."""
    head = store.get(name, 0, min(HEAD_PROBE, store.head(name).size))
    if not is_sealed(head):
        return KeyIndexFile(name, window_start, slots, items)
    try:
        block = key_block_of(head)
        at = SEALED_HEADER.size + len(block)
        (frame_size,) = struct.unpack_from(">I", head, at)
    except (FormatError, struct.error) as exc:
        raise CorruptFragmentError(f"{name}: sealed key index header: {exc}") from exc
    return KeyIndexFile(name, window_start, slots, items, block, frame_size)


def list_index_files(store: ObjectStore, prefix: str, stream_dir: str) -> list[KeyIndexFile]:
    out = []
    for meta in store.list(index_prefix(prefix, stream_dir)):
        parsed = parse_index_key(meta.key)
        if parsed is not None:
            out.append(parsed)
    return sorted(out, key=lambda f: f.window_start)


def lookup_records(
    store: ObjectStore,
    prefix: str,
    stream_dir: str,
    stream: str,
    index_file: KeyIndexFile,
    key: bytes,
    key_of: KeyOf = message_id_key,
    fragment_indexes: dict[str, FragmentIndex] | None = None,
    from_timestamp: int | None = None,
    to_timestamp: int | None = None,
) -> list[tuple[int, bytes]]:
    """``(offset, record)`` of every record of the window whose key is ``key`` (and whose
    chunk timestamp is in ``[from_timestamp, to_timestamp]`` when given), in offset order:
    the index narrows to candidates, each candidate's frame is read and the record's own key
    checked (hash collisions never return a wrong record)."""
    candidates = window_candidates(store, stream, index_file, key, from_timestamp, to_timestamp)
    return read_candidates(store, prefix, stream_dir, candidates, key, key_of, fragment_indexes)


def window_candidates(
    store: ObjectStore,
    stream: str,
    index_file: KeyIndexFile,
    key: bytes,
    from_timestamp: int | None = None,
    to_timestamp: int | None = None,
) -> np.ndarray:
    """The window's items whose hash is ``key``'s (and whose timestamp is in range): the
    slot entry and the slot's items, two ranged GETs (one for an empty slot)."""
    try:
        candidates = lookup(index_file.reader(store), index_file.header, stream, key)
    except FormatError as exc:
        raise CorruptFragmentError(f"{index_file.key}: {exc}") from exc
    if from_timestamp is not None:
        candidates = candidates[candidates["timestamp"] >= from_timestamp]
    if to_timestamp is not None:
        candidates = candidates[candidates["timestamp"] <= to_timestamp]
    return candidates


def read_candidates(
    store: ObjectStore,
    prefix: str,
    stream_dir: str,
    candidates: np.ndarray,
    key: bytes,
    key_of: KeyOf = message_id_key,
    fragment_indexes: dict[str, FragmentIndex] | None = None,
) -> list[tuple[int, bytes]]:
    """The records of ``candidates`` whose own key is ``key``: one GET per chunk frame
    (and a v2 fragment's index once, kept in ``fragment_indexes``)."""
    out: list[tuple[int, bytes]] = []
    frames: dict[tuple[int, int], bytes | memoryview] = {}
    indexes = fragment_indexes if fragment_indexes is not None else {}
    dictionaries = DictionaryCache(store)
    for item in candidates:
        owner = int(item["fragment"])
        position, size = int(item["frame_position"]), int(item["frame_size"])
        fragment_key = keys.fragment_key(prefix, stream_dir, owner)
        chunk = frames.get((owner, position))
        if chunk is None:
            stored = store.get(fragment_key, position, position + size)
            if int(item["flags"]) & FLAG_CODED_FRAME:
                chunk = _decode_frame(
                    store, prefix, stream_dir, owner, stored, position, indexes, dictionaries
                )
            else:
                chunk = stored  # a v1 chunk: its CRC is checked below
                header = decode_header(chunk)
                try:
                    check_crc(header, _entry_data(chunk, header))
                except FormatError as exc:
                    raise CorruptFragmentError(f"{fragment_key}: {exc}") from exc
            frames[(owner, position)] = chunk
        header = decode_header(chunk)
        records = iter_records(header.chunk_id, _entry_data(chunk, header), header.num_entries)
        for offset, record in records:
            if offset == int(item["offset"]) and key_of(record) == key:
                out.append((offset, bytes(record)))
    return sorted(out)


def _decode_frame(
    store: ObjectStore,
    prefix: str,
    stream_dir: str,
    owner: int,
    stored: bytes,
    position: int,
    indexes: dict[str, FragmentIndex],
    dictionaries: DictionaryCache,
) -> bytes:
    """A chunk from a v2 frame, decoded with its fragment's index (read once: two GETs)."""
    fragment_key = keys.fragment_key(prefix, stream_dir, owner)
    index = indexes.get(fragment_key)
    if index is None:
        fragment = RemoteStream(store, prefix, stream_dir).read_fragment(owner)
        if fragment is None:
            raise CorruptFragmentError(f"{fragment_key}: indexed fragment is gone")
        index = indexes[fragment_key] = fragment.index
    if not isinstance(index, FragmentIndexV2):
        raise CorruptFragmentError(f"{fragment_key}: key index says v2, the fragment is v1")
    i = int(np.searchsorted(index.records["position"].astype(np.int64), position))
    if i >= len(index) or int(index.records["position"][i]) != position:
        raise CorruptFragmentError(f"{fragment_key}: no frame at {position}")
    decoder = frame_decoder(fragment_key, index, dictionaries)
    assert decoder is not None
    try:
        return decoder.decode(i, stored)
    except FormatError as exc:
        raise CorruptFragmentError(f"{fragment_key}: {exc}") from exc
