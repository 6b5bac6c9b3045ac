"""Many concurrent conditional writers on one key, on every MetaStore backend.

Invariants: exactly one writer wins per version (the successful writes form one chain,
each based on the version the previous one produced), nothing is lost (the chain has no
gaps and ends at the stored value), and the epoch rule holds (stored epochs never go
down along the chain: a writer with a lower epoch never overwrites a higher one).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tierlog.storage.errors import EpochFencedError, TransientError, VersionConflictError
from tierlog.storage.meta_store import MetaStore, Versioned, open_meta_store

KEY = "streams/hot"
ATTEMPTS = 30
SYNC_LIMIT_S = 120.0


@dataclass(frozen=True)
class Win:
    based_on: int  # the version the writer read and expected
    version: int  # the version its write produced
    epoch: int
    value: bytes


@dataclass
class Outcome:
    wins: list[Win]
    conflicts: int = 0
    fenced: int = 0


def write_loop(store: MetaStore, writer: str, epoch: int, attempts: int) -> Outcome:
    """Read-modify-write ``attempts`` times; stop for good once fenced (deposed)."""
    outcome = Outcome(wins=[])
    for n in range(attempts):
        current = store.get(KEY)
        assert current is not None
        value = f"{writer}:{n}".encode()
        try:
            stored = store.put_if(KEY, value, current.version, epoch)
        except VersionConflictError:
            outcome.conflicts += 1
            continue
        except EpochFencedError:
            outcome.fenced += 1
            return outcome
        except TransientError:
            # Ambiguous: the write may have happened. Re-read the pointer, as writers do.
            after = store.get(KEY)
            if after is not None and after.value == value:
                outcome.wins.append(Win(current.version, after.version, epoch, value))
            continue
        outcome.wins.append(Win(current.version, stored.version, epoch, value))
    return outcome


def process_writer(uri: str, writer: str, epoch: int, attempts: int, sync_dir: str) -> Outcome:
    """Entry point of a writer process: signal ready, wait for the start flag, write."""
    (Path(sync_dir) / f"ready-{writer}").touch()
    deadline = time.monotonic() + SYNC_LIMIT_S
    while not (Path(sync_dir) / "go").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("never got the start flag")
        time.sleep(0.01)
    with open_meta_store(uri) as store:
        return write_loop(store, writer, epoch, attempts)


def check_history(initial: Versioned, outcomes: list[Outcome], final: Versioned) -> None:
    wins = sorted((w for o in outcomes for w in o.wins), key=lambda w: w.version)
    assert wins, "no writer ever succeeded"
    versions = [w.version for w in wins]
    assert len(set(versions)) == len(versions), "two writes produced the same version"
    based = [w.based_on for w in wins]
    assert len(set(based)) == len(based), "two writers won on the same version"
    # One unbroken chain from the initial version to the stored one: nothing lost.
    expected_base = initial.version
    for win in wins:
        assert win.based_on == expected_base, f"write {win} is not based on {expected_base}"
        expected_base = win.version
    assert final.version == wins[-1].version
    assert final.value == wins[-1].value
    # The epoch rule: stored epochs never decrease along the chain.
    epochs = [initial.epoch] + [w.epoch for w in wins]
    assert epochs == sorted(epochs), "a lower epoch overwrote a higher one"
    assert final.epoch == epochs[-1]


def test_threads_one_winner_per_version(meta_store_uri: str) -> None:
    """Threads share store instances (two of them, so etcd sees two connections)."""
    with open_meta_store(meta_store_uri) as a, open_meta_store(meta_store_uri) as b:
        initial = a.create(KEY, b"initial", epoch=1)
        start = threading.Barrier(8)

        def run(i: int) -> Outcome:
            start.wait(timeout=SYNC_LIMIT_S)
            return write_loop(a if i % 2 else b, f"t{i}", 1 + i % 4, ATTEMPTS)

        with ThreadPoolExecutor(max_workers=8) as pool:
            outcomes = list(pool.map(run, range(8)))
        final = a.get(KEY)
        assert final is not None
        check_history(initial, outcomes, final)
        total = sum(len(o.wins) + o.conflicts + o.fenced for o in outcomes)
        assert total > len([w for o in outcomes for w in o.wins])  # there was contention
        # Once the top epoch is stored, every lower-epoch writer is fenced.
        if final.epoch > 1:
            try:
                a.put_if(KEY, b"deposed", final.version, final.epoch - 1)
                raise AssertionError("a lower epoch overwrote a higher one")
            except EpochFencedError:
                pass


def test_processes_and_threads_one_winner_per_version(meta_store_uri: str, tmp_path: Path) -> None:
    """Several processes plus threads of this one, all on the same key."""
    sync_dir = tmp_path / "sync"
    sync_dir.mkdir()
    with open_meta_store(meta_store_uri) as store:
        initial = store.create(KEY, b"initial", epoch=1)
        ctx = multiprocessing.get_context("spawn")
        # Most writers share the top epoch so they keep contending; two are deposed.
        proc_epochs, thread_epochs = [3, 3, 2], [3, 1]
        n_procs = len(proc_epochs)
        with ProcessPoolExecutor(max_workers=n_procs, mp_context=ctx) as procs:
            futures = [
                procs.submit(process_writer, meta_store_uri, f"p{i}", e, ATTEMPTS, str(sync_dir))
                for i, e in enumerate(proc_epochs)
            ]
            deadline = time.monotonic() + SYNC_LIMIT_S
            while len(list(sync_dir.glob("ready-*"))) < n_procs:
                assert time.monotonic() < deadline, "writer processes did not start"
                for future in futures:
                    if future.done():
                        future.result()  # surface a crashed writer
                time.sleep(0.02)
            (sync_dir / "go").touch()
            with ThreadPoolExecutor(max_workers=2) as threads:
                local = list(
                    threads.map(
                        lambda i: write_loop(store, f"t{i}", thread_epochs[i], ATTEMPTS), range(2)
                    )
                )
            outcomes = local + [f.result(timeout=SYNC_LIMIT_S) for f in futures]
        final = store.get(KEY)
        assert final is not None
        check_history(initial, outcomes, final)
