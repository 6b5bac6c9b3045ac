"""Checks of chunk header fields that the data CRC does not cover, for readers.

The Osiris chunk header has no CRC of its own. Recovery corroborates the fields it can
(continuity with the neighbouring chunks, the index record for the chunk type) for the
segments it scans; these checks cover the chunks a reader reaches in segments recovery
did not read chunk by chunk (below ``trusted_from``), and the chunks a reader would skip.
Each costs at most one pread or one index lookup per chunk, never per record.

Osiris's own readers check the magic/version byte and the expected chunk id only; they
take the chunk type on trust and skip any non-user chunk unread, so there a flipped
type byte drops a user chunk silently.
"""

from __future__ import annotations

import struct

from tierlog.formats.chunk import HEADER_DTYPE, ChunkHeader
from tierlog.formats.errors import FormatError, TruncatedError
from tierlog.log.segment_files import IndexView, pread_exact, validate_chunk

assert HEADER_DTYPE.fields is not None
_CHUNK_ID_POS: int = HEADER_DTYPE.fields["chunk_id"][1]
_U64 = struct.Struct(">Q")


def verified_tracking(fd: int, header: ChunkHeader, position: int) -> memoryview:
    """The bytes of the chunk at ``position`` whose header says tracking, once they
    verifiably are: the data CRC matches and it parses as the tracking chunk its type
    names (one simple entry, one record, a snapshot or delta that decodes). A user chunk
    whose type byte flipped would otherwise vanish from the stream without an error.
    Raises FormatError; tracking chunks are few and small (one pread, one parse each)."""
    data = pread_exact(fd, header.total_size, position)
    if len(data) != header.total_size:
        raise TruncatedError(f"chunk {header.chunk_id} is truncated")
    raw = memoryview(data)
    try:
        validate_chunk(header, raw)
    except FormatError as exc:
        raise FormatError(
            f"chunk {header.chunk_id} says chunk type {header.chunk_type} but is not a "
            f"valid tracking chunk ({exc}); refused rather than skipped"
        ) from exc
    return raw


def load_index_or_none(index_path: str) -> IndexView | None:
    """A segment's index for cross-checks, or None when it cannot be read (the chunk then
    stands on its own: no second opinion)."""
    try:
        return IndexView.load(index_path)
    except (OSError, FormatError):
        return None


def index_type_mismatch(index: IndexView, header: ChunkHeader, position: int) -> str | None:
    """Why the chunk at ``position`` disagrees with its index record's chunk type, or None.

    Meant for single-record user chunks: a tracking chunk (one simple entry, one record,
    no trailer) whose type byte reads "user" has exactly their shape and would be handed
    out as a record; only the index record, which repeats the type, tells them apart."""
    record = index.last_at_or_below(header.chunk_id, index.count)
    if (
        record is not None
        and record.chunk_id == header.chunk_id
        and record.position == position
        and record.chunk_type != header.chunk_type
    ):
        return (
            f"chunk {header.chunk_id} has chunk type {header.chunk_type}, its index record "
            f"says {record.chunk_type}; refused (the type is outside the CRC)"
        )
    return None


def next_chunk_id(data: bytes, chunk_size: int) -> int | None:
    """The chunk id in the header that follows a chunk of ``chunk_size`` bytes at the start
    of ``data`` (read together with it), or None when ``data`` ends before it.

    In a sealed segment the next chunk must start at this chunk's id plus its record
    count; a record count that a flipped bit changed is caught here, at the damaged chunk
    itself (so the cross-tier reader serves that chunk's remote copy), instead of at the
    next chunk after the damaged one's records went out under the wrong offsets."""
    if len(data) < chunk_size + _CHUNK_ID_POS + 8:
        return None
    (chunk_id,) = _U64.unpack_from(data, chunk_size + _CHUNK_ID_POS)
    return int(chunk_id)
