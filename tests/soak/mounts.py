"""Size-limited tmpfs mounts for the soak's data directories, so a full disk is a real
ENOSPC. Each mount has an owner file (the soak's pid) beside it; ``clean_stale_mounts``
unmounts soak mounts whose owner is gone (a run killed before its cleanup), and every
mount is unmounted by its owner on exit, also on failure."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

MARK = "tierlog-soak-"
"""Soak work directories carry this in their name; only their mounts are ever cleaned."""


class TmpfsMount:
    """``path`` mounted as a tmpfs of ``size_mb`` MiB (root only); ``filler`` is the file a
    disk-full fault writes."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self.mounted = False

    @property
    def owner_file(self) -> Path:
        return self.path.parent / f"{self.path.name}.mount-owner"

    @property
    def filler(self) -> Path:
        return self.path / "soak-disk-filler"

    def mount(self) -> TmpfsMount:
        self.path.mkdir(parents=True, exist_ok=True)
        self.owner_file.write_text(str(os.getpid()))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
        )
        self.mounted = True
        return self

    def used_bytes(self) -> int:
        """Bytes in use on the mount, not counting a disk-full filler."""
        stat = os.statvfs(self.path)
        used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        with contextlib.suppress(FileNotFoundError):
            used -= self.filler.stat().st_blocks * 512
        return max(0, used)

    def fill(self) -> int:
        """Write the filler until the mount is full (ENOSPC); its size."""
        written = 0
        block = b"\0" * (1 << 20)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (len(block), 4096, 512):  # the last partial MiB too
                while True:
                    try:
                        written += os.write(fd, block[:size])
                    except OSError:
                        break
        finally:
            os.close(fd)
        return written

    def free_filler(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def wipe(self) -> None:
        """Remove everything on the mount (the node is down): a lost disk."""
        for child in self.path.iterdir():
            subprocess.run(["rm", "-rf", str(child)], check=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)
            self.mounted = False
        with contextlib.suppress(FileNotFoundError):
            self.owner_file.unlink()


def clean_stale_mounts() -> list[str]:
    """Unmount tmpfs mounts under soak work directories whose owner process is gone; the
    paths unmounted."""
    cleaned = []
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[2] != "tmpfs" or MARK not in parts[1]:
            continue
        path = Path(parts[1])
        owner = path.parent / f"{path.name}.mount-owner"
        pid = 0
        with contextlib.suppress(OSError, ValueError):
            pid = int(owner.read_text())
        if pid and _alive(pid):
            continue
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
        cleaned.append(str(path))
    return cleaned


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
