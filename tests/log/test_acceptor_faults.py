"""Faults on a replica's log: a process killed at every file-system step of accepting
chunks, of cutting a suffix and of persisting the member epoch (the registered crash
points), and every damage of the replica's own files (the registered file kinds)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.faults.registry import DAMAGES, FILE_KINDS
from tests.faults.replica_kinds import REPLICA_CAMPAIGN, ReplicaStream
from tests.log.acceptor_crash_child import run_forked
from tests.log.acceptor_helpers import (
    SMALL,
    replicate,
    span_bytes,
    stream_files,
    write_leader_chunks,
)
from tierlog.log.errors import MemberEpochCorruptError, TruncationIntentError
from tierlog.log.member_epoch import read_member_epoch
from tierlog.log.truncation import write_intent
from tierlog.log.writer import StreamLog

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 80


def run_child(mode: str, stream_dir: str, crash_at: int, arg: str) -> int:
    """The operation in a child process killed (SIGKILL) at step ``crash_at``."""
    code = run_forked(mode, stream_dir, crash_at, arg)
    assert code in (0, -9), f"child failed with {code} (traceback above)"
    return code


def chunk_boundaries(data: bytes) -> list[int]:
    """Byte positions where each chunk of ``data`` ends."""
    from tierlog.formats.chunk import decode_header

    ends, pos = [], 0
    while pos < len(data):
        pos += decode_header(data, pos).total_size
        ends.append(pos)
    return ends


@pytest.fixture(scope="module")
def leader(tmp_path_factory):
    root = tmp_path_factory.mktemp("leader")
    log = StreamLog.create(str(root), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(log, 30)
    log.sync()
    yield log
    log.close()


def test_kill_at_every_step_of_accepting_chunks(leader, tmp_path):
    base = StreamLog.create_follower(str(tmp_path / "base" / "v_s_1"), SMALL)
    while base.next_offset < leader.list_segments()[1].first_offset - 3:
        data, _ = span_bytes(leader, base.next_offset, 1)
        base.accept_chunks(data)
    base.sync_to_disk()
    start = base.next_offset
    base.close()
    # the chunks to accept cross a segment roll
    first, middle = span_bytes(leader, start, 10**6)
    second, _ = span_bytes(leader, middle, 700)
    payload = first + second
    payload_file = tmp_path / "payload"
    payload_file.write_bytes(payload)
    ends = chunk_boundaries(payload)
    outcomes: set[int] = set()
    for step in range(1, MAX_STEPS):
        work = tmp_path / f"step{step}" / "v_s_1"
        shutil.copytree(base.stream_dir, work)
        code = run_child("accept", str(work), step, str(payload_file))
        log = StreamLog.open(str(work), SMALL, adopt_disk_epoch=True)  # never broken
        kept = next(
            i
            for i in range(len(ends) + 1)
            if _offset_after(start, payload, ends, i) == log.next_offset
        )
        outcomes.add(kept)
        reference = tmp_path / f"ref{step}" / "v_s_1"
        shutil.copytree(base.stream_dir, reference)
        ref = StreamLog.open(str(reference), SMALL, adopt_disk_epoch=True)
        if kept:
            ref.accept_chunks(payload[: ends[kept - 1]])
        ref.sync_to_disk()
        ref.close()
        assert stream_files(str(work)) == stream_files(str(reference)), f"step {step}"
        replicate(leader, log)  # and it continues from there
        log.close()
        assert stream_files(str(work)) == stream_files(leader.stream_dir), f"step {step}"
        shutil.rmtree(work.parent)
        shutil.rmtree(reference.parent)
        if code == 0:
            print(f"accept: killed at each of {step - 1} steps")
            break
    else:
        pytest.fail("the accept never finished")
    assert len(outcomes) >= 3  # kills landed before, inside and after the chunks


def _offset_after(start: int, payload: bytes, ends: list[int], kept: int) -> int:
    from tierlog.formats.chunk import decode_header

    if kept == 0:
        return start
    last_start = ends[kept - 2] if kept >= 2 else 0
    return decode_header(payload, last_start).next_offset


def test_kill_at_every_step_of_truncation(leader, tmp_path):
    base = StreamLog.create_follower(str(tmp_path / "base" / "v_s_1"), SMALL)
    replicate(leader, base)
    segments = base.list_segments()
    keep_through = segments[1].first_offset + 1  # inside the second of several segments
    base.close()
    expected = tmp_path / "expected" / "v_s_1"
    shutil.copytree(base.stream_dir, expected)
    cut = StreamLog.open(str(expected), SMALL, adopt_disk_epoch=True)
    cut.truncate_after(keep_through)
    cut.close()
    old_files = stream_files(base.stream_dir)
    new_files = stream_files(str(expected))
    assert old_files != new_files
    seen = set()
    for step in range(1, MAX_STEPS):
        work = tmp_path / f"step{step}" / "v_s_1"
        shutil.copytree(base.stream_dir, work)
        code = run_child("truncate", str(work), step, str(keep_through))
        log = StreamLog.open(str(work), SMALL, adopt_disk_epoch=True)
        log.close()
        files = stream_files(str(work))
        assert files in (old_files, new_files), f"step {step}: neither the old nor the cut log"
        seen.add("new" if files == new_files else "old")
        assert not os.path.exists(work / "truncate.intent")
        shutil.rmtree(work.parent)
        if code == 0:
            print(f"truncation: killed at each of {step - 1} steps")
            break
    else:
        pytest.fail("the truncation never finished")
    assert seen == {"old", "new"}


def test_kill_at_every_step_of_persisting_the_member_epoch(tmp_path):
    base = StreamLog.create_follower(str(tmp_path / "base" / "v_s_1"), SMALL)
    base.persist_member_epoch(4)
    base.close()
    seen = set()
    for step in range(1, 30):
        work = tmp_path / f"step{step}" / "v_s_1"
        shutil.copytree(base.stream_dir, work)
        code = run_child("epoch", str(work), step, "9")
        value = read_member_epoch(str(work))
        assert value in (4, 9)
        seen.add(value)
        shutil.rmtree(work.parent)
        if code == 0:
            break
    assert seen == {4, 9}


def _damage(path: str, how: str) -> None:
    if how == "delete":
        os.unlink(path)
        return
    size = os.path.getsize(path)
    if how == "truncate":
        os.truncate(path, size // 2)
        return
    with open(path, "r+b") as f:
        raw = bytearray(f.read())
        if how == "bitflip":
            raw[size // 2] ^= 0x10
        else:
            raw = bytearray(len(raw))
        f.seek(0)
        f.write(raw)


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize(
    "kind_name", sorted(k for k, v in FILE_KINDS.items() if v.campaign == REPLICA_CAMPAIGN)
)
def test_damaged_replica_files(leader, tmp_path, kind_name, how):
    """A damaged member epoch file is a typed error (a deleted one falls back to the
    highest epoch in the log, never below); a damaged truncation intent refuses the
    log, a deleted one leaves the old log."""
    log = StreamLog.create_follower(str(tmp_path / "r" / "v_s_1"), SMALL)
    replicate(leader, log)
    log.persist_member_epoch(7)
    old_files = stream_files(log.stream_dir)
    log.close()
    write_intent(log.stream_dir, 3)  # a cut decided, then the process died
    if kind_name == "member epoch file":
        os.unlink(os.path.join(log.stream_dir, "truncate.intent"))
    targets = FILE_KINDS[kind_name].locate(ReplicaStream(log.stream_dir))  # type: ignore[arg-type]
    assert targets
    _damage(targets[0].path, how)
    if kind_name == "member epoch file":
        reopened = StreamLog.open(log.stream_dir, SMALL, adopt_disk_epoch=True)
        if how == "delete":
            assert reopened.read_member_epoch() == 1  # the log's highest epoch
        else:
            with pytest.raises(MemberEpochCorruptError):
                reopened.read_member_epoch()
        reopened.close()
        return
    if how == "delete":
        reopened = StreamLog.open(log.stream_dir, SMALL, adopt_disk_epoch=True)
        reopened.close()
        assert stream_files(log.stream_dir) == old_files
        return
    with pytest.raises(TruncationIntentError):
        StreamLog.open(log.stream_dir, SMALL, adopt_disk_epoch=True)
    assert stream_files(log.stream_dir) == old_files  # nothing cut on a guess
