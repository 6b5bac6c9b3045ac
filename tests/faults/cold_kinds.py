"""File kinds of an encrypted (compressed, dictionary, sealed) stream and its key index,
registered for the corruption matrix: sealed manifest roots and branches, v2 fragment frames
and index, the sealed key-index manifest and window files (the campaign's 2 KiB fragments
are too small to train a dictionary; sealed dictionaries are tampered with in
tests/remote/test_sealing.py). Their damage
must end in a typed refusal or the right data, never wrong records (reads and key lookups)."""

from __future__ import annotations

import glob
import os

from tests.faults.registry import FileKind, Target, register_file_kind
from tests.faults.stream import ENCRYPTED_CAMPAIGN, CampaignStream
from tierlog.formats.fragment import TRAILER_SIZE
from tierlog.formats.fragment_v2 import decode_trailer


def _objects(stream: CampaignStream, pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(stream.objects, "**", pattern), recursive=True))


def _whole(paths: list[str]) -> list[Target]:
    return [Target(p, 0, os.path.getsize(p), False) for p in paths]


def sealed_roots(stream: CampaignStream) -> list[Target]:
    return _whole(_objects(stream, "root.*.manifest*"))


def sealed_branches(stream: CampaignStream) -> list[Target]:
    return _whole(_objects(stream, "*group*"))


def _fragments(stream: CampaignStream) -> list[tuple[str, int, int]]:
    out = []
    for path in _objects(stream, "*.fragment*"):
        with open(path, "rb") as f:
            data = f.read()
        t = decode_trailer(data[-TRAILER_SIZE:])
        out.append((path, t.index_start, len(data) - TRAILER_SIZE))
    return out


def encrypted_frames(stream: CampaignStream) -> list[Target]:
    return [Target(p, 8, frames_end, False) for p, frames_end, _ in _fragments(stream)]


def encrypted_fragment_index(stream: CampaignStream) -> list[Target]:
    return [Target(p, start, end, False) for p, start, end in _fragments(stream)]


def key_index_manifests(stream: CampaignStream) -> list[Target]:
    return _whole(_objects(stream, "*.kim*"))


def key_index_files(stream: CampaignStream) -> list[Target]:
    return _whole(_objects(stream, "*.kidx*"))


for kind in (
    FileKind("sealed manifest root", sealed_roots, False, campaign=ENCRYPTED_CAMPAIGN),
    FileKind("sealed manifest branch", sealed_branches, False, campaign=ENCRYPTED_CAMPAIGN),
    FileKind("encrypted fragment frames", encrypted_frames, False, campaign=ENCRYPTED_CAMPAIGN),
    FileKind(
        "encrypted fragment index", encrypted_fragment_index, False, campaign=ENCRYPTED_CAMPAIGN
    ),
    FileKind("key-index manifest", key_index_manifests, False, campaign=ENCRYPTED_CAMPAIGN),
    FileKind("sealed key-index file", key_index_files, False, campaign=ENCRYPTED_CAMPAIGN),
):
    register_file_kind(kind)
