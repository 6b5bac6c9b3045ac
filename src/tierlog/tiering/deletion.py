"""Durable, delayed deletion of remote objects.

Nothing a reader may still hold is deleted at once: superseded roots and branches,
and fragments removed by retention, are enqueued here with a due time
(``tier.delete_grace``, default 10 min) and deleted by ``run_due`` once it passes.
The queue lives in the MetaStore, so a restart loses nothing.
"""

from __future__ import annotations

import json
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
