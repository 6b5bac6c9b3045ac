"""The durable on-delete trigger survives a crash: a process deletes stream keys with
cleanup items and starts slow cleanup work; it is killed with SIGKILL mid-way; a new
process scans the queue on start and finishes. Each stream's cleanup is done exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierlog.storage.meta_store import MetaStore, open_meta_store

WORKER = Path(__file__).with_name("meta_cleanup_worker.py")
QUEUE = "stream-cleanup"
STREAMS = {"s1": 4, "s2": 3}  # stream name -> number of objects to delete
WAIT_LIMIT_S = 120.0


def journal_lines(workdir: Path) -> list[str]:
    path = workdir / "journal"
    return path.read_text().splitlines() if path.exists() else []


def make_streams(store: MetaStore, workdir: Path) -> None:
    for name, n_objects in STREAMS.items():
        store.create(f"streams/{name}", f"root-of-{name}".encode(), epoch=1)
        (workdir / name).mkdir()
        for i in range(n_objects):
            (workdir / name / f"{i:020d}.fragment").write_bytes(b"x" * 100)


def start_worker(uri: str, workdir: Path, mode: str, hang_at: str = "") -> subprocess.Popen[bytes]:
    args = [sys.executable, str(WORKER), uri, str(workdir), mode]
    if hang_at:
        args.append(hang_at)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def kill_when_hung(proc: subprocess.Popen[bytes], workdir: Path) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not any(line.startswith("hang ") for line in journal_lines(workdir)):
        if proc.poll() is not None:
            output = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"worker exited early ({proc.returncode}):\n{output}")
        assert time.monotonic() < deadline, "worker never reached its hang point"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("hang_at", ["step:2", "before-complete"])
def test_cleanup_finishes_after_kill(meta_store_uri: str, tmp_path: Path, hang_at: str) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    with open_meta_store(meta_store_uri) as store:
        make_streams(store, workdir)

    crashed = start_worker(meta_store_uri, workdir, "delete", hang_at)
    try:
        kill_when_hung(crashed, workdir)
    finally:
        if crashed.poll() is None:
            os.kill(crashed.pid, signal.SIGKILL)
            crashed.wait(timeout=30)

    with open_meta_store(meta_store_uri) as store:
        # The deletes and their cleanup items were committed together; work is unfinished.
        assert store.list("streams/") == []
        assert sorted(i.payload.decode() for i in store.pending(QUEUE)) == sorted(STREAMS)
    assert (workdir / "s2").exists(), "the crash must land before all cleanup is done"

    restarted = start_worker(meta_store_uri, workdir, "work")
    output, _ = restarted.communicate(timeout=WAIT_LIMIT_S)
    assert restarted.returncode == 0, output.decode()

    lines = journal_lines(workdir)
    assert lines[-1] == "drained"
    for name in STREAMS:
        assert not (workdir / name).exists()
        assert (workdir / f"done-{name}").exists()
        assert lines.count(f"done {name}") == 1, lines
        assert lines.count(f"deleted {name}") == 1, lines
    if hang_at == "before-complete":
        # s1's final effect happened before the kill; the restart saw it and did not redo it.
        assert lines.count("already-done s1") == 1, lines
    with open_meta_store(meta_store_uri) as store:
        assert store.pending(QUEUE) == []
        assert store.list("") == []


def test_worker_with_empty_queue_does_nothing(meta_store_uri: str, tmp_path: Path) -> None:
    """A restart when nothing is pending drains at once and touches nothing."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    worker = start_worker(meta_store_uri, workdir, "work")
    output, _ = worker.communicate(timeout=WAIT_LIMIT_S)
    assert worker.returncode == 0, output.decode()
    assert journal_lines(workdir) == ["start work", "drained"]
