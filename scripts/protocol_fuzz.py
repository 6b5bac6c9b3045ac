"""Long protocol fuzz run against a tierlog server process (default 100,000 frames).

Random and mutated valid frames, before and after authentication, in short sessions;
a healthy client publishes and consumes every ``--health-every`` frames; the server's
RSS is sampled after every session. Prints one summary line (and progress lines) and
exits non-zero if the server died, grew past ``--max-rss-growth-mib`` or logged errors.

    PYTHONPATH=src python scripts/protocol_fuzz.py --frames 100000 --seed 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.fuzz import run_fuzz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--health-every", type=int, default=5_000)
    parser.add_argument("--max-rss-growth-mib", type=float, default=128.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = TierlogServerProcess(
            Path(tmp) / "data", config_text="[tier]\nenabled = false\n"
        ).start()
        try:
            report = run_fuzz(
                server, args.frames, seed=args.seed, health_every=args.health_every, log=print
            )
        finally:
            server.stop()
        errors = [
            line
            for line in server.log_tail(1 << 30).splitlines()
            if "level=error" in line or "Traceback" in line
        ]
    print("result:", report.summary())
    print(f"server error lines: {len(errors)}; client session errors: {len(report.errors)}")
    for line in errors[:10]:
        print("  ", line[:300])
    if errors or report.rss_growth_mib > args.max_rss_growth_mib:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
