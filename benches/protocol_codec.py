"""Microbenchmark: the stream protocol codec alone (no sockets), per frame.

Times the hot paths (Publish decode, PublishConfirm encode, Deliver prefix) and a few
schema-declared commands in both directions. ``--src`` picks the ``src`` directory to
import tierlog from, so two checkouts can be compared in one run, alternating rounds::

    .venv/bin/python benches/protocol_codec.py --src /path/old/src --src /path/new/src

Prints one line per case and source: the best of ``--rounds`` rounds (each the best of
5 repeats) in ns per call, the least disturbed figure on a shared machine; with two
sources also the ratio last ÷ first (above 1 = slower).
"""

from __future__ import annotations

import argparse
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
        7, 1, "orders", c.OffsetSpec(OffsetType.OFFSET, 42), 10, {"name": "consumer-1"}
    ).encode()
)[4:]
credit = memoryview(c.CreditRequest(1, 1).encode())[4:]
store = memoryview(c.StoreOffsetRequest("consumer-1", "orders", 12345).encode())[4:]
declare = memoryview(c.DeclarePublisherRequest(3, 1, "producer-1", "orders").encode())[4:]
metadata = c.MetadataResponse(
    9,
    [c.Broker(0, "localhost", 5552)],
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
out = {}
for name, fn in cases.items():
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    out[name] = min(timer.repeat(5, number)) / number * 1e9
print(json.dumps(out))
"""


def run_once(src: str) -> dict[str, float]:
    """One round in a fresh interpreter (so two checkouts never share a module cache)."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", RUNNER, src, CASES], check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, help="a src directory")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    samples: list[dict[str, list[float]]] = [{} for _ in args.src]
    for _ in range(args.rounds):
        for i, src in enumerate(args.src):  # alternate sources within each round
            for name, ns in run_once(src).items():
                samples[i].setdefault(name, []).append(ns)
    medians = [{k: min(v) for k, v in s.items()} for s in samples]
    for name in medians[0]:
        cols = [f"{m[name]:10.0f} ns" for m in medians]
        ratio = f"  new/old {medians[-1][name] / medians[0][name]:.2f}" if len(medians) > 1 else ""
        print(f"{name:40s} {' '.join(cols)}{ratio}")


if __name__ == "__main__":
    main()
