"""Bit flips in a user chunk's Osiris header, field by field, in a sealed and in the last
segment. The chunk CRC covers the entry data only, so a header field is trusted only
where something corroborates it; a flipped chunk type that turned a user chunk into a
"tracking" chunk used to be skipped silently by readers.

Oracle: every record is read back exactly once, in order, or the open / read is refused
with a typed error naming the segment; a flip is never a silent skip.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tierlog.formats.chunk import ChunkType
from tierlog.log.config import LogConfig
from tierlog.log.errors import CorruptChunkError, DamagedSegmentError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader, LogView
from tierlog.log.segment_files import scan_segment
from tierlog.log.writer import StreamLog

RECORDS_PER_CHUNK = 5

# (field, byte position in the header, bit): the type to each other value (1, 2, and the
# unknown 4), then one bit of every other field outside the CRC'd data
FLIPS = [
    ("type->delta", 1, 0),
    ("type->snapshot", 1, 1),
    ("type->unknown", 1, 2),
    ("num_entries", 3, 0),
    ("num_records", 7, 1),
    ("num_records-high", 4, 0),  # past the committed end: the reader looked caught up
    ("timestamp", 15, 3),
    ("epoch", 23, 0),
    ("chunk_id", 31, 2),
    ("data_length", 39, 0),
]


def build(base: Path) -> tuple[str, list[tuple[int, bytes]]]:
    """Three segments of 4 chunks; every user chunk holds 5 records of varying length."""
    log = StreamLog.create(str(base), "/", "s", LogConfig(max_segment_chunks=4), created_ns=1)
    for i in range(10):
        log.append([b"%d-%d:" % (i, j) + b"x" * (j + i % 3) for j in range(RECORDS_PER_CHUNK)])
        if i == 4:
            log.store_offset("c", 3)  # a real tracking chunk in the middle
    expected = read_all(log)
    stream_dir = log.stream_dir
    log.close()
    return stream_dir, expected


def read_all(source: StreamLog | LogView) -> list[tuple[int, bytes]]:
    with LogReader(source, OffsetSpec.first()) as r:
        return [(o, bytes(b)) for o, b in r.records()]


def user_chunks(stream_dir: str) -> list[tuple[str, int, bool]]:
    """(segment path, chunk position, is the segment's first/last chunk) of user chunks."""
    out = []
    segments = sorted(n for n in os.listdir(stream_dir) if n.endswith(".segment"))
    for name in segments:
        path = os.path.join(stream_dir, name)
        chunks = scan_segment(path, int(name[:20])).chunks
        for k, c in enumerate(chunks):
            if c.chunk_type == ChunkType.USER:
                out.append((path, c.position, k in (0, len(chunks) - 1)))
    return out


def flip(path: str, at: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << bit)]))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[tuple[int, bytes]]]:
    return build(tmp_path_factory.mktemp("flips"))


def victims(stream_dir: str) -> dict[str, tuple[str, int]]:
    """A middle chunk of a sealed segment (only readers meet it: the open checks a sealed
    segment through its index, first and last chunk) and a middle chunk of the last."""
    chunks = user_chunks(stream_dir)
    segments = sorted({p for p, _, _ in chunks})
    sealed = next((p, pos) for p, pos, edge in chunks if p == segments[0] and not edge)
    last = next((p, pos) for p, pos, edge in chunks if p == segments[-1] and not edge)
    sealed_last = [(p, pos) for p, pos, edge in chunks if p == segments[0] and edge][-1]
    return {"sealed-middle": sealed, "sealed-last": sealed_last, "last-middle": last}


def check_read(stream_dir: str, expected: list[tuple[int, bytes]], damaged: str) -> str:
    """Open and read everything: the exact records, or a typed refusal naming the file."""
    try:
        log = StreamLog.open(stream_dir)
    except DamagedSegmentError as exc:
        assert exc.segment_path == damaged
        return "refused at open"
    try:
        got = read_all(log)
    except CorruptChunkError as exc:
        assert damaged in str(exc)
        return "refused at read"
    finally:
        log.close()
    assert got == expected, "records skipped, added or changed"
    return "intact"


