"""Compare benchmarks of two source trees, run alternately in one run.

Each benchmark runs as a subprocess under the old tree, then the new tree, repeated for a
number of rounds (old, new, old, new, ...), so machine load drifts hit both sides alike. The
last line of a bench's output that holds ``key=value`` pairs is parsed, and per key the median
of each side and the ratio new/old are printed. Most keys are "higher is better" (ratios of
tierlog against a raw baseline measured in the same process); keys listed in ``LOWER_IS_BETTER``
are costs, for which a ratio above 1 is the worse direction.

Benches in ``SERVER_BENCHES`` are client workloads against a ``tierlog serve`` subprocess
(``scripts/server_workloads.py``): there the client is always the new tree's and only the
server's ``PYTHONPATH`` switches between the trees, so a bench file that was rewritten (and
no longer runs against the old code) still compares the servers on one workload.

Usage::

    python scripts/compare_mains.py --old /path/to/old/tree --new . [--rounds 3] [BENCH ...]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

PYTHON = "/work/main/.venv/bin/python"

# Bench name -> small-size options, chosen so one run takes well under a minute on a busy
# 2-core machine (spark_read: a few minutes, one JVM per run). Benches whose new file
# measures something else than the old one (catchup.py, protocol.py were rewritten) are
# compared through SERVER_BENCHES instead.
QUICK_ARGS: dict[str, list[str]] = {
    "local_log": ["--records", "500000"],
    "arrow_decode": ["--mib", "16", "--rounds", "2"],
    "manifest_scale": [
        "--fragments",
        "100000",
        "--m",
        "16",
        "--root-every",
        "1000",
        "--samples",
        "50",
    ],
    "object_store": ["--objects", "8", "--rounds", "3"],
    "tiering": ["--gib", "0.25"],
    "spark_read": ["--records", "1000000", "--repeat", "2"],
}

# Workload of scripts/server_workloads.py -> its options; run from the new tree with
# --server-src <tree>/src (see the module docstring).
SERVER_BENCHES: dict[str, list[str]] = {
    "server_protocol": ["protocol", "--messages", "1000000"],
    # the same with the server's data in /dev/shm: no fsync latency of the shared disk
    "server_protocol_shm": ["--data-root", "/dev/shm", "protocol", "--messages", "1000000"],
    # the lean-client phase alone, 3M messages (server CPU resolved to ~1 %)
    "server_lean_shm": ["--data-root", "/dev/shm", "lean"],
    "server_catchup": ["catchup", "--mib", "256"],
}

# Seconds per run where the default is too short.
TIMEOUTS = {"spark_read": 900.0, "server_catchup": 900.0}

# Cost keys: lower is better.
LOWER_IS_BETTER = {
    "puts_per_gib",
    "seek_gets",
    "seconds",
    "height",
    "root_bytes",
    "max_root_bytes",
    "branch_objects",
    "branch_bytes",
    "gets_oldest",
    "gets_max",
    "gets_mean",
    "cold_lookup_ms",
    "pruned_fraction",
    "publish_cpu_us",
    "consume_cpu_us",
    "cold_cpu_ms_per_mib",
    "cold_sys_ms_per_mib",
    "cold_gets",
    "cold_faults_per_mib",
    "cold_switches_per_mib",
    "local_cpu_ms_per_mib",
    "lean_publish_cpu_us",
    "lean_consume_cpu_us",
    "tierlog_fs_count_s",
    "tierlog_fs_scan_s",
    "tierlog_s3_scan_s",
    "parquet_scan_s",
    "pruned_query_s",
}

# Workload parameters echoed on the last line: not measurements.
CONFIG_KEYS = {"m", "fragments", "batch", "commits"}

# Absolute figures from earlier lines of the output, so a change in a ratio can be traced to
# its numerator or its baseline (bench -> (key, pattern with one group; the last match counts)).
EXTRA_KEYS: dict[str, list[tuple[str, str]]] = {
    "local_log": [
        ("append_tierlog_mb_s", r"append\s+tierlog\s+([\d.]+) MB/s"),
        ("append_raw_mb_s", r"append\s+tierlog\s+[\d.]+ MB/s\s+raw\s+([\d.]+) MB/s"),
        ("read_tierlog_mb_s", r"read\s+tierlog\s+([\d.]+) MB/s"),
        ("read_raw_mb_s", r"read\s+tierlog\s+[\d.]+ MB/s\s+raw\s+([\d.]+) MB/s"),
    ],
    "arrow_decode": [
        ("vectorised_mrows_s", r"100-byte records.*?vectorised\s+([\d.]+) Mrows/s"),
        ("naive_mrows_s", r"100-byte records.*?naive\s+([\d.]+) Mrows/s"),
    ],
    "spark_read": [
        ("tierlog_fs_count_s", r"tierlog_fs_count\s+([\d.]+) s"),
        ("tierlog_fs_scan_s", r"tierlog_fs_scan\s+([\d.]+) s"),
        ("tierlog_s3_scan_s", r"tierlog_s3_scan\s+([\d.]+) s"),
        ("parquet_scan_s", r"parquet_scan\s+([\d.]+) s"),
        ("pruned_query_s", r"1% time range: \d+ rows in ([\d.]+) s"),
    ],
}

KV = re.compile(r"(\w+)=([-+0-9.eE]+)(?=\s|$)")


@dataclass
class Side:
    values: dict[str, list[float]] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    failures: int = 0


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def last_key_values(output: str) -> dict[str, float]:
    for line in reversed(output.splitlines()):
        pairs = KV.findall(line)
        if pairs:
            return {k: float(v) for k, v in pairs}
    return {}


def extra_key_values(bench: str, output: str) -> dict[str, float]:
    values = {}
    for key, pattern in EXTRA_KEYS.get(bench, []):
        matches = re.findall(pattern, output)
        if matches:
            values[key] = float(matches[-1])
    return values


def command(tree: str, client: str, bench: str, args: list[str]) -> tuple[list[str], str]:
    """(argv, root of the tree whose code runs the client) of one run of ``bench``."""
    if bench in SERVER_BENCHES:
        script = os.path.join(client, "scripts", "server_workloads.py")
        server_src = os.path.join(tree, "src")
        return [PYTHON, script, "--server-src", server_src, *args], client
    return [PYTHON, os.path.join(tree, "benches", f"{bench}.py"), *args], tree


def run_once(
    tree: str, client: str, bench: str, args: list[str], timeout: float
) -> tuple[dict[str, float], float]:
    cmd, root = command(tree, client, bench, args)
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src") + os.pathsep + root)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise RuntimeError(f"{bench} in {tree} exited {proc.returncode}")
    values = last_key_values(proc.stdout)
    values.update(extra_key_values(bench, proc.stdout))
    return values, elapsed


def compare(old: str, new: str, bench: str, rounds: int, timeout: float) -> None:
    args = SERVER_BENCHES[bench] if bench in SERVER_BENCHES else QUICK_ARGS[bench]
    timeout = max(timeout, TIMEOUTS.get(bench, 0.0))
    print(f"## {bench} {' '.join(args)}", flush=True)
    print(f"load average at the start: {load_average()}", flush=True)
    sides = {"old": Side(), "new": Side()}
    for r in range(rounds):
        for name, tree in (("old", old), ("new", new)):
            side = sides[name]
            try:
                values, elapsed = run_once(tree, new, bench, args, timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                side.failures += 1
                print(f"  round {r + 1} {name}: FAILED {exc}", flush=True)
                continue
            side.seconds.append(elapsed)
            for k, v in values.items():
                side.values.setdefault(k, []).append(v)
            shown = " ".join(f"{k}={v:g}" for k, v in values.items())
            print(f"  round {r + 1} {name}: {elapsed:5.1f} s  {shown}", flush=True)
    print(f"load average at the end: {load_average()}", flush=True)
    print("| key | old median | new median | new/old | better |")
    print("|---|---|---|---|---|")
    for key, old_values in sides["old"].values.items():
        new_values = sides["new"].values.get(key)
        if not new_values or key in CONFIG_KEYS:
            continue
        o, n = statistics.median(old_values), statistics.median(new_values)
        ratio = f"{n / o:.3f}" if o else "n/a"
        better = "lower" if key in LOWER_IS_BETTER or key.endswith("_ms") else "higher"
        print(f"| {key} | {o:g} | {n:g} | {ratio} | {better} |")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="root of the old tree")
    parser.add_argument("--new", default=".", help="root of the new tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per bench run")
    known = [*QUICK_ARGS, *SERVER_BENCHES]
    parser.add_argument("benches", nargs="*", default=known)
    args = parser.parse_args()
    unknown = [b for b in args.benches if b not in known]
    if unknown:
        parser.error(f"unknown benches {unknown}; known: {sorted(known)}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores")
    for bench in args.benches:
        compare(
            os.path.abspath(args.old), os.path.abspath(args.new), bench, args.rounds, args.timeout
        )


if __name__ == "__main__":
    main()
