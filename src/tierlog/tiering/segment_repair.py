"""Repairing a damaged local segment from the remote tier.

Fragments hold the chunks of one segment verbatim, with the byte position of their
first chunk in the segment, so a durably tiered range of a damaged segment is repaired
by writing the fragment's chunk bytes back at that position. Only the committed
manifest counts as durable; every chunk fetched is validated (CRC and entries) before
it is written, so a repair can never make things worse. Recovery then rebuilds the
segment's index from the repaired file.
"""

from __future__ import annotations

import os

from tierlog.formats.chunk import decode_header
from tierlog.formats.errors import FormatError
from tierlog.formats.segment import FILE_HEADER_SIZE, SEGMENT_HEADER
from tierlog.log.damage import patch_segment
from tierlog.log.errors import DamagedSegmentError
from tierlog.log.segment_files import validate_chunk
from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog
from tierlog.remote.committed import read_committed_root
from tierlog.remote.dictionaries import read_chunk_bytes
from tierlog.remote.errors import CorruptFragmentError, OffsetOutOfRangeError
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore

log = get_logger(__name__)


def repair_from_remote(
    catalog: Catalog, store: ObjectStore, prefix: str, error: DamagedSegmentError
) -> int:
    """Rewrite the damaged range of ``error``'s segment from committed fragments.

    Returns the number of bytes rewritten (0 when the remote tier does not durably hold
    the start of the damaged range). Raises StorageError on object-store trouble.
    """
    stream_dir = os.path.dirname(error.segment_path)
    incarnation = os.path.basename(stream_dir)
    pointer, root = read_committed_root(catalog, store, prefix, incarnation)
    if pointer is None or root is None:
        return 0
    tree = ManifestTree.from_root(root, prefix, sealed=pointer.sealed)
    remote = RemoteStream(store, prefix, incarnation)
    end = error.end_offset if error.end_offset is not None else tree.next_offset
    at = max(error.first_offset, error.segment_first_offset)
    try:
        location = tree.locate_offset(at, remote.load)
    except OffsetOutOfRangeError:
        return 0
    repaired = 0
    reached_damage = False
    offset = location.entry.first_offset
    while offset < min(end, tree.next_offset):
        fragment = remote.read_fragment(offset)
        if fragment is None:
            break
        t = fragment.trailer
        if t.segment_first_offset != error.segment_first_offset:
            break  # the next segment: outside the damaged file
        key = remote.fragment_key(offset)
        try:
            data = read_chunk_bytes(store, key, fragment.index)  # v2 frames decoded
        except NotFoundError:
            break
        except CorruptFragmentError as exc:
            raise FormatError(str(exc)) from exc
        _validate_chunks(memoryview(data), key)
        if t.segment_position <= error.position < t.segment_position + len(data) or (
            error.position == t.segment_position + len(data) and t.next_offset < end
        ):
            reached_damage = True
        if error.position < FILE_HEADER_SIZE and t.segment_position == FILE_HEADER_SIZE:
            patch_segment(error.segment_path, 0, SEGMENT_HEADER)  # a constant
            reached_damage = True
        patch_segment(error.segment_path, t.segment_position, data)
        repaired += len(data)
        log.warning(
            "segment_repaired_from_remote",
            file=error.segment_path,
            position=t.segment_position,
            bytes=len(data),
            fragment=key,
        )
        offset = t.next_offset
    return repaired if reached_damage else 0


def _validate_chunks(data: memoryview, key: str) -> None:
    pos = 0
    while pos < len(data):
        try:
            header = decode_header(data, pos)
            validate_chunk(header, data[pos : pos + header.total_size])
        except FormatError as exc:
            raise FormatError(f"{key}: chunk at {pos} does not validate: {exc}") from exc
        pos += header.total_size
