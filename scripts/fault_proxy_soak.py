"""Long run of ``tierlog serve`` on S3 (SeaweedFS) behind the S3 fault proxy.

Publishes confirmed messages with a named rstream producer while the proxy faults a share of
object-store requests (500, 503 SlowDown, resets, 2-10 s delays, slow bodies, lost replies),
SIGKILLs and restarts the server now and then, and at the end turns the faults off, waits for
tiering to catch up and reads everything back from the first offset (mostly from the remote
tier: the local tier keeps almost nothing). Prints the counts as JSON.

Oracle: every confirmed message is read back exactly once, in publish order.

    PYTHONPATH=src python scripts/fault_proxy_soak.py --minutes 30 --rate 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rstream import ConsumerOffsetSpecification, OffsetType, Producer
from rstream.producer import ConfirmationStatus
from rstream.utils import RawMessage
from tests.plugins.s3_fault_proxy import FaultProxy
from tests.plugins.seaweed import _s3_client, start_seaweed, stop_seaweed
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.test_server_e2e import consume

from tierlog.storage.s3_object_store import PROBE_PREFIX

STREAM = "soak"
STREAM_ARGS = {
    "x-tierlog-fragment-bytes": str(1 << 20),
    "x-tierlog-max-fragment-age": "1s",
    "x-tierlog-debounce-seconds": "0.2",
    "stream-max-segment-size-bytes": str(1 << 20),
    "x-tierlog-local-max-bytes": "1",
}


def config_text(uri: str) -> str:
    return f"""
[storage]
object_store = "{uri}"

[store]
max_attempts = 8
base_delay_seconds = 0.05
max_delay_seconds = 2.0
startup_deadline_seconds = 120

[tier]
delete_grace_seconds = 5.0
"""


def status(server: TierlogServerProcess) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.admin_url}/api/streams/{STREAM}",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


async def publish_batch(
    server: TierlogServerProcess, first_seq: int, count: int, confirmed: set[int]
) -> None:
    """Publish ``count`` messages with publishing ids = sequence numbers (named producer:
    a resend after a crash is deduplicated); record the confirmed ones."""
    done = asyncio.Event()
    seen = 0

    async def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal seen
        seen += 1
        if status.is_confirmed:
            confirmed.add(status.message_id)
        if seen >= count:
            done.set()

    batch = [
        RawMessage(b"soak-%09d-" % seq + b"x" * 1000, publishing_id=seq)
        for seq in range(first_seq, first_seq + count)
    ]
    async with Producer(
        "127.0.0.1", port=server.stream_port, username="guest", password="guest"
    ) as p:
        await p.send_batch(STREAM, batch, publisher_name="soak", on_publish_confirm=on_confirm)  # type: ignore[arg-type]
        await asyncio.wait_for(done.wait(), 60)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tierlog-soak-"))
    seaweed = start_seaweed(work / "seaweed")
    proxy = FaultProxy(seaweed.endpoint, seed=args.seed).start()
    prefix = f"soak/{uuid.uuid4().hex}"
    uri = f"s3://{seaweed.bucket}/{prefix}?endpoint={proxy.endpoint}&region={seaweed.region}"
    server = TierlogServerProcess(
        work / "data",
        config_text=config_text(uri),
        env={"AWS_ACCESS_KEY_ID": seaweed.access_key, "AWS_SECRET_ACCESS_KEY": seaweed.secret_key},
    )
    result: dict[str, Any] = {"minutes": args.minutes, "rate": args.rate, "delay_s": args.delay}
    try:
        proxy.configure(rate=args.rate, delay_s=tuple(args.delay))
        t0 = time.monotonic()
        server.start()
        start_times = [time.monotonic() - t0]
        async with Producer(
            "127.0.0.1", port=server.stream_port, username="guest", password="guest"
        ) as p:
            await p.create_stream(STREAM, arguments=STREAM_ARGS)
        confirmed: set[int] = set()
        seq = 1
        end = time.monotonic() + args.minutes * 60
        next_kill = time.monotonic() + args.kill_every
        failed_batches = 0
        while time.monotonic() < end:
            try:
                await publish_batch(server, seq, args.batch, confirmed)
            except Exception as exc:
                failed_batches += 1
                print(f"batch at {seq} failed: {exc!r}", file=sys.stderr)
            seq += args.batch
            await asyncio.sleep(args.pause)
            if time.monotonic() >= next_kill:
                server.kill()
                t0 = time.monotonic()
                server.start()
                start_times.append(time.monotonic() - t0)
                next_kill = time.monotonic() + args.kill_every
        faults_during = dict(proxy.injected)
        proxy.off()
        stopped = time.monotonic()
        caught_up = None
        while time.monotonic() - stopped < 120:
            s = status(server)
            if s["remote"]["tiered_offset"] == s["local"]["next_offset"]:
                caught_up = time.monotonic() - stopped
                break
            await asyncio.sleep(0.5)
        s = status(server)
        got = await consume(
            server,
            STREAM,
            ConsumerOffsetSpecification(OffsetType.FIRST),
            len(confirmed),
            timeout=600,
        )
        seqs = [int(body[5:14]) for _, body in got]
        read = set(seqs)
        log = server.log_tail(50_000_000)
        server.stop()
        probes = _s3_client(seaweed.endpoint).list_objects_v2(
            Bucket=seaweed.bucket, Prefix=f"{prefix}/{PROBE_PREFIX}"
        )
        result.update(
            {
                "published": seq - 1,
                "confirmed": len(confirmed),
                "failed_batches": failed_batches,
                "read_back": len(seqs),
                "confirmed_lost": len(confirmed - read),
                "duplicates": len(seqs) - len(read),
                "in_order": seqs == sorted(seqs),
                "restarts": len(start_times) - 1,
                "start_seconds_max": round(max(start_times), 2),
                "start_seconds_mean": round(sum(start_times) / len(start_times), 2),
                "caught_up_seconds": None if caught_up is None else round(caught_up, 1),
                "requests_through_proxy": proxy.requests,
                "faults_injected": faults_during,
                "retry_warnings_logged": len(re.findall("event=object_store_retry", log)),
                "degraded_events": len(re.findall("event=tiering_degraded", log)),
                "create_resolved_as_own_write": len(
                    re.findall("event=create_resolved_as_own_write", log)
                ),
                "probe_objects_left": len(probes.get("Contents", [])),
                "remote_tiering_status": s["remote"]["tiering"],
            }
        )
        return result
    finally:
        server.kill()
        proxy.stop()
        stop_seaweed(seaweed)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.10)
    parser.add_argument("--delay", type=float, nargs=2, default=[2.0, 10.0])
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent / "src"))
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    ok = result["confirmed_lost"] == 0 and result["duplicates"] == 0 and result["in_order"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
