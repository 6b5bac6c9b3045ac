"""Tiering inside the server: one StreamTierer per open stream, plus the background
work around it (local retention on each stream's writer thread, remote retention,
the pending-deletion list, stream cleanups) and its metrics.

The broker calls ``opened`` / ``closing`` as streams come and go; publishers are
throttled by the broker through ``lag`` (never failed): the tierer's own append gate
stays off in the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tierlog.errors import TierlogError
from tierlog.read.tiered_reader import default_prefetcher
from tierlog.server.tiered_source import TieredChunkSource
from tierlog.storage.metered_object_store import MeteredObjectStore
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.retry import RETRY_LOG
from tierlog.tiering.catalog import Catalog, StreamRecord
from tierlog.tiering.cleanup import run_stream_cleanups
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.retention import RetentionPolicy
from tierlog.tiering.tierer import StreamTierer

if TYPE_CHECKING:
    from tierlog.server.broker import StreamHandle
    from tierlog.server.config import ServerConfig
    from tierlog.server.metrics import ServerMetrics

log = logging.getLogger("tierlog.server.tiering")

HUGE_LAG = 1 << 62


class TieringService:
    def __init__(
        self,
        config: ServerConfig,
        store: ObjectStore,
        catalog: Catalog,
        metrics: ServerMetrics,
    ) -> None:
        self.config = config
        self.tier = config.tier
        self.store = MeteredObjectStore(store)
        self.catalog = catalog
        self.deletions = DeletionQueue(catalog.meta, grace_seconds=self.tier.delete_grace_seconds)
        self.tierers: dict[str, StreamTierer] = {}  # by incarnation
        self._handles: dict[str, StreamHandle] = {}
        self._not_started: dict[str, StreamHandle] = {}
        self._retry_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._register_metrics(metrics)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.run_cleanups)
        self._tasks.append(asyncio.create_task(self._housekeeping()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def opened(self, handle: StreamHandle) -> None:
        """Resolve and start tiering a freshly opened stream (on its writer thread:
        resolution may restart the local log past the remote tail)."""
        self._handles[handle.record.incarnation] = handle
        if not self.tier.enabled:
            return
        settings = handle.record.settings
        cfg = replace(
            settings.tiering_config(),
            max_uploads=self.tier.max_uploads,
        )
        tierer = StreamTierer(
            handle.log,
            self.store,
            self.catalog,
            self.deletions,
            prefix=self.tier.prefix,
            epoch=max(self.tier.epoch, handle.log.max_epoch),
            config=cfg,
            m=settings.manifest_fanout,
            upload_bytes_per_second=self.tier.upload_bytes_per_second or None,
            retention=RetentionPolicy(settings.max_bytes, settings.max_age_seconds),
            retention_interval=self.tier.retention_interval_seconds,
            task_stall_seconds=self.config.store.task_stall_seconds,
        )
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(handle.executor, tierer.start)
        except (TierlogError, OSError) as exc:
            # Retried by the housekeeping loop: an object store outage at start must not
            # leave the stream untiered for good (appends go on; local data is kept).
            log.error("event=tiering_not_started stream=%s error=%r", handle.name, exc)
            tierer.stop(flush=False, timeout=1.0)
            self._not_started[handle.record.incarnation] = handle
            return
        self._not_started.pop(handle.record.incarnation, None)
        self.tierers[handle.record.incarnation] = tierer
        handle.use_source(
            TieredChunkSource(
                handle.log, tierer, handle.notifier, lambda: handle.record.settings.read_strategy
            )
        )
        log.info(
            "event=tiering_started stream=%s remote_next=%d adopted=%d restarted_local=%s",
            handle.name,
            result.next_offset,
            result.adopted,
            result.restarted_local,
        )

    async def closing(self, handle: StreamHandle, *, flush: bool) -> None:
        self._handles.pop(handle.record.incarnation, None)
        self._not_started.pop(handle.record.incarnation, None)
        tierer = self.tierers.pop(handle.record.incarnation, None)
        if tierer is None:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: tierer.stop(flush=flush, timeout=30.0))

    def tierer_of(self, record: StreamRecord) -> StreamTierer | None:
        return self.tierers.get(record.incarnation)

    # -- broker providers -------------------------------------------------------------
    def lag(self, record: StreamRecord) -> int:
        """Un-tiered committed bytes; "infinite" when free disk is below the floor."""
        tierer = self.tierer_of(record)
        if tierer is None:
            return 0
        floor = self.tier.min_free_disk_bytes
        if floor and shutil.disk_usage(tierer.log.stream_dir).free < floor:
            return HUGE_LAG
        return tierer.lag_bytes

    def remote_status(self, record: StreamRecord) -> dict[str, Any]:
        tierer = self.tierer_of(record)
        if tierer is None:
            return {
                "tiering": "off",
                "bytes": None,
                "fragments": None,
                "first_offset": None,
                "tiered_offset": None,
                "manifest_depth": None,
                "upload_lag_bytes": None,
            }
        status = tierer.status()
        return {
            "tiering": (
                "halted" if tierer.halted else "degraded" if status["degraded"] else "running"
            ),
            "bytes": status["remote_bytes"],
            "fragments": status["remote_fragments"],
            "first_offset": status["remote_first_offset"],
            "tiered_offset": status["tiered_next_offset"],
            "manifest_depth": status["manifest_height"],
            **status,
        }

    # -- background work ----------------------------------------------------------------
    def run_cleanups(self) -> None:
        try:
            run_stream_cleanups(
                self.catalog, self.store, self.tier.prefix, self.config.storage.streams_dir
            )
        except TierlogError as exc:
            log.warning("event=stream_cleanup_failed error=%r", exc)

    async def _housekeeping(self) -> None:
        """Local retention on each writer thread; cleanups and due deletions."""
        interval = max(0.05, self.tier.local_retention_interval_seconds)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            await loop.run_in_executor(None, self.run_cleanups)
            for pending in list(self._not_started.values()):
                if not pending.closed and time.monotonic() >= self._retry_at:
                    self._retry_at = time.monotonic() + 5.0
                    await self.opened(pending)
            for incarnation, tierer in list(self.tierers.items()):
                handle = self._handles.get(incarnation)
                if handle is None or handle.closed:
                    continue
                settings = handle.record.settings
                tierer.set_retention_if_changed(
                    RetentionPolicy(settings.max_bytes, settings.max_age_seconds)
                )
                try:
                    freed = await loop.run_in_executor(
                        handle.executor,
                        tierer.apply_local_retention,
                        settings.local_max_bytes,
                        settings.local_max_age_seconds,
                    )
                except (TierlogError, OSError) as exc:
                    log.warning("event=local_retention_failed stream=%s error=%r", handle.name, exc)
                    continue
                if freed:
                    log.info("event=local_segments_freed stream=%s segments=%s", handle.name, freed)

    # -- metrics ----------------------------------------------------------------------
    def _register_metrics(self, metrics: ServerMetrics) -> None:
        r = metrics.registry
        store = self.store

        def requests() -> list[tuple[tuple[tuple[str, str], ...], float]]:
            return [
                ((("op", op), ("outcome", outcome)), float(n))
                for (op, outcome), n in store.snapshot().items()
            ]

        def per_stream(attr: str) -> list[tuple[tuple[tuple[str, str], ...], float]]:
            out: list[tuple[tuple[tuple[str, str], ...], float]] = []
            for tierer in list(self.tierers.values()):
                value = getattr(tierer, attr)
                out.append(((("stream", tierer.remote.stream_dir),), float(value)))
            return out

        r.gauge(
            "tierlog_object_store_requests_total",
            "Object store requests by operation and outcome (monotonic).",
            requests,
        )
        r.gauge(
            "tierlog_object_store_retries_total",
            "Object store failures that were retried, by operation and error kind (monotonic).",
            lambda: [
                ((("op", op), ("kind", kind)), float(n))
                for (op, kind), n in RETRY_LOG.snapshot().items()
            ],
        )
        r.gauge(
            "tierlog_object_store_lost_replies_resolved_total",
            "Create-only puts whose reply was lost and that read back as our own write.",
            lambda: [((), float(getattr(store.inner, "resolved_creates", 0)))],
        )
        r.gauge(
            "tierlog_tier_lag_seconds",
            "Seconds since the remote tier last held everything committed locally.",
            lambda: per_stream("lag_seconds"),
        )
        r.gauge(
            "tierlog_tier_degraded",
            "1 while a stream's uploads or commits keep failing (cleared by a success).",
            lambda: [
                ((("stream", t.remote.stream_dir),), 1.0 if t.task_health.degraded else 0.0)
                for t in list(self.tierers.values())
            ],
        )
        r.gauge(
            "tierlog_tier_task_failures_total",
            "Failed tiering tasks by kind (upload, commit); each is retried (monotonic).",
            lambda: [
                ((("stream", t.remote.stream_dir), ("task", task)), float(n))
                for t in list(self.tierers.values())
                for task, n in t.task_health.failures.items()
            ],
        )
        r.gauge(
            "tierlog_tier_stalled_tasks_total",
            "Uploads or commits reported in flight longer than store.task_stall_seconds.",
            lambda: [
                ((("stream", t.remote.stream_dir),), float(t.task_health.stalls))
                for t in list(self.tierers.values())
            ],
        )
        r.gauge(
            "tierlog_tiered_bytes_total",
            "Bytes uploaded to the object store (fragments and manifest objects).",
            lambda: [((), float(store.bytes_out))],
        )
        r.gauge(
            "tierlog_tier_lag_bytes",
            "Committed bytes not yet tiered.",
            lambda: per_stream("lag_bytes"),
        )
        r.gauge(
            "tierlog_tier_backpressure",
            "1 while a stream is over its tiering lag or disk floor (alarm).",
            lambda: [
                ((("stream", t.remote.stream_dir),), 1.0 if self._congested(t) else 0.0)
                for t in list(self.tierers.values())
            ],
        )
        r.gauge(
            "tierlog_manifest_commits_total",
            "Manifest commits (monotonic).",
            lambda: [
                ((("stream", t.remote.stream_dir),), float(t.committer.commits))
                for t in list(self.tierers.values())
            ],
        )
        r.gauge(
            "tierlog_manifest_conflicts_total",
            "Manifest commits that lost a race or were fenced (monotonic).",
            lambda: [
                ((("stream", t.remote.stream_dir),), float(t.committer.conflicts))
                for t in list(self.tierers.values())
            ],
        )
        r.gauge(
            "tierlog_prefetch_memory_bytes",
            "Bytes held by remote-read prefetch buffers (all readers, under one budget).",
            lambda: [((), float(default_prefetcher().budget.used))],
        )
        r.gauge(
            "tierlog_tiering_halted",
            "1 when tiering of a stream stopped (conflict or deposed).",
            lambda: [
                ((("stream", t.remote.stream_dir),), 1.0 if t.halted else 0.0)
                for t in list(self.tierers.values())
            ],
        )

    def _congested(self, tierer: StreamTierer) -> bool:
        handle = self._handles.get(tierer.remote.stream_dir)
        if handle is None:
            return False
        return self.lag(handle.record) > handle.record.settings.max_lag_bytes
