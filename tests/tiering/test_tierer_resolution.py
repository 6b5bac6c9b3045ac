"""Resolution on a real store: uploaded-but-uncommitted fragments are read concurrently
from a listing of ``data/``, and the outcome is the one of reading them one by one, also
when the listing misses objects or fails."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faults.object_store import FaultyObjectStore
from tests.plugins.tiering_world import LOG, SMALL, World
from tierlog.log.writer import StreamLog
from tierlog.remote.fragments import RemoteFragment, RemoteStream
from tierlog.storage.errors import TransientError
from tierlog.storage.object_store import ObjectMeta, ObjectStore
from tierlog.tiering.tierer import StreamTierer

DELAY = 0.05  # seconds per trailer read: a slow object store


class SlowStore(FaultyObjectStore):
    """Trailer reads take ``DELAY`` and are counted in flight; listings are complete,
    empty, miss every other object, or fail."""

    def __init__(self, inner: ObjectStore, listing: str) -> None:
        super().__init__(inner)
        self.listing = listing
        self.in_flight = 0
        self.peak = 0
        self.trailer_reads: list[str] = []
        self._count = threading.Lock()

    def get_suffix(self, key: str, length: int) -> bytes:
        with self._count:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.trailer_reads.append(key)
        try:
            time.sleep(DELAY)
            return super().get_suffix(key, length)
        finally:
            with self._count:
                self.in_flight -= 1

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        if self.listing == "failing" and "/data/" in prefix:
            raise TransientError("injected: listing failed")
        for i, meta in enumerate(super().list(prefix, start_after)):
            if self.listing == "empty" and "/data/" in meta.key:
                continue
            if self.listing == "partial" and "/data/" in meta.key and i % 2:
                continue
            yield meta


def leave_uncommitted_fragments(world: World) -> tuple[int, list[RemoteFragment]]:
    """A writer commits some fragments, then uploads more whose commits all fail, and
    crashes. Returns the committed next offset and the chain after it, read one by one."""
    tierer = world.tierer()
    tierer.start()
    world.append(5)
    assert tierer.flush()
    committed = tierer.durable_next
    metadata = f"stream/{world.record.incarnation}/metadata/"
    world.store.fail_nth("put_if_absent", 1, key_prefix=metadata, times=10_000)
    world.append(40)
    tierer.flush(timeout=1.5)
    tierer.stop(flush=False)
    world.store.clear_faults()
    assert tierer.durable_next == committed
    remote = RemoteStream(world.store, "", world.record.incarnation)
    chain, at = [], committed
    while (fragment := remote.read_fragment(at)) is not None:
        chain.append(fragment)
        at = fragment.trailer.next_offset
    return committed, chain


@pytest.mark.parametrize("listing", ["complete", "empty", "partial", "failing"])
def test_resolution_reads_concurrently_and_adopts_the_same_chain(
    world: World, listing: str
) -> None:
    committed, chain = leave_uncommitted_fragments(world)
    assert len(chain) >= 4, "the scenario must leave several uncommitted fragments"
    assert chain[0].trailer.first_offset == committed
    slow = SlowStore(world.store, listing)
    tierer = StreamTierer(world.log, slow, world.catalog, world.deletions, config=SMALL, m=4)
    world.tierers.append(tierer)
    started = time.monotonic()
    result = tierer.start()
    elapsed = time.monotonic() - started
    end = chain[-1].trailer.next_offset
    assert (result.next_offset, result.adopted, result.restarted_local) == (end, len(chain), False)
    assert tierer.durable_next == end  # the fencing commit adopted the chain
    assert tierer.flush()
    assert world.remote_chunks(tierer) == world.local_chunks()
    chain_keys = {f.key for f in chain}
    assert chain_keys <= set(slow.trailer_reads)
    if listing == "complete":
        assert slow.peak >= 2
        assert elapsed < DELAY * len(chain)  # one by one would take at least this long
    if listing in ("empty", "failing"):
        assert slow.peak == 1  # nothing to read ahead: one read after another


def test_a_corrupt_fragment_past_a_hole_does_not_stop_resolution(world: World) -> None:
    """Listed objects the chain never reaches are read speculatively; their errors must not
    count (one-by-one resolution never read them)."""
    committed, chain = leave_uncommitted_fragments(world)
    end = chain[-1].trailer.next_offset
    stray = RemoteStream(world.store, "", world.record.incarnation).fragment_key(end + 1000)
    world.store.put_if_absent(stray, b"not a fragment at all")
    tierer = world.tierer()
    result = tierer.start()
    assert (result.next_offset, result.adopted) == (end, len(chain))
    assert committed < end


def test_remote_ahead_replays_tracking_from_the_adopted_chain(world: World) -> None:
    """The local disk is lost after uploads that were never committed: the restarted local
    log continues past the adopted chain with the tracking state replayed from it."""
    tierer = world.tierer()
    tierer.start()
    world.append(5)
    assert tierer.flush()
    metadata = f"stream/{world.record.incarnation}/metadata/"
    world.store.fail_nth("put_if_absent", 1, key_prefix=metadata, times=10_000)
    world.append(10)
    world.log.store_offset("reporting", 42)
    world.log.append([b"after-offset"], producer="p1", publishing_ids=[7])
    tierer.flush(timeout=1.5)
    tierer.stop(flush=False)
    world.store.clear_faults()
    local_next = world.log.next_offset
    remote = RemoteStream(world.store, "", world.record.incarnation)
    chain, at = [], tierer.durable_next
    while (fragment := remote.read_fragment(at)) is not None:
        chain.append(fragment)
        at = fragment.trailer.next_offset
    assert chain and at == local_next  # every chunk was uploaded, none committed
    stream_dir = world.log.stream_dir
    world.log.close()
    for name in os.listdir(stream_dir):
        os.unlink(os.path.join(stream_dir, name))
    os.rmdir(stream_dir)
    world.log = StreamLog.create(
        world.data_dir, "/", "orders", LOG, created_ns=world.record.created_ns
    )
    fresh = world.tierer()
    result = fresh.start()
    assert (result.next_offset, result.adopted, result.restarted_local) == (at, len(chain), True)
    assert world.log.next_offset >= at
    assert world.log.query_offset("reporting") == 42
    assert world.log.producer_sequence("p1") == 7
    world.append(3)
    assert fresh.flush()
