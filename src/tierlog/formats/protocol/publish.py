"""The publish hot path: Publish decoding and encoding, PublishConfirm encoding.

A Publish message is ``PublishingId:uint64 [FilterValue:string (v2)] Entry`` where
``Entry`` is an Osiris entry verbatim: simple ``0:1 Len:31 Data`` or sub-batch
``1:1 Compression:3 0:4 NumRecords:16 UncompressedLen:32 Len:32 Data``. The server can
therefore append entries to a chunk without re-encoding them, and decoding only has
to find entry boundaries. No per-message Python object is built beyond the entry
slice itself; when all messages of a v1 frame are simple entries of the same length
(what batching clients send) one cached ``struct.Struct`` call splits the whole frame.
"""

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from tierlog.formats.chunk import (
    MAX_COMPRESSION,
    MAX_SIMPLE_ENTRY_BYTES,
    SIMPLE_ENTRY_HEADER_SIZE,
    SUB_BATCH_BIT,
    simple_entry,
)
from tierlog.formats.chunk import SUB_BATCH_HEADER as _SUBBATCH
from tierlog.formats.chunk import SUB_BATCH_HEADER_SIZE as SUBBATCH_ENTRY_HEADER_SIZE
from tierlog.formats.chunk import encode_records as subbatch_records
from tierlog.formats.chunk import sub_batch_entry as subbatch_entry
from tierlog.formats.protocol.constants import Command
from tierlog.formats.protocol.errors import ProtocolError, TruncatedFrameError
from tierlog.formats.protocol.publishers import PublishError
from tierlog.formats.protocol.wire import U32, U64, Reader, encode_string, frame

_FRAME_HEAD = struct.Struct(">IHHBI")  # size, key, version, publisher id, message count
_HEAD = struct.Struct(">HHBI")  # the same without the size prefix (a frame body's start)
_V1_MESSAGE_HEAD_DTYPE = np.dtype([("id", ">u8"), ("len", ">u4")])
"""A v1 message holding a simple entry starts with its publishing id and the entry length."""
_ID_WORD = struct.Struct(">QI")  # publishing id, first 4 bytes of the entry
_CONFIRM_HEAD = struct.Struct(">IHHBI")

PUBLISH_HEADER_SIZE = _HEAD.size
PUBLISH_FRAME_HEADER_SIZE = _FRAME_HEAD.size
PUBLISH_V1_MESSAGE_HEADER_SIZE = _V1_MESSAGE_HEAD_DTYPE.itemsize  # 12
_FAST_PATH_MAX_COUNT = 4096
_CONFIRM_STRUCT_MAX_COUNT = 4096
_BIG_ENDIAN_HOST = sys.byteorder == "big"


HELD_BYTES_PER_MESSAGE = 256
"""What one decoded message costs beyond its bytes: its publishing id (an int), its entry
(a bytes object or a memoryview: 184 bytes), their list slots and its 8 bytes of confirm
(measured 140-235 bytes on CPython 3.11 with tracemalloc)."""


@dataclass(slots=True)
class PublishBatch:
    """A decoded Publish frame.

    ``entries[i]`` is the Osiris entry (header included) published with
    ``publishing_ids[i]``; ``record_counts`` is None when every entry is a simple
    entry (one record each), else the record count of each entry. ``filter_values``
    is set for version 2 frames only.
    """

    publisher_id: int
    version: int
    publishing_ids: Sequence[int]
    entries: Sequence[bytes | memoryview]
    num_records: int
    record_counts: list[int] | None = None
    filter_values: list[str | None] | None = None
    _data: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def num_entries(self) -> int:
        return len(self.entries)

    def held_bytes(self, frame_size: int) -> int:
        """Estimated memory this batch holds until it is settled: the frame it was read
        from, the entries' joined copy (``entry_data``) and the per-message objects. A
        frame of tiny messages costs ~20x its wire size, so budgets count this."""
        return 2 * frame_size + HELD_BYTES_PER_MESSAGE * len(self.entries)

    def entry_data(self) -> bytes:
        """All entries back to back: the data section of an Osiris chunk."""
        if self._data is None:
            self._data = b"".join(self.entries)
        return self._data

    def encode(self) -> bytes:
        return encode_publish_entries(
            self.publisher_id,
            self.publishing_ids,
            self.entries,
            filter_values=self.filter_values,
            version=self.version,
        )


@lru_cache(maxsize=32)
def _uniform_struct(entry_size: int, count: int) -> struct.Struct:
    return struct.Struct(">" + f"Q{entry_size}s" * count)


def decode_publish(body: memoryview | bytes) -> PublishBatch:
    """Decode a Publish frame body (the bytes after the size prefix)."""
    end = len(body)
    if end < PUBLISH_HEADER_SIZE:
        raise TruncatedFrameError("Publish frame shorter than its header")
    key, version, publisher_id, count = _HEAD.unpack_from(body, 0)
    if key != Command.PUBLISH:
        raise ProtocolError(f"not a Publish frame: key {key:#06x}")
    if version not in (1, 2):
        raise ProtocolError(f"unsupported Publish version {version}")
    if count * (8 + SIMPLE_ENTRY_HEADER_SIZE) > end - PUBLISH_HEADER_SIZE:
        raise TruncatedFrameError(f"{count} messages cannot fit in a frame of {end} bytes")
    if version == 1 and 0 < count <= _FAST_PATH_MAX_COUNT:
        batch = _decode_uniform(body, publisher_id, count)
        if batch is not None:
            return batch
    return _decode_general(body, publisher_id, version, count)


