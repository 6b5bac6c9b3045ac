"""The corruption matrix's header cells made deterministic: the chunk type byte (outside
the data CRC) of every local chunk, flipped to each other type, on the campaign stream
(head remote-only, middle in both tiers, tail local-only), judged by the matrix's oracle
after a restart: exactly the confirmed records, or a typed refusal naming the file;
never a chunk skipped as "tracking" or a tracking chunk served as records."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.faults.kinds import _chunks
from tests.faults.registry import Target
from tests.faults.stream import CampaignStream, build, restart_and_read
from tests.faults.test_corruption_matrix import files_of, judge
from tierlog.formats.chunk import CHUNK_TYPE_POS, ChunkType


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> CampaignStream:
    return build(str(tmp_path_factory.mktemp("typeflips") / "pristine"))


def test_every_chunk_type_flip_is_served_or_refused(
    tmp_path: Path, campaign: CampaignStream
) -> None:
    chunks = _chunks(campaign)
    verdicts: collections.Counter[str] = collections.Counter()
    for path, position, size, chunk_type in chunks:
        for to_type in (0, 1, 2, 3):
            if to_type == chunk_type:
                continue
            stream = campaign.copy_to(str(tmp_path / "copy"))
            local = path.replace(campaign.root, stream.root)
            with open(local, "r+b") as f:
                f.seek(position + CHUNK_TYPE_POS)
                f.write(bytes([to_type]))
            before = files_of(stream)
            outcome = restart_and_read(stream)
            target = Target(local, position, position + size, True)
            verdict = judge(stream, target, "bitflip", outcome, before)
            verdicts[f"{ChunkType(chunk_type).name}->{to_type}/{verdict}"] += 1
    print(dict(sorted(verdicts.items())))
    assert sum(verdicts.values()) == sum(3 for _ in chunks)


def test_every_record_count_flip_is_served_or_refused(
    tmp_path: Path, campaign: CampaignStream
) -> None:
    """The record count (outside the CRC) one up or down: caught at the damaged chunk
    itself (the next chunk's id disagrees), so its remote copy is served where one
    exists; never records under shifted offsets or a reader that looks caught up."""
    verdicts: collections.Counter[str] = collections.Counter()
    for path, position, size, chunk_type in _chunks(campaign):
        if chunk_type != ChunkType.USER:
            continue
        for at, bit in ((7, 0), (7, 1), (4, 0)):  # low bits, and 2^24 more records
            stream = campaign.copy_to(str(tmp_path / "copy"))
            local = path.replace(campaign.root, stream.root)
            with open(local, "r+b") as f:
                f.seek(position + at)
                byte = f.read(1)[0]
                f.seek(position + at)
                f.write(bytes([byte ^ (1 << bit)]))
            before = files_of(stream)
            outcome = restart_and_read(stream)
            target = Target(local, position, position + size, True)
            verdicts[judge(stream, target, "bitflip", outcome, before)] += 1
    print(dict(sorted(verdicts.items())))
    assert verdicts["intact"] + verdicts["repaired"] > 0
