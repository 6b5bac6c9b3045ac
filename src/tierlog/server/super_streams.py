"""Super streams on this node: create and delete them with their partitions, answer Route
and Partitions from the catalog (``remote/super_streams.py`` holds the entry and why its
states make a crash converge).

Partitions are ordinary streams, created the way Create creates one (the super stream's
arguments, this node's placement: tiered and replicated like any other) and deleted the
way Delete deletes one (remote data through the stream-cleanup queue). Creation is
all-or-nothing as far as the MetaStore allows: a partition that fails rolls back the
partitions this call made and the entry, as RabbitMQ's rollback operations do; a crash
leaves the entry ``creating`` and the same CreateSuperStream resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable
from typing import TypeVar

from tierlog.errors import TierlogError
from tierlog.logs import get_logger
from tierlog.remote.errors import StreamExistsError, StreamNotFoundError
from tierlog.remote.super_streams import (
    READY,
    SuperStreamCatalog,
    SuperStreamDefinition,
    SuperStreamRecord,
)
from tierlog.server.arguments import settings_from_arguments
from tierlog.server.broker import Broker
from tierlog.server.cluster_service import ClusterService
from tierlog.server.errors import ReadOnlyNodeError
from tierlog.server.read_only import ReadOnlyBroker

log = get_logger("tierlog.server.super_streams")

T = TypeVar("T")


class SuperStreams:
    """One per broker (``super_streams_of``): its lock serialises this node's creations
    and deletions of super streams; other nodes are kept apart by the entry's create-only
    and version-checked writes."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.catalog = SuperStreamCatalog(broker.catalog.meta)
        self._lock = asyncio.Lock()

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def _writable(self, what: str, name: str) -> None:
        if isinstance(self.broker, ReadOnlyBroker):
            raise ReadOnlyNodeError(
                f"this node is read-only: {what} super stream {name!r} on a member"
            )

    async def create(self, definition: SuperStreamDefinition) -> SuperStreamRecord:
        """Create the super stream and its partitions. ``ConfigError`` for a bad
        definition or arguments (PRECONDITION_FAILED); ``StreamExistsError`` when the super
        stream or, for a new one, a partition exists (STREAM_ALREADY_EXISTS)."""
        definition.check()
        self._writable("create", definition.name)
        settings = settings_from_arguments(definition.arguments)
        placement = self.broker.placement
        if isinstance(placement, ClusterService):
            placement.cluster_size(definition.arguments)
        vhost = definition.vhost
        async with self._lock:
            existing = await self._run(self.catalog.get, vhost, definition.name)
            if existing is None:  # RabbitMQ: an existing partition refuses the whole creation
                for partition in definition.partitions:
                    if await self.broker.exists(vhost, partition):
                        raise StreamExistsError(f"partition {partition!r} already exists")
            record, resumed = await self._run(self.catalog.begin_create, definition)
            created: list[str] = []
            try:
                for partition in definition.partitions:
                    if resumed and await self.broker.exists(vhost, partition):
                        continue  # made before the crash this creation resumes
                    if isinstance(placement, ClusterService):
                        placement.check_create(vhost, partition, definition.arguments)
                    await self.broker.create_stream(vhost, partition, settings)
                    created.append(partition)
                ready = await self._run(self.catalog.mark, record, READY)
            except BaseException as exc:
                await self._roll_back(record, created, resumed, exc)
                raise
        log.info(
            "super_stream_created",
            vhost=vhost,
            super_stream=definition.name,
            partitions=len(definition.partitions),
            resumed=resumed,
        )
        return ready

    async def _roll_back(
        self, record: SuperStreamRecord, created: list[str], resumed: bool, error: BaseException
    ) -> None:
        """Undo this call's partitions and (unless it resumed an older creation) the entry.
        What cannot be undone stays, the entry ``creating``: the same creation resumes it,
        DeleteSuperStream removes it."""
        log.warning(
            "super_stream_create_rolled_back",
            vhost=record.vhost,
            super_stream=record.name,
            partitions_made=created,
            error=repr(error),
        )
        try:
            for partition in reversed(created):
                with contextlib.suppress(StreamNotFoundError):
                    await self.broker.delete_stream(record.vhost, partition)
            if not resumed:
                await self._run(self.catalog.remove, record)
        except (TierlogError, OSError) as exc:
            log.error("super_stream_rollback_failed", super_stream=record.name, error=repr(exc))

    async def delete(self, vhost: str, name: str) -> SuperStreamRecord:
        """Delete the partitions (with their remote data, as Delete does) and the entry.
        ``SuperStreamNotFoundError`` when there is no such super stream. An error half-way
        leaves the entry ``deleting``; deleting again finishes it."""
        self._writable("delete", name)
        async with self._lock:
            record = await self._run(self.catalog.begin_delete, vhost, name)
            for partition in record.partitions:
                # not found: never made (a creation cut short), or deleted on its own
                with contextlib.suppress(StreamNotFoundError):
                    await self.broker.delete_stream(vhost, partition)
            await self._run(self.catalog.remove, record)
        log.info("super_stream_deleted", vhost=vhost, super_stream=name)
        return record

    async def get(self, vhost: str, name: str) -> SuperStreamRecord | None:
        """The entry in whatever state (the admin API shows it)."""
        return await self._run(self.catalog.get, vhost, name)

    async def ready(self, vhost: str, name: str) -> SuperStreamRecord:
        """A ``ready`` super stream (``SuperStreamNotFoundError`` otherwise): what Route
        and Partitions answer from."""
        return await self._run(self.catalog.ready, vhost, name)

    async def list(self) -> list[SuperStreamRecord]:
        return await self._run(self.catalog.list)


_OF_BROKER: weakref.WeakKeyDictionary[Broker, SuperStreams] = weakref.WeakKeyDictionary()


def super_streams_of(broker: Broker) -> SuperStreams:
    """The broker's ``SuperStreams`` (made on first use: the protocol handlers and the
    admin API share it, and with it the lock)."""
    found = _OF_BROKER.get(broker)
    if found is None:
        found = _OF_BROKER[broker] = SuperStreams(broker)
    return found
