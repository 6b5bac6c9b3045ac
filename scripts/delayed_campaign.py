"""Run delayed delivery's stepped-clock campaign for the record (default 100,000 messages)
and print its counts.

    PYTHONPATH=src python scripts/delayed_campaign.py --messages 100000 [--seed 11] [--workdir DIR]

Messages with delays from 0 to 3 h (x-delay semantics) are accepted into a real system
stream while a stepped clock walks through the three hours; long delays are parked in timer
objects (filesystem object store, SQLite MetaStore) and pulled back one horizon ahead; the
scheduler is killed at random moments and at every registered crash point (between a
dispatch intent and the append, after the append, between a timer object and its manifest
commit, ...) and rebuilt from the system stream. Oracle: every accepted message appended
exactly once, none before its due time. Exit status 1 when it finds a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.delayed.campaign import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--crash-rate", type=float, default=0.03)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tierlog-delayed-"))
    os.makedirs(workdir, exist_ok=True)
    result = asyncio.run(run(str(workdir), args.messages, args.seed, args.crash_rate))
    lateness = sorted(result.lateness_ms)
    print(
        f"messages={result.published} appended={result.appended} missing={result.missing} "
        f"duplicates={result.duplicates} early={result.early} crashes={result.crashes} "
        f"crash_points={dict(result.crash_points)} timer_objects={result.timer_objects} "
        f"lateness_p99_ms={result.lateness_p99_ms()} "
        f"lateness_max_ms={lateness[-1] if lateness else 0} seconds={result.seconds:.0f}"
    )
    problems = result.missing or result.duplicates or result.early
    return 1 if problems or result.appended != result.published else 0


if __name__ == "__main__":
    sys.exit(main())
