"""A sealed segment file as the offloader reads it: loaded and checked against its index,
its chunks read straight into the buffers of the blocks being uploaded.

The chunks of a block are contiguous in the segment file, so one ``preadv`` (per 1024
chunks) scatters them into their slots, between the entry headers of a format 1 block or of
a run of entries to seal (format 2). Each chunk's CRC-32 is recorded for the index and,
unless told otherwise, its header and data CRC are checked, so a segment damaged on disk is
refused (``OffloadSourceError``) rather than offloaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from tierlog.formats.chunk import HEADER_SIZE, check_crc, decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import FormatError
from tierlog.formats.offload import BlockPlan, SegmentMetadata, frame_block
from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_RECORD_DTYPE,
    INDEX_RECORD_SIZE,
    check_index_header,
)
from tierlog.log.segment_files import SegmentRef, pread_exact, read_file
from tierlog.offload.errors import OffloadSourceError

_IOV_MAX = 1024  # iovecs per preadv (Linux's limit)


@dataclass(frozen=True)
class SegmentSource:
    """A sealed segment file as the offloader sees it."""

    metadata: SegmentMetadata
    fd: int
    path: str


def load_source(segment: SegmentRef) -> SegmentSource:
    """Open the segment and check it is sealed and matches its index: the index's records
    end at a chunk whose end is the end of the file."""
    buf = read_file(segment.index_path)
    try:
        check_index_header(buf)
    except FormatError as exc:
        raise OffloadSourceError(f"{segment.index_path}: {exc}") from exc
    count = (len(buf) - FILE_HEADER_SIZE) // INDEX_RECORD_SIZE
    records = np.frombuffer(buf, INDEX_RECORD_DTYPE, count=count, offset=FILE_HEADER_SIZE)
    zero = np.flatnonzero(records["position"] == 0)  # all-zero records end the index
    if len(zero):
        records = records[: int(zero[0])]
    if len(records) == 0:
        raise OffloadSourceError(f"{segment.index_path}: no chunk to offload")
    fd = os.open(segment.segment_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        last_pos = int(records["position"][-1])
        try:
            last = decode_header(pread_exact(fd, HEADER_SIZE, last_pos))
        except FormatError as exc:
            raise OffloadSourceError(f"{segment.segment_path} at {last_pos}: {exc}") from exc
        end = last_pos + last.total_size
        if last.chunk_id != int(records["chunk_id"][-1]) or end != size:
            raise OffloadSourceError(
                f"{segment.segment_path}: not sealed or not matching its index (last indexed "
                f"chunk {int(records['chunk_id'][-1])} ends at {end}, file has {size} bytes)"
            )
        metadata = SegmentMetadata(segment.first_offset, last.next_offset, size, records.copy())
        return SegmentSource(metadata, fd, segment.segment_path)
    except BaseException:
        os.close(fd)
        raise


def fill_block(
    view: memoryview,
    plan: BlockPlan,
    source: SegmentSource,
    sizes: np.ndarray,
    crcs: np.ndarray,
    *,
    verify: bool,
) -> None:
    """Frame a format 1 block in ``view`` and read its chunks straight into place."""
    slots = frame_block(view, plan, source.metadata.records["chunk_id"], sizes)
    read_entries(view, slots, plan.first_entry, source, crcs, verify=verify)


def read_entries(
    view: memoryview,
    slots: list[tuple[int, int]],
    first_entry: int,
    source: SegmentSource,
    crcs: np.ndarray,
    *,
    verify: bool,
) -> None:
    """Read chunks ``first_entry`` on into ``slots`` of ``view`` (one ``preadv`` per 1024
    chunks), record each one's CRC and, with ``verify``, check it (header, id, size, data
    CRC)."""
    meta = source.metadata
    ids = meta.records["chunk_id"]
    position = int(meta.records["position"][first_entry])
    for at in range(0, len(slots), _IOV_MAX):
        batch = slots[at : at + _IOV_MAX]
        buffers = [view[start:end] for start, end in batch]
        want = sum(end - start for start, end in batch)
        got = os.preadv(source.fd, buffers, position)
        if got != want:
            raise OffloadSourceError(
                f"{source.path}: short read of {got} of {want} bytes at {position}"
            )
        position += want
    for i, (start, end) in enumerate(slots):
        crcs[first_entry + i] = crc32(view[start:end])
    if not verify:
        return
    for i, (start, end) in enumerate(slots):
        chunk = view[start:end]
        expected = int(ids[first_entry + i])
        try:
            header = decode_header(chunk)
            if header.chunk_id != expected or header.total_size != end - start:
                raise FormatError(
                    f"chunk {header.chunk_id} of {header.total_size} bytes where the "
                    f"index has chunk {expected} of {end - start} bytes"
                )
            check_crc(header, chunk[header.data_start : header.data_start + header.data_length])
        except FormatError as exc:
            raise OffloadSourceError(f"{source.path}: {exc}") from exc
