"""Crash recovery: torn and corrupt tails, damaged indexes, read-only views."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierlog.formats.chunk import HEADER_SIZE
from tierlog.log.config import LogConfig
from tierlog.log.damage import patch_segment, quarantine
from tierlog.log.errors import CorruptChunkError, DamagedSegmentError, NotAStreamError
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader, LogView
from tierlog.log.segment_files import encode_index, read_file, scan_segment
from tierlog.log.writer import StreamLog


def build(base: Path, **cfg: object) -> tuple[str, list[tuple[int, int, int, list[bytes]]]]:
    """A small log; returns its dir and (chunk id, position, size, records) per chunk."""
    log = StreamLog.create(str(base), "/", "s", LogConfig(**cfg), created_ns=1)  # type: ignore[arg-type]
    for i in range(12):
        log.append(
            [b"%d-%d" % (i, j) * (1 + (i * 7 + j) % 13) for j in range(1 + i % 4)],
            producer="p",
            publishing_ids=list(range(i * 10, i * 10 + 1 + i % 4)),
        )
        if i % 5 == 0:
            log.store_offset("c", i)
    chunks = []
    with log.reader(OffsetSpec.first(), user_only=False) as r:
        for c in r.chunks():
            recs = [bytes(b) for _, b in c.records()] if c.header.chunk_type == 0 else []
            chunks.append((c.header.chunk_id, c.position, c.size, recs))
    stream_dir = log.stream_dir
    log.close()
    return stream_dir, chunks


@pytest.fixture(scope="module")
def pristine(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, list[tuple[int, int, int, list[bytes]]]]:
    return build(tmp_path_factory.mktemp("pristine"))


def end_offset(chunks: list[tuple[int, int, int, list[bytes]]]) -> int:
    """The next offset after the last chunk (tracking chunks hold one record)."""
    return chunks[-1][0] + max(1, len(chunks[-1][3]))


def copy_of(src: str, dst: Path) -> str:
    target = dst / os.path.basename(src)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target)
    return str(target)


def served(log: StreamLog) -> list[tuple[int, list[bytes]]]:
    with log.reader(OffsetSpec.first(), user_only=False) as r:
        return [
            (
                c.header.chunk_id,
                [bytes(b) for _, b in c.records()] if c.header.chunk_type == 0 else [],
            )
            for c in r.chunks()
        ]


def segment_path(stream_dir: str) -> str:
    return os.path.join(stream_dir, "00000000000000000000.segment")


def index_path(stream_dir: str) -> str:
    return os.path.join(stream_dir, "00000000000000000000.index")


def check_consistent(stream_dir: str, log: StreamLog) -> None:
    scan = scan_segment(segment_path(stream_dir), 0)
    assert scan.damage is None and scan.valid_end == scan.file_size
    assert read_file(index_path(stream_dir)) == encode_index(scan.chunks)
    # the log continues from the last good chunk
    nxt = log.next_offset
    assert log.append([b"after-recovery"]).first_offset == nxt


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_tail_keeps_exact_prefix(
    tmp_path: Path,
    pristine: tuple[str, list[tuple[int, int, int, list[bytes]]]],
    data: st.DataObject,
) -> None:
    src, chunks = pristine
    size = os.path.getsize(segment_path(src))
    cut = data.draw(st.integers(8, size - 1))
    stream_dir = copy_of(src, tmp_path)
    os.truncate(segment_path(stream_dir), cut)
    expected = [(cid, recs) for cid, pos, sz, recs in chunks if pos + sz <= cut]
    log = StreamLog.open(stream_dir)
    assert served(log) == expected
    assert log.next_offset == (chunks[len(expected)][0] if expected or cut >= 8 else 0)
    check_consistent(stream_dir, log)
    log.close()


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_flipped_byte_never_served(
    tmp_path: Path,
    pristine: tuple[str, list[tuple[int, int, int, list[bytes]]]],
    data: st.DataObject,
) -> None:
    src, chunks = pristine
    size = os.path.getsize(segment_path(src))
    pos = data.draw(st.integers(8, size - 1))
    bit = data.draw(st.integers(0, 7))
    stream_dir = copy_of(src, tmp_path)
    with open(segment_path(stream_dir), "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ (1 << bit)]))
    hit = next(j for j, (_, p, sz, _) in enumerate(chunks) if p <= pos < p + sz)
    try:
        log = StreamLog.open(stream_dir)
    except DamagedSegmentError as exc:
        # damage followed by trustworthy chunks is never cut: refused, file named, no change;
        # the last chunk's header (no right neighbour) is refused when its index disagrees
        assert hit < len(chunks) - 1 or pos < chunks[hit][1] + HEADER_SIZE
        assert exc.segment_path == segment_path(stream_dir)
        assert exc.first_offset <= chunks[hit][0]
        assert exc.end_offset is None or exc.end_offset > chunks[hit][0]
        return
    got = served(log)
    original = [(cid, recs) for cid, _, _, recs in chunks]
    # exactly a prefix, nothing before the damage is lost; only the last chunk may be cut
    assert got == original[: len(got)]
    assert len(got) >= min(hit, len(chunks) - 1)
    _, cpos, _, _ = chunks[hit]
    in_data = pos >= cpos + HEADER_SIZE and pos < cpos + chunks[hit][2]
    if in_data and len(got) > hit:
        # only a trailer byte (not covered by the CRC) may be kept
        assert (
            pos >= cpos + HEADER_SIZE + sum(4 + len(r) for r in chunks[hit][3])
            or not chunks[hit][3]
        )
    check_consistent(stream_dir, log)
    log.close()


def test_missing_short_and_garbage_index_rebuilt(
    tmp_path: Path, pristine: tuple[str, list[tuple[int, int, int, list[bytes]]]]
) -> None:
    src, chunks = pristine
    original = [(cid, recs) for cid, _, _, recs in chunks]
    good_index = read_file(index_path(src))
    for damage in ("missing", "short", "partial", "garbage", "zeros"):
        stream_dir = copy_of(src, tmp_path / damage)
        idx = index_path(stream_dir)
        if damage == "missing":
            os.unlink(idx)
        elif damage == "short":
            os.truncate(idx, 8 + 29 * 3)
        elif damage == "partial":
            os.truncate(idx, len(good_index) - 5)
        elif damage == "garbage":
            with open(idx, "ab") as f:
                f.write(b"\x13" * 40)
        else:
            with open(idx, "ab") as f:
                f.write(bytes(29 * 3))
        log = StreamLog.open(stream_dir)
        assert read_file(idx) == good_index, damage
        assert served(log) == original
        with log.reader(OffsetSpec.last()) as r:
            chunk = r.read_chunk()
            assert chunk is not None and chunk.header.chunk_id == chunks[-1][0]
        log.close()


def snapshot_files(stream_dir: str) -> dict[str, bytes]:
    return {n: read_file(os.path.join(stream_dir, n)) for n in sorted(os.listdir(stream_dir))}


def test_sealed_segment_damage_is_refused_never_cut(tmp_path: Path) -> None:
    stream_dir, _chunks = build(tmp_path / "multi", max_segment_chunks=4)
    names = sorted(n for n in os.listdir(stream_dir) if n.endswith(".segment"))
    assert len(names) >= 3
    second = os.path.join(stream_dir, names[1])
    os.truncate(second, os.path.getsize(second) - 3)
    before = snapshot_files(stream_dir)
    with pytest.raises(DamagedSegmentError) as info:
        StreamLog.open(stream_dir)
    assert info.value.segment_path == second
    assert info.value.end_offset == int(names[2][:20])
    assert snapshot_files(stream_dir) == before  # nothing cut, nothing deleted
    # moved aside (never deleted): the stream stays refused, naming the file
    moved = quarantine(info.value)
    assert moved == [second + ".damaged", second[: -len(".segment")] + ".index.damaged"]
    with pytest.raises(DamagedSegmentError, match="moved aside"):
        StreamLog.open(stream_dir)
    assert not os.path.exists(second) and os.path.getsize(second + ".damaged") > 0


def test_flipped_index_bit_in_sealed_segment_never_loses_data(tmp_path: Path) -> None:
    """One bit of one timestamp in a sealed segment's index: the index is rebuilt from
    the segment; no segment is deleted and no offset is handed out again."""
    stream_dir, _chunks = build(tmp_path / "idx", max_segment_chunks=4)
    log = StreamLog.open(stream_dir)
    original = served(log)
    next_offset = log.next_offset
    log.close()
    indexes = sorted(n for n in os.listdir(stream_dir) if n.endswith(".index"))
    segments = sorted(n for n in os.listdir(stream_dir) if n.endswith(".segment"))
    for n_record in (0, 1, 3):  # first, middle and last record of the index
        idx = os.path.join(stream_dir, indexes[1])
        good = read_file(idx)
        with open(idx, "r+b") as f:
            at = 8 + 29 * n_record + 8 + 7  # low byte of the timestamp
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x40]))
        log = StreamLog.open(stream_dir)
        assert log.next_offset == next_offset
        assert served(log) == original
        assert sorted(n for n in os.listdir(stream_dir) if n.endswith(".segment")) == segments
        log.close()
        assert read_file(idx) == good  # rebuilt from the segment


def test_interior_damage_in_last_segment_is_not_cut(tmp_path: Path) -> None:
    stream_dir, chunks = build(tmp_path / "mid")
    victim = chunks[3]
    with open(segment_path(stream_dir), "r+b") as f:
        f.seek(victim[1] + victim[2] - 1 - 40)
        f.write(b"\x00" * 8)  # inside the data: CRC mismatch, later chunks healthy
    before = snapshot_files(stream_dir)
    with pytest.raises(DamagedSegmentError) as info:
        StreamLog.open(stream_dir)
    assert info.value.first_offset <= victim[0] < (info.value.end_offset or 1 << 62)
    assert snapshot_files(stream_dir) == before


def test_patch_segment_repairs_from_a_healthy_copy(tmp_path: Path) -> None:
    stream_dir, chunks = build(tmp_path / "patch", max_segment_chunks=4)
    first_seg = os.path.join(stream_dir, "00000000000000000000.segment")
    healthy = read_file(first_seg)
    with open(first_seg, "r+b") as f:
        f.seek(chunks[3][1] + 31)
        f.write(b"\xff")  # the last chunk id of a sealed segment
    with pytest.raises(DamagedSegmentError) as info:
        StreamLog.open(stream_dir)
    pos = info.value.position
    patch_segment(first_seg, pos, healthy[pos:])
    log = StreamLog.open(stream_dir)
    assert [c for c, _ in served(log)][: len(chunks)] == [c[0] for c in chunks]
    log.close()


def test_bit_rot_in_sealed_segment_is_not_served(tmp_path: Path) -> None:
    stream_dir, chunks = build(tmp_path / "rot", max_segment_chunks=4)
    first_seg = os.path.join(stream_dir, "00000000000000000000.segment")
    victim = chunks[1]  # inside the first (sealed) segment
    with open(first_seg, "r+b") as f:
        f.seek(victim[1] + HEADER_SIZE + 2)
        b = f.read(1)[0]
        f.seek(victim[1] + HEADER_SIZE + 2)
        f.write(bytes([b ^ 0xFF]))
    log = StreamLog.open(stream_dir)  # structural check passes
    with log.reader(OffsetSpec.first(), user_only=False) as r:
        first = r.read_chunk()
        assert first is not None and first.header.chunk_id == chunks[0][0]
        with pytest.raises(CorruptChunkError):
            r.read_chunk()
    log.close()


def test_orphans_and_empty_tail(tmp_path: Path) -> None:
    stream_dir, chunks = build(tmp_path / "o", max_segment_chunks=4)
    orphan = os.path.join(stream_dir, f"{10**9:020d}.index")
    with open(orphan, "wb") as f:
        f.write(b"OSII\x00\x00\x00\x01")
    nxt = end_offset(chunks)
    empty_seg = os.path.join(stream_dir, f"{nxt:020d}.segment")
    with open(empty_seg, "wb") as f:
        f.write(b"OSIL\x00\x00\x00\x01")
    with open(os.path.join(stream_dir, "README.txt"), "w") as f:
        f.write("unrelated files are ignored")
    log = StreamLog.open(stream_dir)
    assert not os.path.exists(orphan) and not os.path.exists(empty_seg)
    assert log.next_offset == nxt
    log.close()


def test_torn_segment_creation(tmp_path: Path) -> None:
    stream_dir, chunks = build(tmp_path / "t")
    nxt = end_offset(chunks)
    with open(os.path.join(stream_dir, f"{nxt:020d}.segment"), "wb") as f:
        f.write(b"OSI")  # crashed while creating a new segment
    log = StreamLog.open(stream_dir)
    assert log.next_offset == nxt and len(log.list_segments()) == 1
    log.close()


def test_first_segment_header_damage_is_not_a_stream(tmp_path: Path) -> None:
    stream_dir, _ = build(tmp_path / "h")
    with open(segment_path(stream_dir), "r+b") as f:
        f.write(b"XXXX")
    with pytest.raises(NotAStreamError):
        StreamLog.open(stream_dir)


def test_log_view_is_read_only(tmp_path: Path) -> None:
    stream_dir, chunks = build(tmp_path / "v")
    size = os.path.getsize(segment_path(stream_dir))
    os.truncate(segment_path(stream_dir), size - 1)
    before = {n: read_file(os.path.join(stream_dir, n)) for n in os.listdir(stream_dir)}
    view = LogView(stream_dir)
    with LogReader(view, OffsetSpec.first(), user_only=False) as r:
        ids = [c.header.chunk_id for c in r.chunks()]
    assert ids == [c[0] for c in chunks[:-1]] and view.notes
    after = {n: read_file(os.path.join(stream_dir, n)) for n in os.listdir(stream_dir)}
    assert before == after
