"""Run the randomized multi-process cluster fault campaign and print its counts.

    PYTHONPATH=src python scripts/cluster_nodes_campaign.py --cycles 30 [--seed 7]

Starts one etcd and one SeaweedFS (stopped by PID at the end), three ``tierlog serve``
nodes, and runs ``tests/cluster/nodes_campaign.py``: one random fault per cycle (leader
SIGKILL, leader SIGSTOP past its lease, leader cut from etcd, another node SIGKILLed)
while a named producer publishes with confirms. Exit status 1 when the oracle finds a
problem.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster.nodes_campaign import run_nodes_campaign
from tests.plugins.etcd import find_or_install_etcd, start_etcd, stop_process
from tests.plugins.seaweed import start_seaweed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tierlog-cluster-campaign-"))
    (workdir / "etcd").mkdir()
    etcd, etcd_port = start_etcd(find_or_install_etcd(), workdir / "etcd")
    s3 = start_seaweed(workdir / "seaweed")
    try:
        result = asyncio.run(
            run_nodes_campaign(
                workdir / "nodes", f"127.0.0.1:{etcd_port}", s3, args.cycles, args.seed
            )
        )
    finally:
        s3.stop()
        stop_process(etcd)
    print(
        f"cycles={result.cycles} faults={result.faults} confirmed={result.confirmed} "
        f"read_back={result.read_back} refused_publishes={result.refused_publishes} "
        f"publisher_sessions={result.publisher_sessions} final_epoch={result.epochs} "
        f"pointer_samples={result.pointer_samples} seconds={result.seconds:.0f} "
        f"problems={result.problems or 'none'}"
    )
    if not result.problems:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
