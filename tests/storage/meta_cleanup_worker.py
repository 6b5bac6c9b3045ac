"""A stream-cleanup worker run as a subprocess by tests/storage/test_meta_store_cleanup_crash.py.

Usage: ``python meta_cleanup_worker.py URI WORKDIR MODE [HANG_AT]``

MODE ``delete``: delete every ``streams/*`` key with a cleanup item, then work.
MODE ``work``: only work: scan the queue on start and drain it.

Cleaning stream ``s`` is slow multi-step work over ``WORKDIR/s/`` (one unlink per file,
each idempotent), then a final effect done exactly once (an ``O_EXCL`` marker file plus
a ``done`` line in the journal), then ``complete``. Every step is journaled. HANG_AT
(``step:N`` or ``before-complete``) makes the worker block there forever, so the test
can kill -9 it at a known point.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tierlog.storage.meta_store import CleanupItem, MetaStore, open_meta_store

QUEUE = "stream-cleanup"


def journal(workdir: Path, line: str) -> None:
    fd = os.open(workdir / "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def hang(workdir: Path, point: str) -> None:
    journal(workdir, f"hang {point}")
    while True:
        time.sleep(1)


def clean(store: MetaStore, item: CleanupItem, workdir: Path, hang_at: str) -> None:
    name = item.payload.decode()
    stream_dir = workdir / name
    files = sorted(stream_dir.iterdir()) if stream_dir.exists() else []
    for step, path in enumerate(files, start=1):
        path.unlink(missing_ok=True)
        journal(workdir, f"step {name} {path.name}")
        if hang_at == f"step:{step}":
            hang(workdir, hang_at)
        time.sleep(0.02)
    if stream_dir.exists():
        stream_dir.rmdir()
    try:
        os.close(os.open(workdir / f"done-{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        journal(workdir, f"done {name}")
    except FileExistsError:
        journal(workdir, f"already-done {name}")
    if hang_at == "before-complete":
        hang(workdir, hang_at)
    store.complete(item)


def main() -> int:
    uri, workdir_arg, mode = sys.argv[1:4]
    hang_at = sys.argv[4] if len(sys.argv) > 4 else ""
    workdir = Path(workdir_arg)
    with open_meta_store(uri) as store:
        journal(workdir, f"start {mode}")
        if mode == "delete":
            for entry in store.list("streams/"):
                name = entry.key.removeprefix("streams/")
                store.delete(entry.key, entry.version, cleanup=(QUEUE, name.encode()))
                journal(workdir, f"deleted {name}")
        while items := store.pending(QUEUE):  # scan on start, then until drained
            for item in items:
                clean(store, item, workdir, hang_at)
        journal(workdir, "drained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
