"""The library surface, used only through the public names ``tierlog`` exports: a stream
on a local directory tiered to a real object store (filesystem and SeaweedFS S3), read
back across tiers by offset, time and named position, reopened after close."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import tierlog
from tests.plugins.seaweed import SeaweedServer

SMALL = {
    "segment_bytes": 64 * 1024,
    "fragment_bytes": 32 * 1024,
    "max_fragment_age_seconds": 0.2,
}


def bodies(start: int, n: int) -> list[bytes]:
    return [f"record-{i:06d}-".encode() + os.urandom(200) for i in range(start, start + n)]


@pytest.fixture(params=["fs", pytest.param("s3", marks=pytest.mark.s3)])
def store_uri(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    if request.param == "fs":
        return f"file://{tmp_path / 'bucket'}"
    seaweed: SeaweedServer = request.getfixturevalue("seaweed")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    return (
        f"s3://{seaweed.bucket}/lib-{uuid.uuid4().hex}"
        f"?endpoint={seaweed.endpoint}&region={seaweed.region}"
    )


def test_public_surface_is_what_the_library_guide_names() -> None:
    assert sorted(tierlog.__all__) == sorted(
        [
            "Appended",
            "BottomlessLog",
            "LogClosedError",
            "OffsetOvertakenError",
            "Record",
            "Start",
            "TierlogError",
            "__version__",
        ]
    )
    for name in tierlog.__all__:
        assert getattr(tierlog, name) is not None
    with pytest.raises(AttributeError):
        _ = tierlog.NoSuchName  # type: ignore[attr-defined]
    assert (Path(tierlog.__file__).parent / "py.typed").exists()


def test_append_tier_free_local_and_read_across_tiers(tmp_path: Path, store_uri: str) -> None:
    written: list[bytes] = []
    with tierlog.BottomlessLog.open(
        tmp_path / "data", store_uri, "orders", local_max_bytes=0, **SMALL
    ) as log:
        for batch in range(40):
            chunk = bodies(batch * 50, 50)
            appended = log.append(chunk)
            assert appended.first_offset == len(written)
            assert appended.last_offset == len(written) + 49 and appended.duplicates == 0
            written.extend(chunk)
        assert log.next_offset == len(written)
        assert log.flush(timeout=60)
        assert log.tiered_offset == len(written)
        stream_dir = tmp_path / "data" / log.record.incarnation
        segments = sorted(stream_dir.glob("*.segment"))
        # local retention freed what the bucket holds: only the active segment is left
        assert len(segments) == 1
        assert log.first_offset == 0
        records = list(log.read("first"))
        assert [r.offset for r in records] == list(range(len(written)))
        assert [r.body for r in records] == written  # the oldest ones from the bucket
        middle = list(log.read(1000, count=5))
        assert [r.offset for r in middle] == list(range(1000, 1005))
        assert [r.body for r in middle] == written[1000:1005]
        assert [r.offset for r in log.read("last")][-1] == len(written) - 1
        assert list(log.read("next")) == []


def test_reopen_continues_offsets_and_reads_by_time(tmp_path: Path, store_uri: str) -> None:
    data = tmp_path / "data"
    with tierlog.BottomlessLog.open(data, store_uri, "events", **SMALL) as log:
        log.append(bodies(0, 10))
    before = datetime.now(UTC)
    with tierlog.BottomlessLog.open(data, store_uri, "events", **SMALL) as log:
        assert log.next_offset == 10
        appended = log.append(bodies(10, 10))
        assert appended.first_offset == 10
        late = list(log.read(before - timedelta(milliseconds=1)))
        assert late and late[0].offset >= 10 and late[-1].offset == 19
        assert all(r.timestamp_ms >= int(before.timestamp() * 1000) - 1 for r in late)
        assert [r.offset for r in log.read(0)] == list(range(20))


def test_named_producer_resend_is_deduplicated(tmp_path: Path, store_uri: str) -> None:
    with tierlog.BottomlessLog.open(tmp_path / "d", store_uri, "dedup", **SMALL) as log:
        first = log.append(bodies(0, 5), producer="p1", publishing_ids=[1, 2, 3, 4, 5])
        assert (first.first_offset, first.last_offset, first.duplicates) == (0, 4, 0)
        again = log.append(bodies(3, 4), producer="p1", publishing_ids=[4, 5, 6, 7])
        assert again.duplicates == 2 and (again.first_offset, again.last_offset) == (5, 6)
        assert [r.offset for r in log.read()] == list(range(7))


def test_bad_input_is_refused_with_typed_errors(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'bucket'}"
    with pytest.raises(tierlog.TierlogError):
        tierlog.BottomlessLog.open(tmp_path / "d", uri, "bad/name")
    with pytest.raises(tierlog.TierlogError):
        tierlog.BottomlessLog.open(tmp_path / "d", "nope://x", "s")
    with pytest.raises(tierlog.TierlogError):
        tierlog.BottomlessLog.open(tmp_path / "d", uri, "s", local_max_bytes=-1)
    log = tierlog.BottomlessLog.open(tmp_path / "d", uri, "s", **SMALL)
    with pytest.raises(ValueError):
        list(log.read(-1))
    with pytest.raises(ValueError):
        list(log.read(datetime(2026, 1, 1)))  # naive time: which zone?
    with pytest.raises(ValueError):
        log.append([])
    log.close()
    with pytest.raises(tierlog.LogClosedError):
        log.append([b"x"])
    log.close()  # twice is fine


def test_the_library_guide_runs_as_written(tmp_path: Path) -> None:
    """Every Python block of docs/library.md runs, in a fresh interpreter, as written."""
    import re
    import subprocess
    import sys

    guide = (Path(__file__).resolve().parents[2] / "docs" / "library.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
    assert blocks
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "0 1" in done.stdout
