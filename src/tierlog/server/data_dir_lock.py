"""One server per data directory: an exclusive ``flock`` on ``{data_dir}/.lock`` held for
as long as the server runs.

Two processes writing the same stream directories would interleave appends and hand out
the same offsets twice; the kernel drops the lock when the process dies (even by
``kill -9``), so a crashed server never blocks its successor.
"""

from __future__ import annotations

import fcntl
import os

from tierlog.server.errors import DataDirLockedError

LOCK_FILE = ".lock"


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise DataDirLockedError(
                f"data directory {os.path.dirname(self.path)} is in use by another tierlog "
                f"process (pid {holder or 'unknown'}); refusing to start"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