def _decode_uniform(body: memoryview | bytes, publisher_id: int, count: int) -> PublishBatch | None:
    """Split a v1 frame of same-length simple entries with one unpack; None if it is not."""
    end = len(body)
    word = _ID_WORD.unpack_from(body, PUBLISH_HEADER_SIZE)[1]
    if word & SUB_BATCH_BIT:
        return None
    entry_size = SIMPLE_ENTRY_HEADER_SIZE + word
    if count * (8 + entry_size) != end - PUBLISH_HEADER_SIZE:
        return None
    values = _uniform_struct(entry_size, count).unpack_from(body, PUBLISH_HEADER_SIZE)
    entries: tuple[bytes, ...] = values[1::2]
    data = b"".join(entries)
    header = U32.pack(word)
    for k in range(SIMPLE_ENTRY_HEADER_SIZE):
        if data[k::entry_size] != header[k : k + 1] * count:
            return None
    return PublishBatch(
        publisher_id=publisher_id,
        version=1,
        publishing_ids=values[0::2],
        entries=entries,
        num_records=count,
        _data=data,
    )


def _decode_general(
    body: memoryview | bytes, publisher_id: int, version: int, count: int
) -> PublishBatch:
    view = body if isinstance(body, memoryview) else memoryview(body)
    end = len(view)
    pos = PUBLISH_HEADER_SIZE
    ids: list[int] = []
    entries: list[memoryview] = []
    record_counts: list[int] | None = None
    filter_values: list[str | None] | None = [] if version == 2 else None
    num_records = 0
    id_unpack = _ID_WORD.unpack_from
    sub_batch_bit = SUB_BATCH_BIT
    for index in range(count):
        if filter_values is not None:
            if pos + 8 > end:
                raise TruncatedFrameError("Publish frame ends inside a publishing id")
            pid = U64.unpack_from(view, pos)[0]
            reader = Reader(view, pos + 8)
            filter_values.append(reader.nullable_string())
            entry_pos = reader.pos
            if entry_pos + SIMPLE_ENTRY_HEADER_SIZE > end:
                raise TruncatedFrameError("Publish frame ends inside an entry header")
            word = U32.unpack_from(view, entry_pos)[0]
        else:
            if pos + 12 > end:
                raise TruncatedFrameError("Publish frame ends inside a message header")
            pid, word = id_unpack(view, pos)
            entry_pos = pos + 8
        if not word & sub_batch_bit:
            entry_end = entry_pos + SIMPLE_ENTRY_HEADER_SIZE + word
            records = 1
        else:
            if entry_pos + SUBBATCH_ENTRY_HEADER_SIZE > end:
                raise TruncatedFrameError("Publish frame ends inside a sub-batch header")
            type_byte, records, _uncompressed, length = _SUBBATCH.unpack_from(view, entry_pos)
            if type_byte & 0x0F:
                raise ProtocolError(f"sub-batch entry with reserved bits set: {type_byte:#04x}")
            if (type_byte >> 4) & 0x07 > MAX_COMPRESSION:
                raise ProtocolError(f"unknown sub-batch compression {(type_byte >> 4) & 0x07}")
            if records == 0:
                raise ProtocolError("sub-batch entry without records")
            entry_end = entry_pos + SUBBATCH_ENTRY_HEADER_SIZE + length
            if record_counts is None:
                record_counts = [1] * index
        if entry_end > end:
            raise TruncatedFrameError("Publish frame ends inside an entry")
        ids.append(pid)
        entries.append(view[entry_pos:entry_end])
        if record_counts is not None:
            record_counts.append(records)
        num_records += records
        pos = entry_end
    if pos != end:
        raise ProtocolError(f"{end - pos} unexpected bytes after {count} Publish messages")
    return PublishBatch(
        publisher_id=publisher_id,
        version=version,
        publishing_ids=ids,
        entries=entries,
        num_records=num_records,
        record_counts=record_counts,
        filter_values=filter_values,
    )


def encode_publish_entries(
    publisher_id: int,
    publishing_ids: Sequence[int],
    entries: Sequence[bytes | memoryview],
    *,
    filter_values: Sequence[str | None] | None = None,
    version: int | None = None,
) -> bytes:
    """A whole Publish frame; version 2 (with filter values) when ``filter_values`` is set."""
    if len(publishing_ids) != len(entries):
        raise ValueError("one publishing id per entry")
    if version is None:
        version = 1 if filter_values is None else 2
    parts: list[bytes | memoryview] = [bytes((publisher_id,)), U32.pack(len(entries))]
    pack_id = U64.pack
    if version == 2:
        if filter_values is None or len(filter_values) != len(entries):
            raise ValueError("Publish v2 needs one filter value per entry")
        for pid, fv, entry in zip(publishing_ids, filter_values, entries, strict=True):
            parts += (pack_id(pid), encode_string(fv), entry)
    else:
        for pid, entry in zip(publishing_ids, entries, strict=True):
            parts += (pack_id(pid), entry)
    return frame(Command.PUBLISH, version, *(bytes(p) for p in parts))


