"""Benchmark: the pure tiering state machine's cost per committed chunk against the number
of chunks waiting to be cut, incremental ``TieringState`` vs the rescanning reference copy.

Each case first hands the machine ``P`` chunks in one batch (1,100 B each, one segment,
a 64 MiB fragment size and a 60 s age: none is cut), then times ``N`` more chunks handed
over one per event the way the tierer's event loop does it (``next_deadline``, then
``ChunksCommitted`` of one chunk, then ``Tick``). Old and new run alternately, 3 rounds;
the medians are printed. Times are this process's CPU time (``time.process_time``), not
wall time, because the 2-core machine is shared with other work. The old side is the
pre-incremental implementation kept as the oracle of the tests
(tests/tiering/state_reference.py).

Last line: ``state_cost_ratio=<new µs/chunk at 50,000 pending ÷ new at 300>`` (target ≈ 1).

    .venv/bin/python benches/tiering_state.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.tiering.state_reference import ReferenceTieringState  # noqa: E402

from tierlog.tiering.state import (  # noqa: E402
    MIB,
    ChunkRef,
    ChunksCommitted,
    Tick,
    TieringConfig,
    TieringState,
)

PENDING = (300, 2_200, 4_200, 20_000, 50_000)
CHUNK_BYTES = 1_100  # a 10-message frame of 100 B messages, with headers
CONFIG = TieringConfig(fragment_bytes=64 * MIB, max_fragment_age=60.0, segment_bytes=500_000_000)


def chunk(i: int) -> ChunkRef:
    return ChunkRef(
        chunk_id=10 * i,
        next_offset=10 * i + 10,
        timestamp=i,
        epoch=1,
        segment=0,
        position=8 + CHUNK_BYTES * i,
        size=CHUNK_BYTES,
        data_crc=i,
        chunk_type=0,
    )


def per_chunk_us(machine_type: Any, pending: int, n: int) -> float:
    state = machine_type(CONFIG, committed_next=0)
    state.handle(ChunksCommitted(tuple(chunk(i) for i in range(pending))), 0.0)
    batches = [ChunksCommitted((chunk(i),)) for i in range(pending, pending + n)]
    tick = Tick()
    now = 1.0
    start = time.process_time()
    for event in batches:
        state.next_deadline()
        state.handle(event, now)
        state.handle(tick, now)
        now += 0.002
    elapsed = time.process_time() - start
    assert not state.plans(), "nothing may be cut: the case measures pending chunks"
    return elapsed / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    old: dict[int, list[float]] = {p: [] for p in PENDING}
    new: dict[int, list[float]] = {p: [] for p in PENDING}
    for _ in range(args.rounds):
        for p in PENDING:
            # Enough chunks for ~0.3 s of the old machine; the new one gets 10,000.
            old[p].append(per_chunk_us(ReferenceTieringState, p, max(40, 2_000_000 // (p * 8))))
            new[p].append(per_chunk_us(TieringState, p, 10_000))
    print(f"{'pending':>8} {'old µs/chunk':>13} {'new µs/chunk':>13} {'old/new':>8}")
    for p in PENDING:
        o, n = statistics.median(old[p]), statistics.median(new[p])
        print(f"{p:>8,} {o:>13.2f} {n:>13.2f} {o / n:>8.1f}")
    ratio = statistics.median(new[PENDING[-1]]) / statistics.median(new[PENDING[0]])
    print(f"state_cost_ratio={ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
