"""Benchmark: the cluster service — replication cost, failover time, ``ack=remote`` latency.

Three parts, each on real processes (``tierlog serve`` subprocesses, SeaweedFS, etcd, all
started here on free loopback ports and stopped at the end):

* ``rf3_ratio``: publish throughput of an RF=3 stream ÷ an RF=1 stream, same client, same
  run (target ≥ 0.5). Needs a three-node cluster.
* ``failover_s``: seconds from SIGKILL of a stream's leader to the first confirm on the new
  leader, with a bench client that re-queries Metadata every 100 ms (target ≤ lease TTL +
  2 s; ``ttl_s`` is the lease TTL used). Needs a three-node cluster.
* ``remote_ack_p99_ms``: p99 confirm latency of an ``x-tierlog-ack=remote`` stream on
  SeaweedFS + etcd (target ≤ 1000 ms): a named producer keeps up to ``--in-flight``
  messages unconfirmed for ``--seconds``; a message's latency runs from its send to its
  confirm. The stream cuts and commits a fragment every ``tier.remote_ack_interval_seconds``
  (default 0.2 s), so the floor is about that interval plus one fragment PUT and one
  manifest commit (root PUT + etcd conditional put).
* ``catchup_chunks_per_s``: the rate a member (restarted after being killed) catches up
  ``--catchup-chunks`` (100,000) one-message chunks the leader wrote while it was away
  (target ≥ 0.5 of ``catchup_leader_chunks_per_s``, the rate the leader wrote them at,
  one message in flight per producer, 32 producers). Needs a three-node cluster.

The cluster parts run on the multi-node test harness (``tests/cluster/nodes.py``, see
``benches/cluster_parts.py``); when the build has no harness or will not create a
replicated stream they are refused with a message (exit code 3), never estimated, and the
last line carries only what was measured. With every part measured the last line is
exactly ``rf3_ratio=<x> failover_s=<y> ttl_s=<t> remote_ack_p99_ms=<z>
catchup_chunks_per_s=<c> catchup_leader_chunks_per_s=<w>``.

    .venv/bin/python benches/cluster.py [--seconds 10] [--in-flight 200] [--only remote_ack]
        [--catchup-chunks 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.cluster_parts import Refused, catchup_chunks_per_s, failover_s, rf3_ratio
from tests.plugins.etcd import find_or_install_etcd, start_etcd, stop_process
from tests.plugins.seaweed import SeaweedServer, start_seaweed, stop_seaweed
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.server.remote_ack_run import create, publish_for
from tests.server.test_remote_ack_disk_loss import remote_config, s3_env

PARTS = ("rf3", "failover", "remote_ack", "catchup")
EXIT_INCOMPLETE = 3


async def remote_ack_p99_ms(
    workdir: Path, seaweed: SeaweedServer, etcd: str, seconds: float, in_flight: int
) -> tuple[float, int]:
    """(p99 confirm latency in ms, confirmed messages) of an ack=remote stream."""
    prefix = f"bench-{uuid.uuid4().hex}"
    server = TierlogServerProcess(
        workdir / "remote-ack-node",
        config_text=remote_config(seaweed, etcd, prefix),
        env=s3_env(seaweed),
    )
    try:
        server.start()
        stream = "bench-remote-ack"
        await create(
            server.stream_port,
            stream,
            {"x-tierlog-ack": "remote", "x-tierlog-fragment-bytes": str(8 << 20)},
        )
        # a short warm-up (connections to SeaweedFS and etcd, first volume allocation)
        await publish_for(server.stream_port, stream, 1.0, producer="warm-up", in_flight=in_flight)
        published = await publish_for(
            server.stream_port, stream, seconds, producer="bench", in_flight=in_flight
        )
        if published.refused:
            raise RuntimeError(f"{published.refused} publishes were refused")
        return published.p99_ms(), len(published.confirmed)
    finally:
        try:
            server.stop()
        finally:
            server.kill()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0, help="publish time per part")
    parser.add_argument("--in-flight", type=int, default=200, help="unconfirmed messages at most")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only these parts")
    parser.add_argument(
        "--catchup-chunks", type=int, default=100_000, help="chunks the member is behind"
    )
    args = parser.parse_args()
    parts = args.only or list(PARTS)
    results: dict[str, str] = {}
    incomplete = False
    workdir = Path(tempfile.mkdtemp(prefix="tierlog-bench-cluster-"))
    seaweed = start_seaweed(workdir / "seaweed")
    (workdir / "etcd").mkdir()
    etcd_proc, etcd_port = start_etcd(find_or_install_etcd(), workdir / "etcd")
    etcd = f"127.0.0.1:{etcd_port}"
    try:
        if "rf3" in parts:
            try:
                ratio, lines = asyncio.run(
                    rf3_ratio(workdir, etcd, seaweed, args.seconds, args.in_flight)
                )
            except Refused as exc:
                print(f"rf3: refused: {exc}; nothing is estimated", file=sys.stderr)
                incomplete = True
            else:
                print("\n".join(lines))
                results["rf3_ratio"] = f"{ratio:.3f}"
        if "failover" in parts:
            try:
                seconds, ttl, notes = asyncio.run(failover_s(workdir, etcd, seaweed))
            except Refused as exc:
                print(f"failover: refused: {exc}; nothing is estimated", file=sys.stderr)
                incomplete = True
            else:
                print("\n".join(notes))
                print(f"failover: first confirm on the new leader {seconds:.2f} s after SIGKILL")
                results["failover_s"] = f"{seconds:.2f}"
                results["ttl_s"] = f"{ttl:.1f}"
        if "remote_ack" in parts:
            p99, confirmed = asyncio.run(
                remote_ack_p99_ms(
                    workdir, seaweed, f"127.0.0.1:{etcd_port}", args.seconds, args.in_flight
                )
            )
            print(
                f"remote_ack: {confirmed} messages confirmed in {args.seconds:.0f} s, "
                f"{args.in_flight} in flight, p99 confirm latency {p99:.0f} ms"
            )
            results["remote_ack_p99_ms"] = f"{p99:.0f}"
        if "catchup" in parts:
            try:
                rate, leader_rate, notes = asyncio.run(
                    catchup_chunks_per_s(workdir, etcd, seaweed, args.catchup_chunks)
                )
            except Refused as exc:
                print(f"catchup: refused: {exc}; nothing is estimated", file=sys.stderr)
                incomplete = True
            else:
                print("\n".join(notes))
                results["catchup_chunks_per_s"] = f"{rate:.0f}"
                results["catchup_leader_chunks_per_s"] = f"{leader_rate:.0f}"
    finally:
        stop_process(etcd_proc)
        stop_seaweed(seaweed)
        shutil.rmtree(workdir, ignore_errors=True)
    order = (
        "rf3_ratio",
        "failover_s",
        "ttl_s",
        "remote_ack_p99_ms",
        "catchup_chunks_per_s",
        "catchup_leader_chunks_per_s",
    )
    print(" ".join(f"{k}={results[k]}" for k in order if k in results))
    return EXIT_INCOMPLETE if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
