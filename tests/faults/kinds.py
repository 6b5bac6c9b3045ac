"""File kinds of the local log and the fragment remote tier, registered for the matrix."""

from __future__ import annotations

import glob
import os

from tests.faults.registry import FileKind, Target, register_file_kind
from tests.faults.stream import CampaignStream
from tierlog.formats.chunk import HEADER_SIZE, ChunkType
from tierlog.formats.fragment import TRAILER_SIZE, decode_trailer
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.segment_files import scan_segment

META_POINTER = "meta:pointer"


def _segments(stream: CampaignStream) -> list[str]:
    return sorted(glob.glob(os.path.join(stream.stream_dir, "*.segment")))


def _chunks(stream: CampaignStream) -> list[tuple[str, int, int, int]]:
    """(segment path, position, size, chunk type) of every local chunk."""
    out = []
    for path in _segments(stream):
        first = int(os.path.basename(path)[:20])
        for c in scan_segment(path, first).chunks:
            out.append((path, c.position, c.size, c.chunk_type))
    return out


def _objects(stream: CampaignStream, suffix: str) -> list[str]:
    return sorted(glob.glob(os.path.join(stream.objects, "**", f"*{suffix}*"), recursive=True))


def chunk_headers(stream: CampaignStream) -> list[Target]:
    return [
        Target(path, pos, pos + HEADER_SIZE, True)
        for path, pos, _size, kind in _chunks(stream)
        if kind == ChunkType.USER
    ]


def chunk_data(stream: CampaignStream) -> list[Target]:
    return [
        Target(path, pos + HEADER_SIZE, pos + size, True)
        for path, pos, size, kind in _chunks(stream)
        if kind == ChunkType.USER
    ]


def tracking_chunks(stream: CampaignStream) -> list[Target]:
    return [
        Target(path, pos, pos + size, True)
        for path, pos, size, kind in _chunks(stream)
        if kind != ChunkType.USER
    ]


def index_records(stream: CampaignStream) -> list[Target]:
    out = []
    for path in sorted(glob.glob(os.path.join(stream.stream_dir, "*.index"))):
        size = os.path.getsize(path)
        if size > FILE_HEADER_SIZE:
            out.append(Target(path, FILE_HEADER_SIZE, size, True))
    return out


def _fragments(stream: CampaignStream) -> list[tuple[str, int, int]]:
    """(path, data end, index end) of every fragment object."""
    out = []
    for path in _objects(stream, ".fragment"):
        with open(path, "rb") as f:
            data = f.read()
        t = decode_trailer(data[-TRAILER_SIZE:])
        out.append((path, 8 + t.data_size, len(data) - TRAILER_SIZE))
    return out


def fragment_data(stream: CampaignStream) -> list[Target]:
    return [Target(p, 8, data_end, False) for p, data_end, _ in _fragments(stream)]


def fragment_index(stream: CampaignStream) -> list[Target]:
    return [Target(p, data_end, index_end, False) for p, data_end, index_end in _fragments(stream)]


def fragment_trailer(stream: CampaignStream) -> list[Target]:
    return [
        Target(p, index_end, index_end + TRAILER_SIZE, False)
        for p, _, index_end in _fragments(stream)
    ]


def manifest_roots(stream: CampaignStream) -> list[Target]:
    return [Target(p, 0, os.path.getsize(p), False) for p in _objects(stream, ".manifest")]


def manifest_branches(stream: CampaignStream) -> list[Target]:
    return [Target(p, 0, os.path.getsize(p), False) for p in _objects(stream, "group")]


def meta_pointer(stream: CampaignStream) -> list[Target]:
    return [Target(META_POINTER, 0, 1 << 30, False)]


for kind in (
    FileKind("segment chunk header", chunk_headers, True),
    FileKind("segment chunk data", chunk_data, True),
    FileKind("tracking chunk", tracking_chunks, True),
    FileKind("index record", index_records, True),
    FileKind("fragment data", fragment_data, False),
    FileKind("fragment index", fragment_index, False),
    FileKind("fragment trailer", fragment_trailer, False),
    FileKind("manifest root", manifest_roots, False),
    FileKind("manifest branch", manifest_branches, False),
    FileKind("metastore pointer", meta_pointer, False),
):
    register_file_kind(kind)
