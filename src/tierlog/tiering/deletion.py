"""Durable, delayed deletion of remote objects.

Nothing a reader may still hold is deleted at once: superseded roots and branches,
and fragments removed by retention, are enqueued here with a due time
(``tier.delete_grace``, default 10 min) and deleted by ``run_due`` once it passes.
The queue lives in the MetaStore, so a restart loses nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable

from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore

DELETION_QUEUE = "pending-deletion"
DEFAULT_GRACE_SECONDS = 600.0


class DeletionQueue:
    def __init__(
        self,
        meta: MetaStore,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.meta = meta
        self.grace_seconds = grace_seconds
        self.clock = clock
        self._shared_lock = threading.Lock()
        self._shared_last = float("-inf")

    def schedule(self, keys: Iterable[str], grace_seconds: float | None = None) -> None:
        keys = sorted(set(keys))
        if not keys:
            return
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        payload = {"keys": keys, "due": self.clock() + grace}
        self.meta.enqueue(DELETION_QUEUE, json.dumps(payload).encode())

    def pending_keys(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        for item in self.meta.pending(DELETION_QUEUE):
            data = json.loads(item.payload)
            out.extend((key, float(data["due"])) for key in data["keys"])
        return out

    def run_due(self, store: ObjectStore) -> int:
        """Delete every object whose grace has passed; returns how many keys went."""
        now = self.clock()
        deleted = 0
        for item in self.meta.pending(DELETION_QUEUE):
            data = json.loads(item.payload)
            if float(data["due"]) > now:
                continue
            store.delete_many(data["keys"])  # idempotent: a crash here just repeats it
            self.meta.complete(item)
            deleted += len(data["keys"])
        return deleted

    def shared_pass_due(self, interval: float) -> bool:
        """Whether ``run_due_shared`` would scan now."""
        return time.monotonic() - self._shared_last >= interval

    def run_due_shared(self, store: ObjectStore, interval: float) -> int:
        """``run_due`` at most once per ``interval`` seconds, whichever of the node's
        streams asks (each stream's retention pass asks; the list is the node's, so
        one scan per interval serves them all)."""
        now = time.monotonic()
        if now - self._shared_last < interval or not self._shared_lock.acquire(blocking=False):
            return 0
        try:
            self._shared_last = now
            return self.run_due(store)
        finally:
            self._shared_lock.release()
