"""Long runs of the replication tests that CI bounds: the acceptor's stateful property
test (random leader writes, replication spans, divergent writes, truncations, reopens)
with many examples, the kill-at-every-step tests, and the many-streams hub test with
more streams.

    python scripts/replication_campaign.py [--profile thorough] [--streams 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="thorough", choices=("ci", "dev", "thorough"))
    parser.add_argument("--streams", type=int, default=2000)
    args = parser.parse_args()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT / "src"),
        HYPOTHESIS_PROFILE=args.profile,
        HUB_SCALE_STREAMS=str(args.streams),
    )
    tests = [
        "tests/log/test_acceptor_stateful.py",
        "tests/log/test_acceptor_faults.py",
        "tests/cluster/test_hub_scale.py",
    ]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-q", "-s", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
    )
    print(f"replication campaign: exit {done.returncode} in {time.monotonic() - started:.0f} s")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
