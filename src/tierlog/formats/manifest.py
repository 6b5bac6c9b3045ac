"""Manifest tree nodes (root and branches): a header plus a sorted array of fixed-size entries.

Layout (all integers big-endian)::

    header   84 bytes (see ``HEADER``): magic "TLMN", version, kind (root/branch), height,
             epoch, first/next offset, min/max timestamp, total bytes/chunks/fragments,
             entry count, stream dir length
    stream   the stream directory, UTF-8
    entries  ``entry_count`` records of 72 bytes (see ``WIRE_DTYPE``), ascending first offset
    crc      u32, zlib CRC-32 of everything before it

An entry covers ``[first_offset, next)`` where ``next`` is the next entry's first offset (or
the node's next offset for the last one). Height 0 is a leaf: entry kind 0 a fragment (uid all
zero: fragments are keyed by first offset), entry kind 1 an offloaded segment (uid = its
offload attempt's UUID, which names its objects); height h >= 1 a branch node of height h whose
entries have height h-1 (entry kind 0). The entry kind is byte 65 of an entry, formerly the
first reserved byte, so manifests written before segments existed read unchanged.
A root may hold entries of several heights, oldest (highest) first. Entries are kept in memory
as a numpy structured array in native byte order (``ENTRY_DTYPE``) so whole nodes encode,
decode and binary-search without per-entry Python work.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierlog.formats.errors import (
    BadMagicError,
    CrcMismatchError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

NODE_MAGIC = b"TLMN"
NODE_VERSION = 1
KIND_ROOT = 0
KIND_BRANCH = 1

UID_SIZE = 16
ZERO_UID = bytes(UID_SIZE)
MAX_STREAM_DIR_BYTES = 1024
EMPTY_TIMESTAMP = -1  # min/max timestamp of a node without entries
ENTRY_FRAGMENT = 0  # entry kinds of height-0 entries (branch entries are kind 0 too)
ENTRY_SEGMENT = 1

# magic, version, kind, reserved, height, epoch, first offset, next offset, min ts, max ts,
# total bytes, total chunks, total fragments, entry count, stream dir length, reserved.
HEADER = struct.Struct(">4sHBxIQQQqqQQQIHxx")
HEADER_SIZE = HEADER.size  # 84
CRC = struct.Struct(">I")

_FIELDS = [
    "first_offset",
    "min_timestamp",
    "max_timestamp",
    "data_size",
    "chunk_count",
    "fragment_count",
    "uid",
    "height",
    "entry_kind",
]
ENTRY_DTYPE = np.dtype(
    {
        "names": _FIELDS,
        "formats": ["u8", "i8", "i8", "u8", "u8", "u8", ("u1", (UID_SIZE,)), "u1", "u1"],
    }
)
WIRE_DTYPE = np.dtype(
    {
        "names": _FIELDS,
        "formats": [">u8", ">i8", ">i8", ">u8", ">u8", ">u8", ("u1", (UID_SIZE,)), "u1", "u1"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 64, 65],
        "itemsize": 72,  # 6 reserved zero bytes at the end
    }
)
ENTRY_SIZE = WIRE_DTYPE.itemsize


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One node entry: a fragment or an offloaded segment (height 0, told apart by
    ``entry_kind``) or a branch node (height >= 1)."""

    first_offset: int
    min_timestamp: int
    max_timestamp: int
    data_size: int
    chunk_count: int
    fragment_count: int = 1
    height: int = 0
    uid: bytes = ZERO_UID
    entry_kind: int = ENTRY_FRAGMENT


@dataclass(frozen=True, slots=True)
class NodeHeader:
    kind: int  # KIND_ROOT or KIND_BRANCH
    height: int  # branch: its height; root: 1 + highest entry height (0 when empty)
    epoch: int
    stream_dir: str
    first_offset: int
    next_offset: int
    min_timestamp: int
    max_timestamp: int
    total_bytes: int
    total_chunks: int
    total_fragments: int
    entry_count: int


@dataclass(frozen=True, slots=True)
class ManifestNode:
    header: NodeHeader
    entries: np.ndarray  # ENTRY_DTYPE, ascending first offset


def entries_array(entries: Sequence[ManifestEntry]) -> np.ndarray:
    """Entries as a structured array (``ENTRY_DTYPE``)."""
    arr = np.zeros(len(entries), dtype=ENTRY_DTYPE)
    for name in [*_FIELDS[:6], "height", "entry_kind"]:
        arr[name] = [getattr(e, name) for e in entries]
    for i, e in enumerate(entries):
        if len(e.uid) != UID_SIZE:
            raise InvalidSizeError(f"uid must be {UID_SIZE} bytes, got {len(e.uid)}")
        arr["uid"][i] = np.frombuffer(e.uid, dtype=np.uint8)
    return arr


