"""File kinds of an encrypted segment-mode stream (offload format 2), registered for the fault
campaigns: its sealed data objects (header with the key block, then one frame per chunk) and
its sealed index objects, plus the sealed manifest root that names them. The campaign is an
encrypted segment-mode stream whose head is only in the object store
(``tests/faults/test_sealed_segment_faults.py``): damage must end in the right records or a
typed refusal, never wrong records."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from tests.faults.registry import FileKind, Target, register_file_kind

SEGMENT_CAMPAIGN = "encrypted-segment-stream"


@dataclass
class SegmentCampaign:
    """The built stream: its root (``meta.db``, ``data/`` and ``objects/``), its stream
    directory name and the records it confirmed."""

    root: str
    stream_dir_name: str
    confirmed: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def objects(self) -> str:
        return os.path.join(self.root, "objects")

    @property
    def stream_dir(self) -> str:
        return os.path.join(self.root, "data", self.stream_dir_name)


def _objects(stream: SegmentCampaign, pattern: str) -> list[Target]:
    paths = sorted(glob.glob(os.path.join(stream.objects, "**", pattern), recursive=True))
    return [Target(p, 0, os.path.getsize(p), False) for p in paths]


def sealed_segment_data(stream: SegmentCampaign) -> list[Target]:
    return _objects(stream, "*.data*")


def sealed_segment_frames(stream: SegmentCampaign) -> list[Target]:
    """The frames only (past the 74-byte header: the campaign key id "k1"): chunk damage."""
    return [Target(t.path, 74, t.end, False) for t in sealed_segment_data(stream)]


def sealed_segment_index(stream: SegmentCampaign) -> list[Target]:
    return _objects(stream, "*.index*")


def sealed_segment_root(stream: SegmentCampaign) -> list[Target]:
    return _objects(stream, "root.*.manifest*")


SEGMENT_KINDS = [
    register_file_kind(
        FileKind("sealed segment data object", sealed_segment_data, False, SEGMENT_CAMPAIGN)  # type: ignore[arg-type]
    ),
    register_file_kind(
        FileKind("sealed segment frames", sealed_segment_frames, False, SEGMENT_CAMPAIGN)  # type: ignore[arg-type]
    ),
    register_file_kind(
        FileKind("sealed segment index", sealed_segment_index, False, SEGMENT_CAMPAIGN)  # type: ignore[arg-type]
    ),
    register_file_kind(
        FileKind("sealed segment-stream root", sealed_segment_root, False, SEGMENT_CAMPAIGN)  # type: ignore[arg-type]
    ),
]
