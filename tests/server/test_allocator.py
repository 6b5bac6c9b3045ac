"""Allocator tuning: memory freed after a burst goes back to the OS.

Runs in a child process (mallopt changes the whole process). The burst allocates and
frees 4 MiB buffers in a pattern that raises glibc's dynamic mmap threshold, then a
second burst that, untuned, is served from the heap and kept after it is freed.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import sys
from tierlog.server.allocator import tune_allocator

def block():
    b = bytearray(4 << 20)
    b[::4096] = b"x" * 1024  # touch every page
    return b

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "tuned":
    assert tune_allocator()
base = rss_mib()
first = [block() for _ in range(4)]
del first  # freeing mmapped blocks raises the dynamic threshold (untuned)
burst = []
for i in range(60):
    burst.append(block())
    burst.append(bytearray(200))  # small objects between the blocks pin the heap top
small = burst[1::2]
del burst
print(round(rss_mib() - base))
"""


def _after_burst(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return int(out.stdout.split()[-1])


def test_tuned_allocator_gives_freed_blocks_back() -> None:
    tuned = _after_burst("tuned")
    untuned = _after_burst("default")
    assert tuned < 32, f"tuned: {tuned} MiB still held after the burst"
    # glibc's dynamic threshold keeps the untuned burst on most machines (224 MiB measured
    # here), but not in every environment, so the contrast is reported, not required
    assert untuned >= tuned, f"untuned {untuned} MiB vs tuned {tuned} MiB"
