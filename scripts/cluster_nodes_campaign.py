"""Run the randomized multi-process cluster fault campaign and print its counts.

    PYTHONPATH=src python scripts/cluster_nodes_campaign.py --cycles 30 [--seed 7] [--members 3]

Starts one etcd and one SeaweedFS (stopped by PID at the end), three ``tierlog serve``
nodes, and runs one random fault per cycle while a named producer publishes with
confirms. ``--members 1`` (``tests/cluster/nodes_campaign.py``): a one-member stream;
leader SIGKILL, leader SIGSTOP past its lease, leader cut from etcd, another node
SIGKILLed. ``--members 3`` (``tests/cluster/nodes_campaign_replicated.py``): a stream of
three members; the same leader faults plus every replication link cut, the leader
isolated from its members, a follower
SIGKILLed, a member removed and added back, a node retired and brought back. Exit status
1 when the oracle finds a problem (the work directory with every node's log is kept).
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
from tests.cluster.nodes_campaign_replicated import run_replicated_campaign
from tests.plugins.etcd import find_or_install_etcd, start_etcd, stop_process
from tests.plugins.seaweed import start_seaweed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--members", type=int, choices=(1, 3), default=1)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tierlog-cluster-campaign-"))
    (workdir / "etcd").mkdir()
    etcd, etcd_port = start_etcd(find_or_install_etcd(), workdir / "etcd")
    s3 = start_seaweed(workdir / "seaweed")
    nodes, etcd_endpoint = workdir / "nodes", f"127.0.0.1:{etcd_port}"
    try:
        if args.members == 3:
            campaign = run_replicated_campaign(
                nodes, etcd_endpoint, s3, args.cycles, args.seed, progress=_progress
            )
        else:
            campaign = run_nodes_campaign(nodes, etcd_endpoint, s3, args.cycles, args.seed)
        result = asyncio.run(campaign)
    finally:
        s3.stop()
        stop_process(etcd)
    print(
        f"cycles={result.cycles} faults={result.faults} confirmed={result.confirmed} "
        f"read_back={result.read_back} member_reads={result.member_reads} "
        f"refused_publishes={result.refused_publishes} "
        f"publisher_sessions={result.publisher_sessions} final_epoch={result.epochs} "
        f"pointer_samples={result.pointer_samples} seconds={result.seconds:.0f} "
        f"problems={result.problems or 'none'}"
    )
    if result.problems:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if result.problems else 0


def _progress(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
