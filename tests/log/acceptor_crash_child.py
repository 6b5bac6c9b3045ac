"""A child process that runs one acceptor operation and SIGKILLs itself at its N-th
file-system step (a write, fsync, truncate, rename, unlink or file creation). A write
chosen as the crash step is torn: half of it reaches the file first.

    python -m tests.log.acceptor_crash_child MODE STREAM_DIR N ARG

or forked from the test process (``run_forked``; the tests do that, it is much
cheaper than a new interpreter).

MODE ``accept`` (ARG: a file holding the chunk bytes), ``truncate`` (ARG: the
keep-through chunk id) or ``epoch`` (ARG: the epoch to persist). Exit code 0: the
operation finished before step N; the process is killed otherwise.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from tests.log.acceptor_helpers import SMALL

_count = 0
_crash_at = 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _step() -> bool:
    global _count
    _count += 1
    return _count == _crash_at


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _step():
            _die()
        return fn(*args, **kwargs)

    return wrapped


_REAL = {
    name: getattr(os, name)
    for name in (
        "pwrite",
        "pwritev",
        "write",
        "writev",
        "fsync",
        "fdatasync",
        "ftruncate",
        "truncate",
        "unlink",
        "replace",
        "rename",
        "open",
    )
}


def _torn(name: str, positional: bool) -> Callable[..., Any]:
    def wrapped(fd: int, data: Any, *rest: Any) -> Any:
        if _step():
            raw = b"".join(bytes(p) for p in data) if name.endswith("v") else bytes(data)
            half = raw[: len(raw) // 2]
            if half:
                if positional:
                    _REAL["pwrite"](fd, half, rest[0])
                else:
                    _REAL["write"](fd, half)
            _die()
        return _REAL[name](fd, data, *rest)

    return wrapped


def _open(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
    if flags & os.O_CREAT and _step():
        _die()
    return _REAL["open"](path, flags, *args, **kwargs)


def install(crash_at: int) -> None:
    global _crash_at
    _crash_at = crash_at
    for name, positional in (
        ("pwrite", True),
        ("pwritev", True),
        ("write", False),
        ("writev", False),
    ):
        setattr(os, name, _torn(name, positional))
    for name in ("fsync", "fdatasync", "ftruncate", "truncate", "unlink", "replace", "rename"):
        setattr(os, name, _plain(_REAL[name]))
    os.open = _open  # type: ignore[assignment]


def run_operation(mode: str, stream_dir: str, crash_at: int, arg: str) -> None:
    """Open the log, arm the crash at step ``crash_at``, run the operation."""
    from tierlog.log.member_epoch import persist_member_epoch
    from tierlog.log.writer import StreamLog

    payload = b""
    if mode == "accept":
        with open(arg, "rb") as f:
            payload = f.read()
    log = StreamLog.open(stream_dir, SMALL, adopt_disk_epoch=True)
    install(crash_at)
    if mode == "accept":
        log.accept_chunks(payload)
        log.sync_to_disk()
    elif mode == "truncate":
        log.truncate_after(int(arg))
    else:
        persist_member_epoch(stream_dir, int(arg))
    log.close()


def run_forked(mode: str, stream_dir: str, crash_at: int, arg: str) -> int:
    """Run the operation in a forked child (everything is imported already, so a child
    costs milliseconds); 0 if it finished, -9 if it was killed at the step."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        code = 0
        try:
            run_operation(mode, stream_dir, crash_at, arg)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main() -> None:
    mode, stream_dir, crash_at, arg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    run_operation(mode, stream_dir, crash_at, arg)
    sys.exit(0)


if __name__ == "__main__":
    main()
