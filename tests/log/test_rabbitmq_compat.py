"""Compatibility with a stream directory written by a real RabbitMQ (Osiris) node.

The fixture in tests/data/rabbitmq/ was produced by scripts/make_rabbitmq_fixture.py: a private
RabbitMQ 3.10 node with the stream plugin, driven by ``rstream``. ``expected.json`` holds what
RabbitMQ itself delivered back (offset, chunk timestamp, body of every record, in order), the
named producer's last publishing id and the named consumer's stored offset.
"""

from __future__ import annotations

import base64
import filecmp
import itertools
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.rabbitmq

FIXTURE_ROOT = Path(__file__).parent.parent / "data" / "rabbitmq"
MAX_FIXTURE_BYTES = 1024 * 1024
CHUNK_USER, CHUNK_TRACKING_DELTA, CHUNK_TRACKING_SNAPSHOT = 0, 1, 2


@dataclass(frozen=True)
class TrackingState:
    """Tracking state of a stream directory, as a restarted writer would rebuild it."""

    producers: dict[str, int]
    """Producer name -> last publishing id (deduplication sequence)."""
    consumers: dict[str, int]
    """Consumer name -> stored offset."""


def read_tracking(stream_dir: Path) -> TrackingState:
    """Rebuild producer sequences and consumer offsets from the stream directory's chunks."""
    from tierlog.log.reader import LogView

    view = LogView(str(stream_dir))  # read-only: repairs nothing
    return TrackingState(
        {k.decode(): seq for k, (_, seq) in view.tracking.sequences.items()},
        {k.decode(): off for k, off in view.tracking.offsets.items()},
    )


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURE_ROOT / "expected.json").read_text())
    return document


@pytest.fixture
def stream_copy(expected: dict[str, Any], tmp_path: Path) -> Path:
    """A private copy of the fixture, so nothing a reader does can alter the committed bytes."""
    target = tmp_path / str(expected["stream_dir"])
    shutil.copytree(FIXTURE_ROOT / str(expected["stream_dir"]), target)
    return target


def run_dump(stream_dir: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "dump", str(stream_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"dump failed ({result.returncode}): {result.stderr[-3000:]}"
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_fixture_meets_the_acceptance_shape(expected: dict[str, Any]) -> None:
    """The committed fixture holds what the compatibility tests need (guards against a bad
    regeneration)."""
    stream_dir = FIXTURE_ROOT / expected["stream_dir"]
    files = [p for p in FIXTURE_ROOT.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= MAX_FIXTURE_BYTES
    assert sorted(p.name for p in stream_dir.iterdir()) == sorted(
        expected["segments"] + expected["indexes"]
    )
    assert len(expected["segments"]) >= 2
    chunks = expected["chunks"]
    types = {c["type"] for c in chunks}
    assert {CHUNK_USER, CHUNK_TRACKING_DELTA, CHUNK_TRACKING_SNAPSHOT} <= types
    # Sub-batch entries: a user chunk holding more records than entries.
    assert any(c["num_records"] > c["num_entries"] for c in chunks if c["type"] == CHUNK_USER)
    # Every later segment starts with a tracking snapshot.
    for segment in expected["segments"][1:]:
        first = min((c for c in chunks if c["segment"] == segment), key=lambda c: c["position"])
        assert first["type"] == CHUNK_TRACKING_SNAPSHOT
    records = expected["records"]
    assert len(records) == expected["record_count"]
    user_records = sum(c["num_records"] for c in chunks if c["type"] == CHUNK_USER)
    assert user_records == len(records)


def test_dump_reads_every_record(expected: dict[str, Any], stream_copy: Path) -> None:
    dumped = run_dump(stream_copy)
    want = expected["records"]

    assert [d["body"] for d in dumped] == [r["body"] for r in want]
    assert [d["offset"] for d in dumped] == [r["offset"] for r in want]
    offsets = [d["offset"] for d in dumped]
    assert all(a < b for a, b in itertools.pairwise(offsets))

    user_chunks = {c["chunk_id"]: c for c in expected["chunks"] if c["type"] == CHUNK_USER}
    tracking_ids = {c["chunk_id"] for c in expected["chunks"] if c["type"] != CHUNK_USER}
    low_ms, high_ms = expected["written_between_ms"]
    absent = set(expected["absent_bodies"])
    for record, want_record in zip(dumped, want, strict=True):
        assert set(record) >= {"offset", "chunk_id", "timestamp", "epoch", "body"}
        chunk = user_chunks.get(record["chunk_id"])
        assert chunk is not None, f"record {record['offset']} names no user chunk"
        assert chunk["chunk_id"] <= record["offset"] < chunk["chunk_id"] + chunk["num_records"]
        assert record["offset"] not in tracking_ids
        assert record["timestamp"] == want_record["timestamp"] == chunk["timestamp"]
        assert low_ms <= record["timestamp"] <= high_ms
        assert record["epoch"] == chunk["epoch"] == 1
        assert record["body"] not in absent
        base64.b64decode(record["body"], validate=True)


def test_dump_leaves_the_directory_untouched(expected: dict[str, Any], stream_copy: Path) -> None:
    """Dumping is read-only: no recovery, truncation or index rebuild on RabbitMQ's files."""
    run_dump(stream_copy)
    original = FIXTURE_ROOT / expected["stream_dir"]
    names = sorted(p.name for p in original.iterdir())
    assert sorted(p.name for p in stream_copy.iterdir()) == names
    _, mismatch, errors = filecmp.cmpfiles(original, stream_copy, names, shallow=False)
    assert mismatch == [] and errors == []


def test_dump_rejects_a_directory_that_is_not_a_stream(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "dump", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert result.stdout.strip() == ""
    assert "Traceback" not in result.stderr


def test_tracking_matches_rabbitmq(expected: dict[str, Any], stream_copy: Path) -> None:
    state = read_tracking(stream_copy)
    producer, consumer = expected["producer"], expected["consumer"]
    assert state.producers[producer["name"]] == producer["last_publishing_id"]
    assert state.consumers[consumer["name"]] == consumer["offset"]