def entry_at(entries: np.ndarray, i: int) -> ManifestEntry:
    """One entry of a structured array as a ``ManifestEntry``."""
    r = entries[i]
    return ManifestEntry(
        first_offset=int(r["first_offset"]),
        min_timestamp=int(r["min_timestamp"]),
        max_timestamp=int(r["max_timestamp"]),
        data_size=int(r["data_size"]),
        chunk_count=int(r["chunk_count"]),
        fragment_count=int(r["fragment_count"]),
        height=int(r["height"]),
        uid=r["uid"].tobytes(),
        entry_kind=int(r["entry_kind"]),
    )


def summarize(
    kind: int, epoch: int, stream_dir: str, entries: np.ndarray, next_offset: int
) -> NodeHeader:
    """The header that matches ``entries`` (totals, range, height)."""
    n = len(entries)
    if n == 0:
        return NodeHeader(
            kind, 0, epoch, stream_dir, next_offset, next_offset,
            EMPTY_TIMESTAMP, EMPTY_TIMESTAMP, 0, 0, 0, 0,
        )  # fmt: skip
    return NodeHeader(
        kind=kind,
        height=int(entries["height"].max()) + 1,
        epoch=epoch,
        stream_dir=stream_dir,
        first_offset=int(entries["first_offset"][0]),
        next_offset=next_offset,
        min_timestamp=int(entries["min_timestamp"].min()),
        max_timestamp=int(entries["max_timestamp"].max()),
        total_bytes=int(entries["data_size"].sum(dtype=np.uint64)),
        total_chunks=int(entries["chunk_count"].sum(dtype=np.uint64)),
        total_fragments=int(entries["fragment_count"].sum(dtype=np.uint64)),
        entry_count=n,
    )


def encode_node(header: NodeHeader, entries: np.ndarray) -> bytes:
    """Encode a node; the header must describe the entries (see ``summarize``)."""
    if header.entry_count != len(entries):
        raise InvalidSizeError(f"header says {header.entry_count} entries, got {len(entries)}")
    stream = header.stream_dir.encode()
    if len(stream) > MAX_STREAM_DIR_BYTES:
        raise InvalidSizeError(f"stream dir longer than {MAX_STREAM_DIR_BYTES} bytes")
    wire = np.zeros(len(entries), dtype=WIRE_DTYPE)
    wire[...] = entries  # field by field, converting byte order; reserved bytes stay zero
    head = HEADER.pack(
        NODE_MAGIC,
        NODE_VERSION,
        header.kind,
        header.height,
        header.epoch,
        header.first_offset,
        header.next_offset,
        header.min_timestamp,
        header.max_timestamp,
        header.total_bytes,
        header.total_chunks,
        header.total_fragments,
        header.entry_count,
        len(stream),
    )
    body = b"".join((head, stream, wire.tobytes()))
    return body + CRC.pack(zlib.crc32(body))


def node_size(entry_count: int, stream_dir: str) -> int:
    """Encoded size of a node with ``entry_count`` entries."""
    return HEADER_SIZE + len(stream_dir.encode()) + entry_count * ENTRY_SIZE + CRC.size


