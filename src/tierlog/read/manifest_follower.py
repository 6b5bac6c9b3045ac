"""Following the committed manifests of streams this process does not write.

A node that reads a stream only from the remote tier (read anywhere) learns of new data
when the stream's writer commits a manifest, i.e. when the MetaStore pointer moves. One
``ManifestFollower`` thread polls the pointers of every followed stream that has readers,
at most ``max_reads_per_second`` pointer reads and once per ``interval`` per stream, loads a new
root when a pointer moved and tells the stream's listeners. Readers see the tree the
follower last loaded (``FollowedManifest``: ``refresh_committed`` does no I/O), so the
number of consumers never multiplies MetaStore reads.

Freshness: a message reaches readers of a follower once its fragment is cut (the
stream's ``max_fragment_age`` or fragment size; ``ack = remote`` streams every
``tier.remote_ack_interval_seconds``), uploaded, committed (``debounce_seconds`` after the
upload at most), and the follower's next poll has seen the pointer (``interval``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog, ManifestPointer
from tierlog.remote.committed import load_committed_tree
from tierlog.remote.manifest_tree import DEFAULT_M, ManifestTree
from tierlog.storage.object_store import ObjectStore

log = get_logger(__name__)

DEFAULT_INTERVAL = 0.5
DEFAULT_MAX_READS_PER_SECOND = 200.0


class FollowedManifest:
    """One followed stream's committed manifest (a ``CommittedManifest``): the tree the
    follower loaded last; the first call loads it synchronously."""

    def __init__(
        self, catalog: Catalog, store: ObjectStore, prefix: str, incarnation: str, m: int
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.prefix = prefix
        self.incarnation = incarnation
        self.m = m
        self.pointer: ManifestPointer | None = None
        self.deleted = False
        self._tree: ManifestTree | None = None
        self._lock = threading.Lock()

    @property
    def object_store(self) -> ObjectStore:
        return self.store

    @property
    def epoch(self) -> int:
        """The writer epoch of the committed manifest as last seen (0 before any)."""
        return self.pointer.epoch if self.pointer is not None else 0

    def committed_tree(self) -> ManifestTree:
        tree = self._tree
        if tree is None:
            self.poll()
            tree = self._tree
            assert tree is not None
        return tree

    def loaded_tree(self) -> ManifestTree | None:
        """The tree loaded so far, without I/O (None before the first poll)."""
        return self._tree

    def refresh_committed(self) -> ManifestTree:
        """No I/O: the follower's poller keeps the tree fresh."""
        return self.committed_tree()

    def poll(self) -> bool:
        """Read the pointer; load the root if it moved. True when the tree changed."""
        with self._lock:
            pointer = self.catalog.read_pointer(self.incarnation)
            known = self.pointer
            if pointer is None:
                if not self.deleted:
                    self.deleted = True
                    if self._tree is None:
                        self._tree = ManifestTree(self.prefix, self.incarnation, m=self.m)
                    return True
                return False
            if self._tree is not None and known is not None and known.root_uid == pointer.root_uid:
                self.pointer = pointer  # same root (a version bump alone changes nothing)
                return False
            self.pointer, self._tree = load_committed_tree(
                self.catalog, self.store, self.prefix, self.incarnation, self.m
            )
            return True


@dataclass(slots=True)
class _Followed:
    manifest: FollowedManifest
    listeners: list[Callable[[], None]] = field(default_factory=list)
    due: float = 0.0
    active: Callable[[], bool] = lambda: True


class ManifestFollower:
    """One thread polling the manifest pointers of every followed stream."""

    def __init__(
        self,
        catalog: Catalog,
        store: ObjectStore,
        prefix: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        max_reads_per_second: float = DEFAULT_MAX_READS_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0 or max_reads_per_second <= 0:
            raise ValueError("interval and max_reads_per_second must be > 0")
        self.catalog = catalog
        self.store = store
        self.prefix = prefix
        self.interval = interval
        self.max_reads_per_second = max_reads_per_second
        self.clock = clock
        self.reads = 0
        self.changes = 0
        self._followed: dict[str, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(
        self,
        incarnation: str,
        on_change: Callable[[], None] | None = None,
        m: int = DEFAULT_M,
        active: Callable[[], bool] | None = None,
    ) -> FollowedManifest:
        """Start following a stream (idempotent); ``on_change`` is called from the
        follower's thread whenever a newer committed tree was loaded. While ``active``
        answers False (nobody reads the stream here) its pointer is not polled; a reader
        that starts loads the tree it needs itself."""
        with self._lock:
            entry = self._followed.get(incarnation)
            if entry is None:
                manifest = FollowedManifest(self.catalog, self.store, self.prefix, incarnation, m)
                entry = _Followed(manifest)
                self._followed[incarnation] = entry
            if active is not None:
                entry.active = active
            if on_change is not None:
                entry.listeners.append(on_change)
            return entry.manifest

    def unfollow(self, incarnation: str) -> None:
        with self._lock:
            self._followed.pop(incarnation, None)

    def followed(self) -> list[str]:
        with self._lock:
            return list(self._followed)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="manifest-follower", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def poll_due(self) -> float:
        """Poll every stream whose turn has come, within the read budget; the seconds to
        wait before the next turn."""
        now = self.clock()
        with self._lock:
            entries = [e for e in self._followed.values() if e.active()]
        # the budget spreads a round over interval or n / rate seconds, whichever is longer
        period = max(self.interval, len(entries) / self.max_reads_per_second)
        spacing = 1.0 / self.max_reads_per_second
        next_due = now + period
        for entry in entries:
            if self._stop.is_set():
                break
            if entry.due > now:
                next_due = min(next_due, entry.due)
                continue
            entry.due = now + period
            try:
                changed = entry.manifest.poll()
            except Exception as exc:  # the MetaStore or the store failed: try next round
                log.warning(
                    "manifest_follow_failed",
                    incarnation=entry.manifest.incarnation,
                    error=repr(exc),
                )
                changed = False
            self.reads += 1
            if changed:
                self.changes += 1
                for listener in list(entry.listeners):
                    listener()
            if len(entries) > 1:
                time.sleep(spacing)
            now = self.clock()
        return max(0.0, next_due - self.clock())

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self.poll_due()
            self._wake.wait(wait)
            self._wake.clear()
