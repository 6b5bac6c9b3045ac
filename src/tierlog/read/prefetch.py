"""Adaptive read-ahead for remote readers: a range stream per consumer, one shared pool and
one global memory budget.

A ``RangeStream`` reads a sequence of object byte ranges (spans) as one sequential byte
stream. Reads are served from blocks of ``request_bytes`` (one ranged GET each) that the
stream keeps in flight ahead of the consumer, up to its window. The window adapts like
RocketMQ's read-ahead: it grows by one request each time the consumer reaches a block that
was prefetched for it (it keeps up), and halves when prefetched blocks expire unread (not
reached within ``ttl_seconds`` of arriving). A window of several requests is several
concurrent GETs.

The ``MemoryBudget`` bounds every ranged GET of all streams, read-ahead and in flight
alike: a block is prefetched only when its reservation fits under the limit, so a slow or
stalled consumer cannot make the process grow (it stops prefetching the moment it stops
reading, and its stale blocks are expired by a sweep when others need the memory). The
block a consumer needs right now waits for room instead: read-ahead that nobody reached
yet is given up first (it is fetched again later), then the read waits for other readers
to consume theirs. A consumer in the middle of a chunk that spans two blocks may overdraw
the limit by one block while nobody else does (``MemoryBudget.force``), so readers that
each hold a block and need a next one never deadlock: the total stays under the limit
plus one request. A block that still finds no room after ``force_wait_seconds`` is
granted over the limit and counted (``MemoryBudget.overruns``): the total is bounded by
the limit plus one request per thread reading at the same time (8 in the server), not
per reader.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tierlog.errors import ConfigError
from tierlog.read.errors import FragmentExpiredError, ReadError, RemoteDataCorruptError
from tierlog.storage.errors import NotFoundError
from tierlog.storage.object_store import ObjectStore

MiB = 1024 * 1024

Span = tuple[str, int, int]  # object key, start, end (exclusive)


@dataclass(frozen=True, slots=True)
class PrefetchConfig:
    """Read-ahead settings shared by every reader of a process."""

    request_bytes: int = 4 * MiB
    min_request_bytes: int = 256 * 1024
    """Requests shrink toward this as readers multiply: each new block is at most
    ``memory_bytes / (2 x open readers)``, so every reader can hold the block it is in
    and the next one inside the budget (see ``Prefetcher.request_size``)."""
    max_window_bytes: int = 64 * MiB
    ttl_seconds: float = 30.0
    memory_bytes: int = 256 * MiB
    threads: int = 8
    force_wait_seconds: float = 0.05
    """How long a needed block waits for room before it is granted over the limit. The
    wait holds the reading thread, and the readers that would free room need threads
    too (the server reads on a small pool), so it must stay short: the overrun is then
    bounded by one request per thread reading at once, never by the number of readers."""
    initial_window_bytes: int = 0
    """The window a new reader starts with (0: one request). A reader catching up reads
    far ahead, so starting at the pool's concurrency saves the ramp-up of one request
    per hit; the window never starts above the reader's fair share of the budget
    (``memory_bytes / (2 x open readers)``), and halves as usual on expiry."""
    max_bytes_per_second: int = 0
    """Node-wide cap on remote read bytes per second (every GET of every reader); 0 is
    unlimited. Cold readers share it, so they cannot take the disk, network or CPU a
    hot writer needs."""

    def __post_init__(self) -> None:
        if self.request_bytes < 1:
            raise ConfigError("request_bytes must be >= 1")
        if self.min_request_bytes < 1:
            raise ConfigError("min_request_bytes must be >= 1")
        if self.max_window_bytes < self.request_bytes:
            raise ConfigError("max_window_bytes must be >= request_bytes")
        if self.ttl_seconds <= 0:
            raise ConfigError("ttl_seconds must be > 0")
        if self.memory_bytes < 1 or self.threads < 1:
            raise ConfigError("memory_bytes and threads must be >= 1")
        if self.force_wait_seconds < 0:
            raise ConfigError("force_wait_seconds must be >= 0")
        if self.initial_window_bytes < 0:
            raise ConfigError("initial_window_bytes must be >= 0 (0: one request)")
        if self.max_bytes_per_second < 0:
            raise ConfigError("max_bytes_per_second must be >= 0 (0: unlimited)")


class MemoryBudget:
    """Bytes reserved by prefetch buffers of all readers, under one limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.prefetch_peak = 0  # the most ``used`` ever was right after a prefetch grant
        self.refused = 0
        self.overruns = 0  # blocks granted over the limit (nothing freed room in time)
        self.waits = 0  # needed blocks that waited for room
        self.overdrafts = 0  # needed blocks granted past the limit to a holder (one at a time)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)

    def try_reserve(self, n: int) -> bool:
        """Reserve ``n`` bytes for read-ahead if they fit under the limit."""
        with self._lock:
            if self.used + n > self.limit:
                self.refused += 1
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            self.prefetch_peak = max(self.prefetch_peak, self.used)
            return True

    def force(self, n: int, timeout: float = 0.0, *, holding: bool = False) -> None:
        """Account ``n`` bytes a consumer needs right now.

        At once if they fit. A consumer ``holding`` a block already (it is in the middle
        of a chunk and needs the next block to finish it, and only then gives the first
        back) may overdraw the limit by this one block when nobody else is overdrawing:
        that guarantees progress when every block is held by such consumers, and bounds
        the total by ``limit`` plus one request. Anyone else waits for room, up to
        ``timeout`` seconds, then is granted over the limit (counted in ``overruns``).
        """
        with self._lock:
            if self.used + n > self.limit and self.used > 0:
                if holding and self.used <= self.limit:
                    self.overdrafts += 1
                else:
                    self.waits += 1
                    if not self._room.wait_for(lambda: self.used + n <= self.limit, timeout):
                        self.overruns += 1
            self.used += n
            self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        with self._lock:
            self.used -= n
            assert self.used >= 0, "memory budget released more than reserved"
            self._room.notify_all()