@pytest.mark.parametrize("where", ["sealed-middle", "sealed-last", "last-middle"])
@pytest.mark.parametrize(("field", "at", "bit"), FLIPS, ids=[f[0] for f in FLIPS])
def test_header_flip_is_never_a_silent_skip(
    tmp_path: Path,
    pristine: tuple[str, list[tuple[int, bytes]]],
    where: str,
    field: str,
    at: int,
    bit: int,
) -> None:
    src, expected = pristine
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    path, position = victims(stream_dir)[where]
    damaged = os.path.join(stream_dir, os.path.basename(path))
    flip(damaged, position + at, bit)
    verdict = check_read(stream_dir, expected, damaged)
    if field.startswith("type"):
        assert verdict != "intact"  # the chunk's records cannot be served under that type


@pytest.mark.parametrize("to_type", [ChunkType.TRACKING_DELTA, ChunkType.TRACKING_SNAPSHOT])
def test_type_flip_after_open_is_refused_by_readers(
    tmp_path: Path, pristine: tuple[str, list[tuple[int, bytes]]], to_type: int
) -> None:
    """A reader that reaches the chunk without recovery having looked at it (bit rot after
    the open, or a sealed segment's middle chunk) refuses instead of skipping, whether it
    skips tracking chunks or hands them out, and whatever its CRC setting."""
    src, expected = pristine
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    log = StreamLog.open(stream_dir)
    try:
        assert read_all(log) == expected
        path, position = victims(stream_dir)["sealed-middle"]
        flip(path, position + 1, to_type - 1)
        for verify in (True, False, "always"):
            with (
                pytest.raises(CorruptChunkError, match=os.path.basename(path)),
                LogReader(log, OffsetSpec.first(), verify_crc=verify) as r,  # type: ignore[arg-type]
            ):
                list(r.records())
        with (
            pytest.raises(CorruptChunkError),
            LogReader(log, OffsetSpec.first(), user_only=False) as r,
        ):
            list(r.chunks())
    finally:
        log.close()


@pytest.mark.parametrize(("at", "bit"), [(1, 0), (1, 1), (1, 2), (1, 7), (3, 0), (4, 0), (7, 1)])
def test_header_flip_in_last_chunk_is_not_cut_as_a_torn_tail(
    tmp_path: Path, pristine: tuple[str, list[tuple[int, bytes]]], at: int, bit: int
) -> None:
    """The last chunk of the log has no right neighbour; a complete chunk whose data CRC
    matches and whose index record names it is no torn write, whichever header field
    outside the CRC (type, entry count, record count) is wrong: refused, not cut."""
    src, _expected = pristine
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    path, position, _ = user_chunks(stream_dir)[-1]
    flip(path, position + at, bit)
    before = Path(path).read_bytes()
    with pytest.raises(DamagedSegmentError) as info:
        StreamLog.open(stream_dir)
    assert info.value.segment_path == path
    assert Path(path).read_bytes() == before  # nothing cut


def test_tracking_chunk_typed_as_user_is_refused(
    tmp_path: Path, pristine: tuple[str, list[tuple[int, bytes]]]
) -> None:
    """The other direction: a tracking delta in the middle of a sealed segment whose type
    reads "user" would be handed out as a record; its index record says otherwise."""
    src, expected = pristine
    stream_dir = str(tmp_path / "s")
    shutil.copytree(src, stream_dir)
    segments = sorted(n for n in os.listdir(stream_dir) if n.endswith(".segment"))
    found = []
    for name in segments[:-1]:
        path = os.path.join(stream_dir, name)
        chunks = scan_segment(path, int(name[:20])).chunks
        found += [
            (path, c.position) for c in chunks[1:-1] if c.chunk_type == ChunkType.TRACKING_DELTA
        ]
    assert found, "the pristine log has a tracking delta inside a sealed segment"
    path, position = found[0]
    flip(path, position + 1, 0)  # delta (1) -> user (0)
    assert check_read(stream_dir, expected, path) != "intact"
