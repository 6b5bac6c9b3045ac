"""Run the kill -9 campaign for the record (default 100 cycles) and print its counts.

    PYTHONPATH=src python scripts/kill_campaign.py --cycles 100 [--seed 7] [--workdir DIR]

Each cycle starts ``tierlog serve``, publishes with a named producer (resending its tail
after the restart) while fragments are uploaded and local segments freed, and kills the
server with SIGKILL at a random moment. At the end every confirmed message must be read
back exactly once, in order. Exit status 1 when the oracle finds a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.kill import run_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tierlog-kill-"))
    os.makedirs(workdir, exist_ok=True)
    result = asyncio.run(run_campaign(workdir, args.cycles, args.seed))
    print(
        f"cycles={result.cycles} confirmed={result.confirmed} read_back={result.read_back} "
        f"resent={result.resent} refused_publishes={result.refused_publishes} "
        f"seconds={result.seconds:.0f} problems={result.problems or 'none'}"
    )
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