class ReadRateLimit:
    """A token bucket over bytes: ``take(n)`` returns once ``n`` bytes fit the rate.

    Takers go into debt in arrival order and sleep off their share, so concurrent GETs
    are paced fairly; a burst of up to one second's worth passes at once.
    """

    def __init__(self, bytes_per_second: int, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self.set_rate(bytes_per_second)

    def set_rate(self, bytes_per_second: int) -> None:
        if bytes_per_second < 0:
            raise ConfigError("the read rate must be >= 0 bytes per second (0: unlimited)")
        with self._lock:
            self.rate = bytes_per_second
            self._tokens = float(bytes_per_second)
            self._at = self._clock()
        self.waited_seconds = 0.0

    def take(self, n: int) -> None:
        with self._lock:
            rate = self.rate
            if rate <= 0:
                return
            now = self._clock()
            self._tokens = min(float(rate), self._tokens + (now - self._at) * rate)
            self._at = now
            self._tokens -= n
            wait = -self._tokens / rate if self._tokens < 0 else 0.0
        if wait > 0:
            self.waited_seconds += wait
            time.sleep(wait)


class _Block:
    """One ranged GET: ``[start, end)`` of ``key``, at ``[vstart, vend)`` of the stream."""

    __slots__ = (
        "done_at",
        "end",
        "future",
        "key",
        "prefetched",
        "reserved",
        "start",
        "touched",
        "vend",
        "vstart",
    )

    def __init__(self, key: str, start: int, end: int, vstart: int) -> None:
        self.key = key
        self.start = start
        self.end = end
        self.vstart = vstart
        self.vend = vstart + (end - start)
        self.future: Future[memoryview] | None = None
        self.reserved = 0
        self.done_at: float | None = None
        self.prefetched = False
        self.touched = False

    @property
    def size(self) -> int:
        return self.end - self.start


class Prefetcher:
    """The process-wide part: thread pool, memory budget, settings and clock."""

    def __init__(
        self, config: PrefetchConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or PrefetchConfig()
        self.clock = clock
        self.budget = MemoryBudget(self.config.memory_bytes)
        self.rate_limit = ReadRateLimit(self.config.max_bytes_per_second, clock)
        self.pool = ThreadPoolExecutor(self.config.threads, thread_name_prefix="tier-prefetch")
        self._streams: weakref.WeakSet[RangeStream] = weakref.WeakSet()
        self._lock = threading.Lock()

    def open(self, store: ObjectStore, spans: Iterable[Span]) -> RangeStream:
        stream = RangeStream(self, store, spans)
        with self._lock:
            self._streams.add(stream)
        return stream

    def sweep(self) -> int:
        """Expire stale prefetched blocks of every stream; return the bytes freed."""
        with self._lock:
            streams = list(self._streams)
        now = self.clock()
        return sum(s.expire(now, blocking=False) for s in streams)

    def request_size(self) -> int:
        """The size of the next block any reader cuts: the configured request, smaller
        when the open readers could not each hold two blocks inside the budget (never
        below ``min_request_bytes``)."""
        config = self.config
        with self._lock:
            readers = max(1, len(self._streams))
        fair = config.memory_bytes // (2 * readers)
        return max(1, min(config.request_bytes, max(config.min_request_bytes, fair)))

    def initial_window(self) -> int:
        """The window of a reader opened now (see ``PrefetchConfig.initial_window_bytes``)."""
        config = self.config
        if config.initial_window_bytes <= config.request_bytes:
            return config.request_bytes
        with self._lock:
            readers = max(1, len(self._streams))
        fair = config.memory_bytes // (2 * readers)
        window = min(config.initial_window_bytes, config.max_window_bytes, fair)
        return max(config.request_bytes, window)

    def give_up_readahead(self, need: int, asking: RangeStream) -> int:
        """Drop read-ahead no consumer has reached yet, farthest first, from every
        stream not busy right now, until ``need`` bytes are free; return bytes freed."""
        with self._lock:
            streams = [s for s in self._streams if s is not asking]
        freed = 0
        for stream in streams:
            freed += stream.drop_readahead(need - freed)
            if freed >= need:
                break
        return freed

    def close(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            s.close()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _forget(self, stream: RangeStream) -> None:
        with self._lock:
            self._streams.discard(stream)


class RangeStream:
    """One consumer's sequential read over ``spans`` with adaptive read-ahead."""

    def __init__(self, prefetcher: Prefetcher, store: ObjectStore, spans: Iterable[Span]) -> None:
        self._prefetcher = prefetcher
        self._config = prefetcher.config
        self._budget = prefetcher.budget
        self._store = store
        self._spans: Iterator[Span] | None = iter(spans)
        self._cut: Span | None = None  # the rest of the span being cut into blocks
        self._blocks: deque[_Block] = deque()
        self._generated = 0  # virtual end of the blocks made so far
        self._pos = 0
        self._lock = threading.RLock()
        self._reads = 0
        self._closed = False
        self.window = prefetcher.initial_window()
        self.gets = 0
        self.hits = 0
        self.expired = 0

    @property
    def position(self) -> int:
        """Bytes handed out so far."""
        return self._pos

    @property
    def reserved(self) -> int:
        """Bytes this stream holds in the budget."""
        with self._lock:
            return sum(b.reserved for b in self._blocks)

    def read(self, n: int) -> memoryview:
        """The next ``n`` bytes of the stream (blocks until they arrived)."""
        if self._closed:
            raise ReadError("range stream is closed")
        if n <= 0:
            return memoryview(b"")
        with self._lock:
            self.expire(self._prefetcher.clock(), blocking=True)
            self._drop_consumed()
            target = self._pos + n
            while self._generated < target:
                if not self._generate():
                    raise ReadError(f"read of {n} bytes at {self._pos} runs past the last span")
            needed = [b for b in self._blocks if b.vstart < target]
            for b in needed:
                if not b.touched:
                    b.touched = True
                    if b.prefetched and b.future is not None:
                        self.hits += 1
                        self.window = min(
                            self._config.max_window_bytes, self.window + self._config.request_bytes
                        )
                if b.future is None:
                    self._make_room(b.size)
                    holding = any(x.reserved for x in self._blocks)
                    self._budget.force(b.size, self._config.force_wait_seconds, holding=holding)
                    self._issue(b, b.size, prefetched=False)
            start = self._pos
            self._pos = target
            if self._reads:
                self._top_up()  # not on the first read: a seek costs one data GET
            self._reads += 1
        parts = [self._wait(b) for b in needed]
        if len(parts) == 1:
            b = needed[0]
            return parts[0][start - b.vstart : target - b.vstart]
        out = bytearray()
        for b, data in zip(needed, parts, strict=True):
            out += data[max(start, b.vstart) - b.vstart : min(target, b.vend) - b.vstart]
        return memoryview(out)

    def expire(self, now: float, *, blocking: bool) -> int:
        """Drop prefetched blocks that arrived more than a TTL ago and were never reached
        (and every block issued after them); halve the window. Returns bytes freed."""
        if not self._lock.acquire(blocking=blocking):
            return 0
        try:
            ttl = self._config.ttl_seconds
            stale_at = None
            for i, b in enumerate(self._blocks):
                if b.touched or b.future is None:
                    continue
                if b.done_at is not None and now - b.done_at > ttl:
                    stale_at = i
                    break
            if stale_at is None:
                return 0
            freed = 0
            for i in range(stale_at, len(self._blocks)):
                b = self._blocks[i]
                if b.future is not None:
                    freed += self._reset(b)
                    self.expired += 1
            self.window = max(self._config.request_bytes, self.window // 2)
            return freed
        finally:
            self._lock.release()

    def drop_readahead(self, need: int) -> int:
        """Give back read-ahead blocks not reached yet, farthest first, until ``need``
        bytes are freed (skipped when another thread holds this stream)."""
        if need <= 0 or not self._lock.acquire(blocking=False):
            return 0
        try:
            freed = 0
            for b in reversed(self._blocks):
                if freed >= need:
                    break
                if b.prefetched and not b.touched and b.future is not None:
                    freed += self._reset(b)
            if freed:
                self.window = max(self._config.request_bytes, self.window // 2)
            return freed
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for b in self._blocks:
                self._reset(b)
            self._blocks.clear()
            self._spans = None
            self._cut = None
        self._prefetcher._forget(self)

    # -- internals (called with the lock held) -------------------------------------------------
    def _generate(self) -> bool:
        """Cut the next block (at the current ``request_size``) off the current span, or
        start the next span; False when there are no more spans."""
        if self._cut is None:
            if self._spans is None:
                return False
            for key, start, end in self._spans:
                if end > start:
                    self._cut = (key, start, end)
                    break
            else:
                self._spans = None
                return False
        key, start, end = self._cut
        stop = min(end, start + self._prefetcher.request_size())
        self._blocks.append(_Block(key, start, stop, self._generated))
        self._generated += stop - start
        self._cut = (key, stop, end) if stop < end else None
        return True

    def _drop_consumed(self) -> None:
        while self._blocks and self._blocks[0].vend <= self._pos:
            self._reset(self._blocks.popleft())

    def _top_up(self) -> None:
        """Issue read-ahead until the window ahead of the position is in flight."""
        ahead = 0
        i = 0
        while ahead < self.window:
            if i == len(self._blocks) and not self._generate():
                return
            b = self._blocks[i]
            i += 1
            if b.vstart < self._pos:
                continue  # the block being consumed is not read-ahead
            if b.future is None:
                if not self._reserve_ahead(b.size):
                    return
                self._issue(b, b.size, prefetched=True)
            ahead += b.size

    def _make_room(self, n: int) -> None:
        """Before a needed block: if it does not fit, free others' unread read-ahead."""
        budget = self._budget
        short = budget.used + n - budget.limit
        if short > 0:
            self._prefetcher.sweep()
            short = budget.used + n - budget.limit
            if short > 0:
                self._prefetcher.give_up_readahead(short, self)

    def _reserve_ahead(self, n: int) -> bool:
        """Reserve read-ahead; when the budget is full, expire stale blocks and try again."""
        if self._budget.try_reserve(n):
            return True
        return self._prefetcher.sweep() > 0 and self._budget.try_reserve(n)

    def _issue(self, b: _Block, reserved: int, *, prefetched: bool) -> None:
        b.reserved = reserved
        b.prefetched = prefetched
        b.done_at = None
        clock = self._prefetcher.clock
        future = self._prefetcher.pool.submit(self._get, b.key, b.start, b.end)

        def arrived(f: Future[memoryview], block: _Block = b) -> None:
            if block.future is f:
                block.done_at = clock()

        b.future = future
        future.add_done_callback(arrived)
        self.gets += 1

    def _get(self, key: str, start: int, end: int) -> memoryview:
        """Pool thread: one ranged GET, paced by the node-wide read rate."""
        self._prefetcher.rate_limit.take(end - start)
        return self._store.get_view(key, start, end)

    def _reset(self, b: _Block) -> int:
        """Forget a block's request and give its reservation back."""
        freed = b.reserved
        if b.future is not None:
            b.future.cancel()
        b.future = None
        b.done_at = None
        b.prefetched = False
        if freed:
            self._budget.release(freed)
            b.reserved = 0
        return freed

    def _wait(self, b: _Block) -> memoryview:
        future = b.future
        assert future is not None
        try:
            data = future.result()
        except NotFoundError:
            with self._lock:
                if b.future is future:
                    self._reset(b)
            raise FragmentExpiredError(b.key) from None
        except BaseException:
            with self._lock:
                if b.future is future:
                    self._reset(b)
            raise
        if len(data) != b.size:
            raise RemoteDataCorruptError(
                f"{b.key}: range [{b.start}, {b.end}) returned {len(data)} bytes"
            )
        return data
