"""Run delayed delivery's stepped-clock campaign for the record (default 100,000 messages)
and print its counts.

    PYTHONPATH=src python scripts/delayed_campaign.py --messages 100000 [--seed 11] [--workdir DIR]

Messages with delays from 0 to 3 h (x-delay semantics) are accepted into a real system
stream while a stepped clock walks through the three hours; long delays are parked in timer
objects (filesystem object store, SQLite MetaStore) and pulled back one horizon ahead; the
scheduler is killed at random moments and at every registered crash point (between a
dispatch intent and the append, after the append, between a timer object and its manifest
commit, ...) and rebuilt from the system stream; checkpoints are written every 500 records
and the system stream's segments below the last one are deleted (retention). Oracle: every
accepted message appended exactly once, none before its due time. Exit status 1 when it
finds a problem.

    PYTHONPATH=src python scripts/delayed_campaign.py --disk-loss 5 [--kind ack-remote|tiered]

runs the disk-loss campaign instead (``tests/delayed/disk_loss.py``): one ``tierlog serve``
on SeaweedFS + etcd (started here, stopped by PID at the end), 100 scheduled messages per
round, the node's data directory deleted after each round; checkpoints and retention of
the system stream run before each wipe. Oracle: the same.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.delayed.campaign import run
from tests.delayed.disk_loss import KINDS, run_disk_loss, s3_env, server_config
from tests.plugins.etcd import find_or_install_etcd, start_etcd, stop_process
from tests.plugins.seaweed import start_seaweed
from tests.plugins.tierlog_server import TierlogServerProcess


def disk_loss(workdir: Path, wipes: int, kind: str, seed: int) -> int:
    (workdir / "etcd").mkdir()
    etcd, etcd_port = start_etcd(find_or_install_etcd(), workdir / "etcd")
    s3 = start_seaweed(workdir / "seaweed")
    server = TierlogServerProcess(
        workdir / "node-data",
        config_text=server_config(s3, f"127.0.0.1:{etcd_port}", "delayed-campaign", 40),
        env=s3_env(s3),
    )
    started = time.monotonic()
    try:
        server.start()
        result = asyncio.run(run_disk_loss(server, kind, wipes=wipes, seed=seed))
    finally:
        server.kill()
        s3.stop()
        stop_process(etcd)
    print(
        f"kind={result.kind} wipes={result.wipes} confirmed={result.confirmed} "
        f"appended={result.appended} missing={result.missing} "
        f"duplicates={result.duplicates} early={result.early} "
        f"checkpoints_before_wipe={result.checkpoints_before_wipe} "
        f"seconds={time.monotonic() - started:.0f} problems={result.problems or 'none'}"
    )
    bad = result.problems or result.missing or result.duplicates or result.early
    return 1 if bad or result.appended != result.confirmed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--crash-rate", type=float, default=0.03)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--disk-loss", type=int, default=0, metavar="WIPES")
    parser.add_argument("--kind", choices=sorted(KINDS), default="ack-remote")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tierlog-delayed-"))
    os.makedirs(workdir, exist_ok=True)
    if args.disk_loss:
        return disk_loss(workdir, args.disk_loss, args.kind, args.seed)
    result = asyncio.run(run(str(workdir), args.messages, args.seed, args.crash_rate))
    lateness = sorted(result.lateness_ms)
    print(
        f"messages={result.published} appended={result.appended} missing={result.missing} "
        f"duplicates={result.duplicates} early={result.early} crashes={result.crashes} "
        f"crash_points={dict(result.crash_points)} timer_objects={result.timer_objects} "
        f"checkpoints={result.checkpoints} freed_segments={result.freed_segments} "
        f"lateness_p99_ms={result.lateness_p99_ms()} "
        f"lateness_max_ms={lateness[-1] if lateness else 0} seconds={result.seconds:.0f}"
    )
    problems = result.missing or result.duplicates or result.early
    return 1 if problems or result.appended != result.published else 0


if __name__ == "__main__":
    sys.exit(main())