def decode_node(data: bytes | bytearray | memoryview) -> ManifestNode:
    """Decode and fully check a node: sizes, CRC, order, heights and totals."""
    view = memoryview(data)
    if view.nbytes < HEADER_SIZE + CRC.size:
        raise TruncatedError(f"manifest node of {view.nbytes} bytes is too short")
    (
        magic,
        version,
        kind,
        height,
        epoch,
        first,
        next_offset,
        min_ts,
        max_ts,
        total_bytes,
        total_chunks,
        total_fragments,
        count,
        dir_len,
    ) = HEADER.unpack_from(view, 0)
    if magic != NODE_MAGIC:
        raise BadMagicError(f"not a manifest node: magic {magic!r}")
    if version != NODE_VERSION:
        raise UnsupportedError(f"manifest node version {version} not supported")
    if kind not in (KIND_ROOT, KIND_BRANCH):
        raise UnsupportedError(f"manifest node kind {kind} unknown")
    expected = HEADER_SIZE + dir_len + count * ENTRY_SIZE + CRC.size
    if view.nbytes < expected:
        raise TruncatedError(f"manifest node needs {expected} bytes, got {view.nbytes}")
    if view.nbytes > expected:
        raise InvalidSizeError(f"manifest node has {view.nbytes - expected} trailing bytes")
    (stored_crc,) = CRC.unpack_from(view, expected - CRC.size)
    actual = zlib.crc32(view[: expected - CRC.size])
    if actual != stored_crc:
        raise CrcMismatchError(f"manifest node CRC {actual:#010x} != stored {stored_crc:#010x}")
    try:
        stream_dir = bytes(view[HEADER_SIZE : HEADER_SIZE + dir_len]).decode()
    except UnicodeDecodeError as e:
        raise InvalidSizeError(f"manifest stream dir is not UTF-8: {e}") from None
    wire = np.frombuffer(view, dtype=WIRE_DTYPE, count=count, offset=HEADER_SIZE + dir_len)
    entries = wire.astype(ENTRY_DTYPE)
    header = NodeHeader(
        kind,
        height,
        epoch,
        stream_dir,
        first,
        next_offset,
        min_ts,
        max_ts,
        total_bytes,
        total_chunks,
        total_fragments,
        count,
    )
    check_node(header, entries)
    return ManifestNode(header, entries)


def check_node(header: NodeHeader, entries: np.ndarray) -> None:
    """Raise ``InvalidSizeError`` unless entries are ordered, well-shaped and match the header."""
    if len(entries) == 0:
        if header.kind == KIND_BRANCH:
            raise InvalidSizeError("empty branch node")
        if header.first_offset != header.next_offset or header.height != 0:
            raise InvalidSizeError("empty manifest node must have first == next and height 0")
        if header.total_bytes or header.total_chunks or header.total_fragments:
            raise InvalidSizeError("empty manifest node with non-zero totals")
        return
    firsts = entries["first_offset"]
    heights = entries["height"].astype(np.int64)
    nexts = np.append(firsts[1:], np.uint64(header.next_offset))
    if not bool(np.all(firsts < nexts)):
        raise InvalidSizeError("manifest entries not in ascending offset order")
    if header.kind == KIND_BRANCH:
        if header.height < 1 or not bool(np.all(heights == header.height - 1)):
            raise InvalidSizeError(f"branch of height {header.height} with other-height entries")
    elif not bool(np.all(heights[1:] <= heights[:-1])):
        raise InvalidSizeError("root entries must have non-increasing heights")
    kinds = entries["entry_kind"]
    if not bool(np.all((kinds == ENTRY_FRAGMENT) | ((kinds == ENTRY_SEGMENT) & (heights == 0)))):
        raise UnsupportedError("manifest entry kind unknown (or a branch entry not of kind 0)")
    leaf = heights == 0
    fragment = leaf & (kinds == ENTRY_FRAGMENT)
    zero_uid = ~entries["uid"].any(axis=1)
    fragments = entries["fragment_count"]
    chunks = entries["chunk_count"]
    if not bool(np.all(zero_uid == fragment)) or not bool(np.all(fragments[leaf] == 1)):
        raise InvalidSizeError(
            "fragment entries need a zero uid, segment and branch entries a non-zero one"
        )
    if not bool(np.all((fragments >= 1) & (chunks >= fragments) & (chunks <= nexts - firsts))):
        raise InvalidSizeError("manifest entry counts impossible")
    if not bool(np.all(entries["data_size"] >= chunks)) or not bool(
        np.all(entries["min_timestamp"] <= entries["max_timestamp"])
    ):
        raise InvalidSizeError("manifest entry sizes or timestamps impossible")
    if summarize(header.kind, header.epoch, header.stream_dir, entries, header.next_offset) != (
        header
    ):
        raise InvalidSizeError("manifest node header does not match its entries")


def find_offset(entries: np.ndarray, offset: int) -> int:
    """Index of the last entry whose first offset is <= ``offset`` (-1 if none)."""
    return int(np.searchsorted(entries["first_offset"], np.uint64(offset), side="right")) - 1


def find_timestamp(entries: np.ndarray, timestamp: int) -> int:
    """Index of the first entry whose max timestamp is >= ``timestamp`` (len if none)."""
    return int(np.searchsorted(entries["max_timestamp"], np.int64(timestamp), side="left"))


def entry_next_offset(entries: np.ndarray, i: int, node_next_offset: int) -> int:
    """Where entry ``i`` ends: the next entry's first offset, or the node's next offset."""
    return int(entries["first_offset"][i + 1]) if i + 1 < len(entries) else node_next_offset
