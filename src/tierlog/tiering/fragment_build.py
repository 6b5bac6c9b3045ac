"""Turning a planned run of local chunks into one fragment object, and checking an object
that already sits at a fragment's key.

The tierer's upload task calls these on the upload pool. They read the chunk bytes
through the log's API straight into the fragment buffer and verify every chunk's CRC on
the way (local bit rot must never become the only remote copy); an existing object is
adopted only when it holds exactly the local chunks (``tiering.resolution``'s rule).
"""

from __future__ import annotations

from tierlog.formats.chunk import BLOOM_SIZE_POS, ChunkType, decode_header
from tierlog.formats.crc import crc32
from tierlog.formats.errors import FormatError
from tierlog.formats.fragment import (
    HEADER_SIZE,
    FragmentChunkInfo,
    FragmentPlacement,
    encode_fragment,
    fragment_size,
)
from tierlog.formats.fragment_v2 import CODEC_NONE, FrameCoding, encode_fragment_v2
from tierlog.log.segment_files import validate_chunk
from tierlog.log.writer import StreamLog
from tierlog.remote.errors import CorruptFragmentError
from tierlog.remote.fragments import FragmentEntry, RemoteFragment, RemoteStream
from tierlog.storage.errors import StorageError
from tierlog.tiering.cold import FragmentCoder
from tierlog.tiering.errors import FragmentConflictError, LocalChunkCorruptError
from tierlog.tiering.resolution import LocalChunk, adoption_problem
from tierlog.tiering.state import FragmentPlan


def local_chunks(stream_log: StreamLog, first: int, end: int) -> dict[int, LocalChunk]:
    """The local log's chunks with ids in ``[first, end)`` (those still held)."""
    out: dict[int, LocalChunk] = {}
    for seg in stream_log.list_segments():
        if seg.next_offset <= first or seg.first_offset >= end:
            continue
        for c in stream_log.segment_chunks(seg.first_offset):
            if first <= c.chunk_id < end:
                out[c.chunk_id] = LocalChunk(epoch=c.epoch, crc=c.data_crc, size=c.size)
    return out


def read_fragment_checked(remote: RemoteStream, first_offset: int) -> RemoteFragment | None:
    """``read_fragment`` with a corrupt object turned into a conflict."""
    try:
        return remote.read_fragment(first_offset)
    except CorruptFragmentError as exc:
        raise FragmentConflictError(f"fragment {first_offset} is corrupt: {exc}") from exc


def build_fragment(
    stream_log: StreamLog, remote: RemoteStream, coder: FragmentCoder | None, plan: FragmentPlan
) -> tuple[bytearray, FragmentEntry, bool]:
    """The whole fragment object in one buffer: the chunk bytes are read straight
    into place (one pread, no join copy), then header, index and trailer around; and
    whether it is sealed (the committer must know: see ``ManifestCommitter.note_upload``)."""
    first = plan.chunks[0]
    span = plan.chunks[-1].position + plan.chunks[-1].size - first.position
    body = bytearray(fragment_size(span, len(plan.chunks)))
    raw = memoryview(body)[HEADER_SIZE : HEADER_SIZE + span]
    stream_log.read_segment_into(plan.segment, first.position, raw)
    buffers: list[memoryview] = []
    infos: list[FragmentChunkInfo] = []
    for c in plan.chunks:
        at = c.position - first.position
        buf = raw[at : at + c.size]
        header = decode_header(buf)
        if header.chunk_id != c.chunk_id or header.data_crc != c.data_crc:
            raise OSError(f"chunk {c.chunk_id} changed on disk under the tierer")
        start = header.data_start
        actual = crc32(buf[start : start + header.data_length])
        if actual != header.data_crc:
            # local bit rot must never become the only remote copy
            raise LocalChunkCorruptError(
                f"{stream_log.stream_dir} segment {plan.segment}: chunk {c.chunk_id} at "
                f"{c.position}: data CRC {actual:#010x} != "
                f"header {header.data_crc:#010x}; not uploaded, tiering of the stream stops"
            )
        if header.chunk_type != ChunkType.USER:
            # the type byte is outside the CRC: a user chunk whose type flipped must not be
            # uploaded as a tracking chunk (readers of either tier would skip it)
            try:
                validate_chunk(header, buf)
            except FormatError as exc:
                raise LocalChunkCorruptError(
                    f"{stream_log.stream_dir} segment {plan.segment}: chunk {c.chunk_id} at "
                    f"{c.position} says chunk type {header.chunk_type} but is not a valid "
                    f"tracking chunk ({exc}); not uploaded, tiering of the stream stops"
                ) from exc
        buffers.append(buf)
        infos.append(
            FragmentChunkInfo(
                chunk_id=c.chunk_id,
                timestamp=c.timestamp,
                epoch=c.epoch,
                size=c.size,
                num_records=c.next_offset - c.chunk_id,
                crc=c.data_crc,
                chunk_type=c.chunk_type,
                num_entries=header.num_entries,
            )
        )
    placement = FragmentPlacement(
        seq_no=plan.seq, segment_first_offset=plan.segment, segment_position=first.position
    )
    key = remote.fragment_key(plan.first_offset)
    settings = coder.settings() if coder is not None else None
    if coder is not None and settings is not None and settings.cold_coding:
        body_v2 = coder.encode(key, placement, buffers, infos, settings)
        return body_v2, plan.entry(key), settings.encryption != "none"
    if any(buf[BLOOM_SIZE_POS] for buf in buffers):
        # chunks with bloom filters (filter values were published): format v2, whose index
        # carries every chunk's bloom, so filtering readers skip chunks from the index alone
        # (frames stored as they are, like v1's chunks)
        parts_v2, _ = encode_fragment_v2(placement, buffers, infos, FrameCoding(codec=CODEC_NONE))
        return bytearray().join(parts_v2), plan.entry(key), False
    parts, _trailer = encode_fragment(placement, buffers, infos)
    head, index, trailer = parts[0], parts[-2], parts[-1]
    body[:HEADER_SIZE] = head
    at = HEADER_SIZE + span
    body[at : at + len(index)] = index
    body[at + len(index) :] = trailer
    return body, plan.entry(remote.fragment_key(plan.first_offset)), False


def adopt_existing(
    stream_log: StreamLog, remote: RemoteStream, epoch: int, plan: FragmentPlan
) -> FragmentEntry:
    """The key exists (an earlier attempt, or a crashed writer's upload)."""
    fragment = read_fragment_checked(remote, plan.first_offset)
    if fragment is None:
        raise StorageError(f"fragment {plan.first_offset} vanished after AlreadyExists")
    t = fragment.trailer
    held = local_chunks(stream_log, t.first_offset, t.next_offset)
    problem = adoption_problem(fragment, epoch, held)
    if problem is not None:
        raise FragmentConflictError(problem)
    if t.next_offset > stream_log.commit_point().next_offset:
        raise FragmentConflictError(
            f"fragment {t.first_offset} ends at {t.next_offset}, past the local commit"
        )
    return fragment.entry()
