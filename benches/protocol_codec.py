"""Microbenchmark: the stream protocol codec alone (no sockets), per frame.

Times the hot paths (Publish decode, PublishConfirm encode, Deliver prefix) and a few
schema-declared commands in both directions. ``--src`` picks the ``src`` directory to
import tierlog from, so two checkouts can be compared in one run, alternating rounds::

    .venv/bin/python benches/protocol_codec.py --src /path/old/src --src /path/new/src

Each source runs in its own long-lived interpreter; case by case, the sources are timed
in turn ``--rounds`` times (each time the best of 3 repeats), so old and new see the same
machine load. Prints one line per case: the best time per call of each source, the least
disturbed figure on a shared machine, and with two sources the ratio last ÷ first (above
1 = slower).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = r"""
import struct
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command, OffsetType
from tierlog.formats.protocol.deliver import deliver_prefix
from tierlog.formats.protocol.publish import (
    decode_publish, encode_publish, encode_publish_confirm, encode_publish_entries,
    subbatch_entry, subbatch_records,
)

uniform = memoryview(encode_publish(1, [(i, b"x" * 100) for i in range(1000)]))[4:]
mixed_entries = [subbatch_entry(subbatch_records([b"a" * 50] * 10), 10, 540)] + [
    struct.pack(">I", n) + b"y" * n for n in range(1, 100)
]
mixed = memoryview(encode_publish_entries(1, list(range(100)), mixed_entries))[4:]
ids = list(range(1000))
subscribe = memoryview(
    c.SubscribeRequest(
        7, 1, "orders", c.WireOffsetSpec(OffsetType.OFFSET, 42), 10, {"name": "consumer-1"}
    ).encode()
)[4:]
credit = memoryview(c.CreditRequest(1, 1).encode())[4:]
store = memoryview(c.StoreOffsetRequest("consumer-1", "orders", 12345).encode())[4:]
declare = memoryview(c.DeclarePublisherRequest(3, 1, "producer-1", "orders").encode())[4:]
metadata = c.MetadataResponse(
    9,
    [c.BrokerAddress(0, "localhost", 5552)],
    [c.StreamMetadata("orders", 1, 0, ()), c.StreamMetadata("gone", 2, 0xFFFF, ())],
)
metadata_wire = memoryview(metadata.encode())[4:]
query_offset = c.QueryOffsetResponse(5, 1, 99)
peer = c.PeerPropertiesResponse(1, 1, {"product": "tierlog", "platform": "Python"})

cases = {
    "decode_publish uniform 1000x100B": lambda: decode_publish(uniform),
    "decode_publish mixed 100 (sub-batch)": lambda: decode_publish(mixed),
    "encode_publish_confirm 1000 ids": lambda: encode_publish_confirm(1, ids),
    "deliver_prefix v2": lambda: deliver_prefix(1, 4096, 77),
    "decode Subscribe": lambda: c.decode_client_frame(subscribe),
    "decode Credit": lambda: c.decode_client_frame(credit),
    "decode StoreOffset": lambda: c.decode_client_frame(store),
    "decode DeclarePublisher": lambda: c.decode_client_frame(declare),
    "decode MetadataResponse": lambda: c.decode_server_frame(metadata_wire),
    "encode MetadataResponse": metadata.encode,
    "encode QueryOffsetResponse": query_offset.encode,
    "encode PeerPropertiesResponse": peer.encode,
    "encode SimpleResponse": c.SimpleResponse(Command.SUBSCRIBE, 4, 1).encode,
}
"""

RUNNER = r"""
import json, sys, timeit
sys.path.insert(0, sys.argv[1])
exec(sys.argv[2])
print(json.dumps(list(cases)), flush=True)
for line in sys.stdin:
    fn = cases[line.strip()]
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    print(min(timer.repeat(3, number)) / number * 1e9, flush=True)
"""


class Child:
    """A long-lived interpreter importing tierlog from one ``src``; times a case on request."""

    def __init__(self, src: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, src, CASES],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.cases: list[str] = json.loads(self.stdout.readline())

    def time(self, case: str) -> float:
        self.stdin.write(case + "\n")
        self.stdin.flush()
        return float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, help="a src directory")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    children = [Child(src) for src in args.src]
    try:
        for case in children[0].cases:
            best = [child.time(case) for child in children]
            for _ in range(args.rounds - 1):  # alternate the sources, case by case
                best = [min(b, child.time(case)) for b, child in zip(best, children, strict=True)]
            cols = " ".join(f"{b:10.0f} ns" for b in best)
            ratio = f"  new/old {best[-1] / best[0]:.2f}" if len(best) > 1 else ""
            print(f"{case:40s} {cols}{ratio}", flush=True)
    finally:
        for child in children:
            child.close()


if __name__ == "__main__":
    main()
