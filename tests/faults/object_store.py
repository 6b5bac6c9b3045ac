"""A fault-injecting ObjectStore wrapper for crash and fault tests.

Wraps any store. Faults are rules: "the 3rd ``put_if_absent`` fails after it took effect",
"every ``get`` fails before it runs with probability 0.1", plus added latency and throttled
throughput. An error injected *after* the operation is the interesting case: the object was
written but the caller sees a ``TransientError``, like a timeout on a PUT that landed.
Randomness comes from one seeded ``random.Random``, so a single-threaded call sequence replays
exactly. Every call is recorded in ``log`` as (op, key, outcome), so tests can count requests.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from tierlog.storage.errors import StorageError, TransientError
from tierlog.storage.object_store import (
    Buffer,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PendingUpload,
)

T = TypeVar("T")
B = TypeVar("B", bytes, memoryview)

Op = Literal[
    "put",
    "put_if_absent",
    "get",
    "get_suffix",
    "head",
    "list",
    "delete",
    "delete_many",
    "create_multipart",
    "put_part",
    "complete_multipart",
    "abort_multipart",
]
When = Literal["before", "after"]
DATA_OPS = frozenset({"put", "put_if_absent", "get", "get_suffix", "put_part"})


class InjectedFault(TransientError):
    """A fault injected on purpose (a ``TransientError``, so code treats it like a real one)."""


@dataclass
class FaultRule:
    """Which calls fail, when, and with what. ``nth`` counts matching calls from 1;
    ``times`` consecutive matches starting at ``nth`` fail. Without ``nth``, each matching
    call fails with ``probability``."""

    op: str | None  # None = every operation
    when: When = "before"
    nth: int | None = None
    times: int = 1
    probability: float = 0.0
    key_prefix: str = ""
    error: Callable[[str], StorageError] = InjectedFault
    seen: int = field(default=0, init=False)

    def matches(self, op: str, key: str) -> bool:
        return (self.op is None or self.op == op) and key.startswith(self.key_prefix)


@dataclass(frozen=True)
class OpRecord:
    """One call: ``outcome`` is "ok", "error:<Type>" (from the store) or
    "injected-before:<Type>" / "injected-after:<Type>"."""

    op: str
    key: str
    outcome: str


class FaultyObjectStore(ObjectStore):
    """``inner`` with injected faults, latency and throughput limits."""

    def __init__(self, inner: ObjectStore, seed: int = 0) -> None:
        self.inner = inner
        self.rng = random.Random(seed)
        self.rules: list[FaultRule] = []
        self.latency_s = 0.0
        self.latency_jitter_s = 0.0
        self.bytes_per_s: float | None = None
        self.log: list[OpRecord] = []
        self._lock = threading.Lock()

    # -- configuring faults -----------------------------------------------------------------

    def fail_nth(
        self,
        op: str,
        nth: int,
        *,
        after: bool = False,
        times: int = 1,
        key_prefix: str = "",
        error: Callable[[str], StorageError] = InjectedFault,
    ) -> FaultRule:
        """Fail the ``nth`` (1-based) matching call (and ``times - 1`` more after it);
        ``after=True`` runs the operation first, then reports the error."""
        rule = FaultRule(op, "after" if after else "before", nth, times, 0.0, key_prefix, error)
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail_randomly(
        self,
        op: str | None,
        probability: float,
        *,
        after: bool = False,
        key_prefix: str = "",
        error: Callable[[str], StorageError] = InjectedFault,
    ) -> FaultRule:
        """Fail each matching call with ``probability`` (drawn from the seeded generator)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability {probability} outside [0, 1]")
        rule = FaultRule(
            op, "after" if after else "before", None, 1, probability, key_prefix, error
        )
        with self._lock:
            self.rules.append(rule)
        return rule

    def set_latency(self, seconds: float, jitter_s: float = 0.0) -> None:
        """Add ``seconds`` (+ uniform jitter) to every call."""
        self.latency_s, self.latency_jitter_s = seconds, jitter_s

    def set_throughput(self, bytes_per_s: float | None) -> None:
        """Limit data calls to ``bytes_per_s`` (each call sleeps ``size / bytes_per_s``)."""
        self.bytes_per_s = bytes_per_s

    def clear_faults(self) -> None:
        with self._lock:
            self.rules.clear()
        self.latency_s = self.latency_jitter_s = 0.0
        self.bytes_per_s = None

    # -- the operation log --------------------------------------------------------------------

    def count(self, op: str | None = None, outcome: str | None = None) -> int:
        """Calls recorded for ``op`` (all if None) whose outcome starts with ``outcome``."""
        with self._lock:
            return sum(
                1
                for r in self.log
                if (op is None or r.op == op) and (outcome is None or r.outcome.startswith(outcome))
            )

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()

    # -- the machinery ------------------------------------------------------------------------

    def _decide(self, op: str, key: str) -> tuple[FaultRule | None, float]:
        """The rule that fires for this call (if any) and the delay to add, in one locked step
        so concurrent calls draw from the generator in a consistent order."""
        with self._lock:
            fired: FaultRule | None = None
            for rule in self.rules:
                if not rule.matches(op, key):
                    continue
                rule.seen += 1
                if rule.nth is not None:
                    hit = rule.nth <= rule.seen < rule.nth + rule.times
                else:
                    hit = self.rng.random() < rule.probability
                if hit and fired is None:
                    fired = rule
            delay = self.latency_s
            if self.latency_jitter_s:
                delay += self.rng.uniform(0.0, self.latency_jitter_s)
            return fired, delay

    def _record(self, op: str, key: str, outcome: str) -> None:
        with self._lock:
            self.log.append(OpRecord(op, key, outcome))

    def _run(self, op: str, key: str, call: Callable[[], T], size: int = 0) -> T:
        rule, delay = self._decide(op, key)
        if self.bytes_per_s and size:
            delay += size / self.bytes_per_s
        if delay > 0:
            time.sleep(delay)
        if rule is not None and rule.when == "before":
            error = rule.error(f"injected fault before {op} {key!r}")
            self._record(op, key, f"injected-before:{type(error).__name__}")
            raise error
        try:
            result = call()
        except StorageError as exc:
            self._record(op, key, f"error:{type(exc).__name__}")
            raise
        if rule is not None:
            error = rule.error(f"injected fault after {op} {key!r} took effect")
            self._record(op, key, f"injected-after:{type(error).__name__}")
            raise error
        self._record(op, key, "ok")
        return result

    # -- ObjectStore --------------------------------------------------------------------------

    def put(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        call = lambda: self.inner.put(key, data, metadata=metadata)  # noqa: E731
        return self._run("put", key, call, memoryview(data).nbytes)

    def put_if_absent(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        size = memoryview(data).nbytes
        call = lambda: self.inner.put_if_absent(key, data, metadata=metadata)  # noqa: E731
        return self._run("put_if_absent", key, call, size)

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        rule, delay = self._decide("get", key)
        return self._finish_read("get", key, rule, delay, lambda: self.inner.get(key, start, end))

    def get_view(self, key: str, start: int | None = None, end: int | None = None) -> memoryview:
        rule, delay = self._decide("get", key)  # counted as a GET: it is one request
        call = lambda: self.inner.get_view(key, start, end)  # noqa: E731
        return self._finish_read("get", key, rule, delay, call)

    def get_suffix(self, key: str, length: int) -> bytes:
        rule, delay = self._decide("get_suffix", key)
        call = lambda: self.inner.get_suffix(key, length)  # noqa: E731
        return self._finish_read("get_suffix", key, rule, delay, call)

    def _finish_read(
        self,
        op: str,
        key: str,
        rule: FaultRule | None,
        delay: float,
        call: Callable[[], B],
    ) -> B:
        """Reads: throughput is charged on the bytes actually returned."""
        if delay > 0:
            time.sleep(delay)
        if rule is not None and rule.when == "before":
            error = rule.error(f"injected fault before {op} {key!r}")
            self._record(op, key, f"injected-before:{type(error).__name__}")
            raise error
        try:
            data = call()
        except StorageError as exc:
            self._record(op, key, f"error:{type(exc).__name__}")
            raise
        if self.bytes_per_s:
            time.sleep(len(data) / self.bytes_per_s)
        if rule is not None:
            error = rule.error(f"injected fault after {op} {key!r} took effect")
            self._record(op, key, f"injected-after:{type(error).__name__}")
            raise error
        self._record(op, key, "ok")
        return data

    def head(self, key: str) -> ObjectMeta:
        return self._run("head", key, lambda: self.inner.head(key))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        """Faults apply to the whole listing: "before" raises at the first ``next``, "after"
        once every entry was yielded."""
        rule, delay = self._decide("list", prefix)
        if delay > 0:
            time.sleep(delay)
        if rule is not None and rule.when == "before":
            error = rule.error(f"injected fault before list {prefix!r}")
            self._record("list", prefix, f"injected-before:{type(error).__name__}")
            raise error
        try:
            yield from self.inner.list(prefix, start_after)
        except StorageError as exc:
            self._record("list", prefix, f"error:{type(exc).__name__}")
            raise
        if rule is not None:
            error = rule.error(f"injected fault after list {prefix!r}")
            self._record("list", prefix, f"injected-after:{type(error).__name__}")
            raise error
        self._record("list", prefix, "ok")

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self.inner.delete(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = [*keys]
        self._run("delete_many", batch[0] if batch else "", lambda: self.inner.delete_many(batch))

    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        call = lambda: self.inner.create_multipart(key, metadata=metadata)  # noqa: E731
        return FaultyMultipartUpload(self, self._run("create_multipart", key, call))

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[PendingUpload]:
        return self._run(
            "list_multipart", prefix, lambda: self.inner.list_multipart_uploads(prefix)
        )

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self._run("abort_multipart", key, lambda: self.inner.abort_multipart(key, upload_id))

    def close(self) -> None:
        self.inner.close()


class FaultyMultipartUpload(MultipartUpload):
    """Part uploads, complete and abort go through the owning store's fault rules."""

    def __init__(self, store: FaultyObjectStore, inner: MultipartUpload) -> None:
        self.key = inner.key
        self.upload_id = inner.upload_id
        self._store = store
        self._inner = inner

    def put_part(self, part_number: int, data: Buffer) -> None:
        size = memoryview(data).nbytes
        call = lambda: self._inner.put_part(part_number, data)  # noqa: E731
        self._store._run("put_part", self.key, call, size)

    def complete(self) -> ObjectMeta:
        return self._store._run("complete_multipart", self.key, self._inner.complete)

    def abort(self) -> None:
        self._store._run("abort_multipart", self.key, self._inner.abort)