def encode_publish(
    publisher_id: int,
    messages: Sequence[tuple[int, bytes]],
    *,
    filter_values: Sequence[str | None] | None = None,
) -> bytes:
    """A Publish frame of (publishing id, message) pairs, each as a simple entry."""
    return encode_publish_entries(
        publisher_id,
        [pid for pid, _ in messages],
        [simple_entry(data) for _, data in messages],
        filter_values=filter_values,
    )


def encode_publish_columns(
    publisher_id: int, ids: np.ndarray, offsets: np.ndarray, data: np.ndarray
) -> bytes:
    """One Publish (v1) frame from columns: message ``k`` is ``data[offsets[k]:offsets[k+1]]``
    with publishing id ``ids[k]``, each as an Osiris simple entry. Byte for byte what
    ``encode_publish`` makes of the same messages, but built with numpy gathers, not one
    Python object per message (the Spark writer frames millions of Arrow rows this way)."""
    n = len(ids)
    if len(offsets) != n + 1:
        raise ValueError("need len(ids) + 1 offsets")
    offs = offsets.astype(np.int64, copy=False)
    lens = np.diff(offs)
    if n and (int(lens.min()) < 0 or int(lens.max()) > MAX_SIMPLE_ENTRY_BYTES):
        raise ValueError("message length out of range for a simple entry")
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lens[:-1] + PUBLISH_V1_MESSAGE_HEADER_SIZE, out=starts[1:])
    starts += PUBLISH_FRAME_HEADER_SIZE
    total_data = int(lens.sum())
    size = PUBLISH_FRAME_HEADER_SIZE + n * PUBLISH_V1_MESSAGE_HEADER_SIZE + total_data
    out = np.empty(size, dtype=np.uint8)
    out[:PUBLISH_FRAME_HEADER_SIZE] = np.frombuffer(
        _FRAME_HEAD.pack(size - 4, Command.PUBLISH, 1, publisher_id, n), dtype=np.uint8
    )
    heads = np.empty(n, dtype=_V1_MESSAGE_HEAD_DTYPE)
    heads["id"] = ids
    heads["len"] = lens
    head_pos = (starts[:, None] + np.arange(PUBLISH_V1_MESSAGE_HEADER_SIZE)).ravel()
    out[head_pos] = heads.view(np.uint8)
    if total_data:
        base = int(offs[0])
        shift = np.repeat(starts + PUBLISH_V1_MESSAGE_HEADER_SIZE - (offs[:-1] - base), lens)
        out[np.arange(total_data, dtype=np.int64) + shift] = data[base : int(offs[-1])]
    return out.tobytes()


@lru_cache(maxsize=64)
def _confirm_struct(count: int) -> struct.Struct:
    return struct.Struct(f">IHHBI{count}Q")


def encode_publish_confirm(publisher_id: int, publishing_ids: Sequence[int]) -> bytes:
    """A whole PublishConfirm frame in one pack call."""
    count = len(publishing_ids)
    size = _CONFIRM_HEAD.size - 4 + 8 * count
    if count <= _CONFIRM_STRUCT_MAX_COUNT:
        return _confirm_struct(count).pack(
            size, Command.PUBLISH_CONFIRM, 1, publisher_id, count, *publishing_ids
        )
    ids = array("Q", publishing_ids)
    if not _BIG_ENDIAN_HOST:
        ids.byteswap()
    head = _CONFIRM_HEAD.pack(size, Command.PUBLISH_CONFIRM, 1, publisher_id, count)
    return head + ids.tobytes()


@dataclass(frozen=True, slots=True)
class PublishConfirm:
    """Server → client: these publishing ids are durable (or were duplicates)."""

    publisher_id: int
    publishing_ids: Sequence[int]

    def encode(self) -> bytes:
        return encode_publish_confirm(self.publisher_id, self.publishing_ids)


def decode_publish_confirm(body: memoryview | bytes) -> PublishConfirm:
    reader = Reader(body, 4)
    publisher_id = reader.u8()
    count = reader.count(8)
    if reader.remaining() != 8 * count:
        raise ProtocolError("PublishConfirm length does not match its id count")
    ids = array("Q")
    ids.frombytes(bytes(reader.raw(8 * count)))
    if not _BIG_ENDIAN_HOST:
        ids.byteswap()
    return PublishConfirm(publisher_id, tuple(ids))


__all__ = [
    "PublishBatch",
    "PublishConfirm",
    "PublishError",
    "decode_publish",
    "decode_publish_confirm",
    "encode_publish",
    "encode_publish_columns",
    "encode_publish_confirm",
    "encode_publish_entries",
    "simple_entry",
    "subbatch_entry",
    "subbatch_records",
]
