"""Per-node resource samples (every two seconds, from /proc and the node's tmpfs): disk in
use (a disk-full filler not counted), RSS, open fds (less the node's client connections,
which move between nodes with the faults) and threads. Bounded means the median
of the last quarter of the run, after warm-up, is at most ``max_growth`` times the median
of its first quarter."""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field

from tests.cluster.nodes import Cluster, admin_json
from tests.soak.mounts import TmpfsMount

METRICS = ("disk", "rss", "fds", "threads")


@dataclass
class Sample:
    at: float
    node: str
    disk: int
    rss: int
    fds: int
    threads: int


def _proc(pid: int) -> tuple[int, int, int]:
    rss = threads = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


@dataclass
class ResourceSampler:
    cluster: Cluster
    mounts: dict[str, TmpfsMount]
    interval: float = 2.0
    samples: list[Sample] = field(default_factory=list)
    excluded: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-resources")
        self._grew: dict[tuple[str, str], float] = {}

    def start(self) -> ResourceSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def exclude(self, node: str, start: float, end: float) -> None:
        """Samples of ``node`` in this window say nothing about growth (its disk was filled
        or wiped, or it was down)."""
        self.excluded.setdefault(node, []).append((start, end))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name, node in self.cluster.nodes.items():
                proc = node.process.proc
                if proc is None or proc.poll() is not None:
                    continue
                try:
                    rss, fds, threads = _proc(proc.pid)
                    disk = self.mounts[name].used_bytes()
                    # a client connection is an fd the node must hold: not a leak
                    fds -= int(admin_json(node, "/api/health")["connections"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                self.samples.append(Sample(time.time(), name, disk, rss, fds, threads))

    def growth(self, started: float, ended: float, warmup: float) -> dict[str, dict[str, float]]:
        """metric -> node -> last ÷ first quarter (medians) after the warm-up share."""
        begin = started + (ended - started) * warmup
        quarter = (ended - begin) / 4
        out: dict[str, dict[str, float]] = {m: {} for m in METRICS}
        for name in self.cluster.nodes:
            mine = [
                s
                for s in self.samples
                if s.node == name
                and s.at >= begin
                and not any(a <= s.at <= b for a, b in self.excluded.get(name, []))
            ]
            first = [s for s in mine if s.at < begin + quarter]
            last = [s for s in mine if s.at >= ended - quarter]
            if len(first) < 2 or len(last) < 2:
                continue
            for metric in METRICS:
                a = statistics.median(getattr(s, metric) for s in first)
                b = statistics.median(getattr(s, metric) for s in last)
                out[metric][name] = b / a if a else (1.0 if not b else float("inf"))
                self._grew[(metric, name)] = b - a
        return out

    def grew_by(self, metric: str, node: str) -> float:
        """Absolute growth of ``metric`` on ``node`` behind the last ``growth`` ratio."""
        return self._grew.get((metric, node), 0.0)

    def peak(self, metric: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.samples:
            out[s.node] = max(out.get(s.node, 0), getattr(s, metric))
        return out
