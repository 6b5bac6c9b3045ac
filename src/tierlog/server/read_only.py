"""A read-only node (``reader.read_only = true``): a member of no stream, it opens no
local log, writes nothing and serves consumers of every catalog stream from the remote tier
(``server.remote_stream``). The catalog is re-read every second (new and deleted streams);
creating, deleting or changing a stream is refused (``ReadOnlyNodeError``:
``PRECONDITION_FAILED``), publishing gets ``STREAM_NOT_AVAILABLE``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tierlog.errors import TierlogError
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.settings import StreamSettings
from tierlog.server.broker import Broker, StreamHandle
from tierlog.server.config import ServerConfig
from tierlog.server.errors import ReadOnlyNodeError
from tierlog.server.remote_stream import LeaderTail, RemoteStreamHandle, RemoteStreams, no_leader
from tierlog.storage.object_store import ObjectStore

log = get_logger("tierlog.server.read_only")

CATALOG_REFRESH_SECONDS = 1.0


class ReadOnlyBroker(Broker):
    """The broker of a read-only node: no local streams; every catalog stream is served
    from the remote tier through ``RemoteStreams``."""

    def __init__(
        self,
        config: ServerConfig,
        catalog: Catalog,
        metrics: Metrics,
        store: ObjectStore,
        *,
        leader_tail: LeaderTail = no_leader,
    ) -> None:
        super().__init__(config, catalog, metrics)
        self.remote = RemoteStreams(config, catalog, store, leader_tail=leader_tail)
        self._records: dict[tuple[str, str], StreamRecord] = {}
        self._catalog_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.remote.start(asyncio.get_running_loop())

    def open_streams(self) -> None:
        if self._catalog_task is None:
            self._catalog_task = asyncio.create_task(self._follow_catalog())

    async def _follow_catalog(self) -> None:
        """Refresh the catalog (new streams, deleted ones) every second."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                records = await loop.run_in_executor(self.remote.io, self.catalog.list)
            except (TierlogError, OSError) as exc:
                log.warning("catalog_refresh_failed", error=repr(exc))
            else:
                self._records = {(r.vhost, r.name): r for r in records}
                self.remote.forget_missing(set(self._records))
                if not self.catalog_loaded.is_set():
                    self.catalog_loaded.set()
                    self.all_open.set()
            await asyncio.sleep(CATALOG_REFRESH_SECONDS)

    def get(self, vhost: str, name: str) -> StreamHandle | None:
        record = self._records.get((vhost, name))
        if record is None:
            return None
        handle: Any = self.remote.handle(record)  # duck-typed: what the handlers use
        return handle

    def not_available_yet(self, vhost: str, name: str) -> bool:
        return not self.catalog_loaded.is_set()

    def streams(self) -> list[StreamHandle]:
        return []

    def followed(self) -> list[RemoteStreamHandle]:
        return [h for key in self._records if (h := self.remote.known(*key)) is not None]

    async def create_stream(self, vhost: str, name: str, settings: StreamSettings) -> StreamHandle:
        raise ReadOnlyNodeError(f"this node is read-only: create stream {name!r} on a member")

    async def delete_stream(self, vhost: str, name: str) -> StreamRecord:
        raise ReadOnlyNodeError(f"this node is read-only: delete stream {name!r} on a member")

    def update_settings(self, vhost: str, name: str, changes: dict[str, Any]) -> StreamRecord:
        raise ReadOnlyNodeError(f"this node is read-only: change {name!r} on a member")

    async def close(self) -> None:
        if self._catalog_task is not None:
            self._catalog_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._catalog_task
        await asyncio.get_running_loop().run_in_executor(None, self.remote.close)
        self.writers.shutdown(wait=False)
