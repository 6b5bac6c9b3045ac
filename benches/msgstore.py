#!/usr/bin/env python3
"""Benchmark of message-store compaction: v2 HOLE markers against v1-style zero-fill (not a test).

The remove-heavy workload: write ``--gib`` GiB (default 1) of messages of 4-64 KiB into files
of ``--file-size`` bytes (default 16 MiB, RabbitMQ's ``msg_store_file_size_limit``), remove
70% of them in random order, then compact every file. The same messages, files and removal
order are used on both sides:

* v2: ``tierlog.msgstore.MessageStore`` (``MESSAGE_WITH_CHECKSUM`` records; a removal writes
  a 5-byte HOLE header; compaction writes one HOLE header per gap, moves messages from the end
  into holes, fsyncs, truncates);
* v1: RabbitMQ's v1 records and its compaction as of ``rabbit_msg_store:compact_file``,
  implemented here: removal touches no file; compaction zero-fills every gap between live
  messages (``blank_holes_in_file``), moves messages from the end into holes with the same
  plan, fsyncs once, truncates (``truncate_file`` does not sync; neither does v2's truncate).

Both sides fsync. Only compaction is compared (removal times are printed too). With several
``--rounds`` the two sides alternate which goes first; the speedup is the ratio of the
per-side medians. Time is wall-clock of compacting every file; bytes written are what
compaction hands to ``pwrite``. Between sides the bench deletes the store, calls ``sync``
and waits a second, so one side's freed blocks are not discarded during the other's run.

The last line is exactly
``compaction_speedup=<v1 time / v2 time> bytes_written_ratio=<v2 bytes / v1 bytes>``.

    python benches/msgstore.py [--gib 1] [--rounds 1] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass

from tierlog.formats import msgstore as fmt
from tierlog.msgstore import MessageStore, MsgStoreConfig
from tierlog.msgstore.compaction import plan_compaction

KIB = 1024
GIB = 1024**3
ZERO_CHUNK = bytes(1024 * KIB)


@dataclass
class Side:
    name: str
    remove_s: float = 0.0
    compact_s: float = 0.0
    compact_bytes: int = 0
    size_before: int = 0
    size_after: int = 0


def workload(gib: float, seed: int) -> tuple[list[tuple[bytes, int, int]], bytes, list[int]]:
    """(msg id, offset in the payload pool, length) per message, the pool, removal order."""
    rng = random.Random(seed)
    pool = os.urandom(64 * 1024 * KIB)
    messages = []
    total = 0
    while total < gib * GIB:
        length = rng.randint(4 * KIB, 64 * KIB)
        messages.append((rng.randbytes(16), rng.randrange(len(pool) - length), length))
        total += length
    removed = rng.sample(range(len(messages)), int(len(messages) * 0.7))
    return messages, pool, removed


def run_v2(directory: str, file_size: int, messages, pool, removed) -> Side:  # type: ignore[no-untyped-def]
    side = Side("v2")
    store = MessageStore.open(
        directory, MsgStoreConfig(file_size_limit=file_size, sync_writes=False)
    )
    view = memoryview(pool)
    for msg_id, offset, length in messages:
        store.write(msg_id, view[offset : offset + length])
    store.sync()
    t0 = time.perf_counter()
    for i in removed:
        store.remove(messages[i][0])
    store.sync()
    side.remove_s = time.perf_counter() - t0
    files = [f for f in sorted(store.files) if f != store.current_file]
    side.size_before = sum(store.files[f].size for f in files)
    t0 = time.perf_counter()
    for file in files:
        if file in store.files:
            result = store.compact(file)
            side.compact_bytes += result.bytes_written
            side.size_after += result.size_after
    side.compact_s = time.perf_counter() - t0
    store.close()
    return side


class V1Store:
    """RabbitMQ's v1 file layout and compaction, as the comparison baseline."""

    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.index: dict[bytes, tuple[int, int, int]] = {}
        self.live: dict[int, set[bytes]] = {}
        self.sizes: dict[int, int] = {}
        self.fds: dict[int, int] = {}
        self.current = -1

    def _roll(self) -> None:
        self.current += 1
        path = os.path.join(self.directory, f"{self.current}.rdq")
        self.fds[self.current] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.sizes[self.current] = 0
        self.live[self.current] = set()

    def write(self, msg_id: bytes, body: memoryview) -> None:
        record = fmt.encode_v1_record(msg_id, bytes(body))
        if self.current < 0 or self.sizes[self.current] + len(record) > self.file_size:
            self._roll()
        file = self.current
        os.pwrite(self.fds[file], record, self.sizes[file])
        self.index[msg_id] = (file, self.sizes[file], len(record))
        self.live[file].add(msg_id)
        self.sizes[file] += len(record)

    def remove(self, msg_id: bytes) -> None:
        file, _o, _s = self.index.pop(msg_id)
        self.live[file].discard(msg_id)

    def compact(self, file: int) -> tuple[int, int]:
        """``rabbit_msg_store:compact_file``: blank every hole, move, sync, truncate."""
        fd = self.fds[file]
        live = sorted((self.index[m][1], self.index[m][2], m) for m in self.live[file])
        written = 0
        cursor = 0
        for offset, size, _m in live:  # blank_holes_in_file: zero every gap
            gap = offset - cursor
            while gap > 0:
                chunk = ZERO_CHUNK[: min(gap, len(ZERO_CHUNK))]
                os.pwrite(fd, chunk, cursor)
                written += len(chunk)
                cursor += len(chunk)
                gap -= len(chunk)
            cursor = offset + size
        moves, truncate_at = plan_compaction(live, 0)
        for src, size, msg_id, dst in moves:
            os.pwrite(fd, os.pread(fd, size, src), dst)
            written += size
            self.index[msg_id] = (file, dst, size)
        os.fsync(fd)
        os.ftruncate(fd, truncate_at)  # rabbit_msg_store:truncate_file does not sync
        self.sizes[file] = truncate_at
        return written, truncate_at

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def run_v1(directory: str, file_size: int, messages, pool, removed) -> Side:  # type: ignore[no-untyped-def]
    side = Side("v1")
    store = V1Store(directory, file_size)
    view = memoryview(pool)
    for msg_id, offset, length in messages:
        store.write(msg_id, view[offset : offset + length])
    for fd in store.fds.values():
        os.fsync(fd)
    t0 = time.perf_counter()
    for i in removed:
        store.remove(messages[i][0])
    side.remove_s = time.perf_counter() - t0
    files = [f for f in sorted(store.sizes) if f != store.current]
    side.size_before = sum(store.sizes[f] for f in files)
    t0 = time.perf_counter()
    for file in files:
        written, after = store.compact(file)
        side.compact_bytes += written
        side.size_after += after
    side.compact_s = time.perf_counter() - t0
    store.close()
    return side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB of messages per side (1)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, alternating order (1)")
    parser.add_argument("--file-size", type=int, default=16 * 1024 * KIB, help="file size limit")
    parser.add_argument("--dir", default=None, help="where to put the stores (a temp dir)")
    parser.add_argument("--seed", type=int, default=20261124)
    args = parser.parse_args()
    print(f"load_average={os.getloadavg()[0]:.2f} cpus={os.cpu_count()}", flush=True)
    messages, pool, removed = workload(args.gib, args.seed)
    print(
        f"messages={len(messages)} bytes={sum(m[2] for m in messages)} "
        f"removed={len(removed)} file_size={args.file_size}",
        flush=True,
    )
    totals = {"v1": Side("v1"), "v2": Side("v2")}
    times: dict[str, list[float]] = {"v1": [], "v2": []}
    for round_no in range(args.rounds):
        order = [run_v1, run_v2] if round_no % 2 == 0 else [run_v2, run_v1]
        for run in order:
            base = tempfile.mkdtemp(prefix="tierlog-msgstore-bench-", dir=args.dir)
            try:
                side = run(base, args.file_size, messages, pool, removed)
            finally:
                shutil.rmtree(base, ignore_errors=True)
                # let the freed GiB's discards and writeback settle before the next side
                os.sync()
                time.sleep(1.0)
            total = totals[side.name]
            total.remove_s += side.remove_s
            total.compact_s += side.compact_s
            total.compact_bytes += side.compact_bytes
            times[side.name].append(side.compact_s)
            print(
                f"round={round_no} side={side.name} remove_s={side.remove_s:.3f} "
                f"compact_s={side.compact_s:.3f} compact_bytes_written={side.compact_bytes} "
                f"size_before={side.size_before} size_after={side.size_after} "
                f"load_average={os.getloadavg()[0]:.2f}",
                flush=True,
            )
    v1, v2 = totals["v1"], totals["v2"]
    print(
        f"compaction_speedup={statistics.median(times['v1']) / statistics.median(times['v2']):.2f} "
        f"bytes_written_ratio={v2.compact_bytes / v1.compact_bytes:.3f}"
    )


if __name__ == "__main__":
    main()
