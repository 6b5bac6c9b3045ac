"""Tiering inside the server: one StreamTierer per open stream, plus the background
work around it (local retention on each stream's writer thread, remote retention,
the pending-deletion list, stream cleanups) and its metrics.

The broker calls ``opened`` / ``closing`` as streams come and go. Back-pressure is the
tierer's one rule (``tiering.backpressure``: tiering lag over the stream's
``max_lag_bytes`` or free disk under ``tier.min_free_disk_bytes``); the server reacts by
throttling publishers through ``lag`` (never failing them), so the tierer's append gate
is not installed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tierlog.errors import TierlogError
from tierlog.log.errors import DamagedSegmentError
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.offload.offloader import ObjectStoreOffloader
from tierlog.offload.service import SegmentOffloadService
from tierlog.read.remote_cursor import default_prefetcher
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.remote.consumer_offsets import ConsumerOffsets
from tierlog.remote.fragments import RemoteStream
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.server.gc_service import GcService
from tierlog.server.meta_offsets import take_over_offsets
from tierlog.server.remote_ack import install as install_remote_ack
from tierlog.storage.metered_object_store import MeteredObjectStore
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.retry import RETRY_LOG
from tierlog.tiering.backpressure import free_disk_below
from tierlog.tiering.cleanup import run_stream_cleanups
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.config import tiering_config
from tierlog.tiering.deletion import DeletionQueue
from tierlog.tiering.memory_budget import ByteBudget
from tierlog.tiering.remote_ack import tiering_overrides
from tierlog.tiering.retention import RetentionPolicy, floor_trim_offset, remote_trim_offset
from tierlog.tiering.runtime import RuntimeSizes, TieringRuntime
from tierlog.tiering.segment_repair import repair_from_remote
from tierlog.tiering.tierer import StreamTierer

if TYPE_CHECKING:
    from tierlog.server.broker import StreamHandle
    from tierlog.server.config import ServerConfig

log = get_logger("tierlog.server.tiering")

HUGE_LAG = 1 << 62
RESOLUTION_RETRY_MIN = 0.5
RESOLUTION_RETRY_MAX = 5.0
"""Backoff bounds (seconds) of the background retry of a stream's failed resolution."""


class TieringService:
    def __init__(
        self,
        config: ServerConfig,
        store: ObjectStore,
        catalog: Catalog,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.tier = config.tier
        self.metrics = metrics
        self.store = MeteredObjectStore(store, metrics)
        self.catalog = catalog
        self.consumer_offsets = ConsumerOffsets(catalog.meta)
        self.deletions = DeletionQueue(catalog.meta, grace_seconds=self.tier.delete_grace_seconds)
        self.tierers: dict[str, StreamTierer] = {}  # by incarnation
        self.offloads: dict[str, SegmentOffloadService] = {}  # segment-mode streams
        self._handles: dict[str, StreamHandle] = {}
        self._not_started: dict[str, StreamHandle] = {}
        self._floors: dict[str, int] = {}  # retention floors by incarnation
        self._retry_at: dict[str, tuple[float, float]] = {}  # incarnation: (due, delay)
        self._tasks: list[asyncio.Task[None]] = []
        # one budget for every stream's fragments in flight (an upload backlog across
        # many streams would otherwise hold streams x max_uploads fragments in memory)
        self.fragment_memory = ByteBudget(config.limits.fragment_memory_bytes)
        # every stream's tiering shares these threads (none per stream)
        self.runtime = TieringRuntime(
            RuntimeSizes(
                self.tier.event_threads, self.tier.upload_threads, self.tier.resolution_reads
            )
        )
        self._register_metrics(metrics)
        # this node's garbage collection: the streams it tiers (it leads them), and
        # deleted incarnations under a lease
        self.gc = GcService(config, self.store, catalog, metrics, self.tiered_incarnations)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.run_cleanups)
        self._tasks.append(asyncio.create_task(self._housekeeping()))
        await self.gc.start()

    async def close(self) -> None:
        await self.gc.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.get_running_loop().run_in_executor(None, self.runtime.shutdown)

    async def opened(self, handle: StreamHandle) -> None:
        """Resolve and start tiering a freshly opened stream (on its writer thread:
        resolution may restart the local log past the remote tail)."""
        self._handles[handle.record.incarnation] = handle
        remote_ack = install_remote_ack(handle)  # ack = remote: hold confirms from now on
        if not self.tier.enabled:
            handle.unavailable = None
            return
        settings = handle.record.settings
        if settings.tier_mode == "segments":
            await self._open_segment_mode(handle)
            return
        cfg = replace(
            tiering_config(
                settings, **tiering_overrides(settings, self.tier.remote_ack_interval_seconds)
            ),
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
            max_lag_bytes=settings.max_lag_bytes,
            min_free_disk_bytes=self.tier.min_free_disk_bytes,
            gate_appends=False,
            memory_budget=self.fragment_memory,
            settings=lambda: handle.record.settings,
            runtime=self.runtime,
            task_stall_seconds=self.config.store.task_stall_seconds,
        )
        tierer.committer.on_commit_seconds = self.metrics.manifest_commit_seconds.observe
        floor = self._floors.get(handle.record.incarnation)
        if floor is not None:
            tierer.set_retention_floor(floor)
        if handle.commit_fence is not None:
            tierer.committer.fence = handle.commit_fence
        if handle.cluster_commit is not None:
            tierer.commit_cap = handle.cluster_commit
            handle.tier_poke = tierer.poke
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(handle.executor, tierer.start)
        except (TierlogError, OSError) as exc:
            # Retried by the housekeeping loop: an object store outage at start must not
            # leave the stream untiered for good (local data is kept).
            # Until resolution succeeds the stream refuses appends (retriable
            # STREAM_NOT_AVAILABLE): an offset handed out now could be one the remote
            # tier already holds. Local data stays readable.
            log.error(
                "tiering_not_started", vhost=handle.vhost, stream=handle.name, error=repr(exc)
            )
            tierer.stop(flush=False, timeout=1.0)
            handle.unavailable = f"remote tier not resolved: {exc!r}"
            self._not_started[handle.record.incarnation] = handle
            return
        # offsets stored in the MetaStore while no member could (read-only nodes)
        await take_over_offsets(handle, self.consumer_offsets)
        handle.unavailable = None
        self._not_started.pop(handle.record.incarnation, None)
        self.tierers[handle.record.incarnation] = tierer
        handle.tier_started(tierer)
        if remote_ack is not None:
            remote_ack.tiering_started(tierer)
        log.info(
            "tiering_started",
            vhost=handle.vhost,
            stream=handle.name,
            remote_next_offset=result.next_offset,
            adopted=result.adopted,
            restarted_local=result.restarted_local,
        )

    async def _open_segment_mode(self, handle: StreamHandle) -> None:
        """Start the segment offload service of a ``tier_mode = segments`` stream (instead
        of a fragment tierer): same committer and epoch fencing, its own triggers."""
        incarnation = handle.record.incarnation
        settings = handle.record.settings
        stream_dir = handle.log.stream_dir.rstrip("/").rsplit("/", 1)[-1]
        offloader = ObjectStoreOffloader(
            self.store,
            self.catalog.meta,
            self.tier.prefix,
            stream_dir,
            block_size=settings.offload_block_size,
            settings=lambda: handle.record.settings,
        )
        committer = ManifestCommitter(
            RemoteStream(self.store, self.tier.prefix, stream_dir),
            self.catalog,
            self.deletions,
            max(self.tier.epoch, handle.log.max_epoch),
            m=settings.manifest_fanout,
            settings=lambda: handle.record.settings,
        )
        committer.on_commit_seconds = self.metrics.manifest_commit_seconds.observe
        if handle.commit_fence is not None:
            committer.fence = handle.commit_fence

        def trim(tree: ManifestTree) -> int | None:
            current = handle.record.settings
            policy = RetentionPolicy(current.max_bytes, current.max_age_seconds)
            trim_to = remote_trim_offset(tree, self.store.get, policy, int(time.time() * 1000))
            floor = self._floors.get(incarnation)
            below = None if floor is None else floor_trim_offset(tree, self.store.get, floor)
            if below is not None and (trim_to is None or below > trim_to):
                trim_to = below
            return trim_to

        service = SegmentOffloadService(
            handle.log,
            offloader,
            committer,
            lambda: handle.record.settings,
            min_free_disk_bytes=self.tier.min_free_disk_bytes,
            retention_trim=trim,
            run_deletions=lambda: self.deletions.run_due(self.store),
            interval=max(0.05, min(1.0, self.tier.retention_interval_seconds)),
            pool=self.runtime.uploads,
            timer=self.runtime.timer,
        )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(handle.executor, service.start)
        except (TierlogError, OSError) as exc:
            log.error(
                "offload_not_started", vhost=handle.vhost, stream=handle.name, error=repr(exc)
            )
            service.stop(timeout=1.0)
            # as for fragments: no append until the remote tier is known (the local log may
            # have to restart past it)
            handle.unavailable = f"remote tier not resolved: {exc!r}"
            self._not_started[incarnation] = handle
            return
        handle.unavailable = None
        self._not_started.pop(incarnation, None)
        self.offloads[incarnation] = service
        handle.tier_started(service)
        log.info("offload_started", vhost=handle.vhost, stream=handle.name)

    def tiered_incarnations(self) -> list[str]:
        """The incarnations whose tiering (or segment offload) runs here: this node leads
        them and their remote tier is resolved."""
        return [*self.tierers, *self.offloads]

    def offload_of(self, record: StreamRecord) -> SegmentOffloadService | None:
        return self.offloads.get(record.incarnation)

    async def closing(self, handle: StreamHandle, *, flush: bool) -> None:
        self._handles.pop(handle.record.incarnation, None)
        self._not_started.pop(handle.record.incarnation, None)
        service = self.offloads.pop(handle.record.incarnation, None)
        if service is not None:
            await asyncio.get_running_loop().run_in_executor(None, service.stop)
        tierer = self.tierers.pop(handle.record.incarnation, None)
        if tierer is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: tierer.stop(flush=flush, timeout=30.0))
        if handle.remote_ack is not None:  # what the final flush committed is confirmed
            handle.remote_ack.close()

    def repair_damaged(self, record: StreamRecord, error: DamagedSegmentError) -> bool:
        """Rewrite a damaged local range from the committed remote tier (writer thread of
        the stream being opened); False when the remote tier does not hold it."""
        if not self.tier.enabled:
            return False
        return repair_from_remote(self.catalog, self.store, self.tier.prefix, error) > 0

    def tierer_of(self, record: StreamRecord) -> StreamTierer | None:
        return self.tierers.get(record.incarnation)

    # -- broker providers -------------------------------------------------------------
    def lag(self, record: StreamRecord) -> int:
        """Un-tiered committed bytes as the broker's throttle sees them: the tierer's
        back-pressure rule decides (and raises its alarm); "infinite" when it is over
        its limits for want of disk, so the broker throttles whatever the lag. The
        free-disk floor applies also while tiering is not running (resolution pending):
        it protects the disk either way."""
        service = self.offload_of(record)
        if service is not None:
            # segment mode: the sealed bytes its thresholds want offloaded; under the disk
            # floor publishers wait whatever the lag (the deletion lag is waived meanwhile)
            if free_disk_below(service.log.stream_dir, self.tier.min_free_disk_bytes) is not None:
                return HUGE_LAG
            return service.lag_bytes
        tierer = self.tierer_of(record)
        if tierer is None:
            handle = self._handles.get(record.incarnation)
            if handle is not None and not handle.closed:
                floor = self.tier.min_free_disk_bytes
                if free_disk_below(handle.log.stream_dir, floor) is not None:
                    return HUGE_LAG
            return 0
        rule = tierer.backpressure
        rule.max_lag_bytes = record.settings.max_lag_bytes  # settings may have changed
        lag = tierer.lag_bytes
        if rule.check(lag) is not None and lag <= rule.max_lag_bytes:
            return HUGE_LAG  # over the disk floor
        return lag

    def remote_status(self, record: StreamRecord) -> dict[str, Any]:
        service = self.offload_of(record)
        if service is not None:
            tree = service.committed_tree()
            header = tree.header()
            return {
                "tiering": "segments",
                "bytes": header.total_bytes,
                "fragments": header.total_fragments,
                "first_offset": tree.first_offset,
                "tiered_offset": tree.next_offset,
                "manifest_depth": tree.height,
                "upload_lag_bytes": service.lag_bytes,
                "offload": service.status().to_dict(),
            }
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
        handle = self._handles.get(record.incarnation)
        if handle is not None and handle.remote_ack is not None:  # ack = remote
            status["confirms_held"] = handle.remote_ack.held
            status["readable_next_offset"] = handle.remote_ack.tail.visible.next_offset
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

    def set_retention_floor(self, handle: StreamHandle, floor: int) -> None:
        """Let retention drop every whole fragment of ``handle`` below ``floor`` (and the
        local segments below the new remote start, as for any trim), whatever its policy:
        how a delayed stream's system stream sheds what its last checkpoint summarized."""
        incarnation = handle.record.incarnation
        if floor <= self._floors.get(incarnation, -1):
            return
        self._floors[incarnation] = floor
        tierer = self.tierers.get(incarnation)
        if tierer is not None:
            tierer.set_retention_floor(floor)

    def degraded_streams(self) -> dict[tuple[str, str], str]:
        """(vhost, name) of every stream whose tiering is not running: degraded (a task
        keeps failing), halted, or not started (its resolution failed; retried)."""
        out: dict[tuple[str, str], str] = {}
        for incarnation, tierer in list(self.tierers.items()):
            handle = self._handles.get(incarnation)
            if handle is None:
                continue
            if tierer.halted:
                out[(handle.vhost, handle.name)] = "halted"
            elif tierer.task_health.degraded:
                out[(handle.vhost, handle.name)] = "degraded"
        for handle in list(self._not_started.values()):
            out[(handle.vhost, handle.name)] = "not started"
        return out

    # -- background work ----------------------------------------------------------------
    def run_cleanups(self) -> None:
        try:
            run_stream_cleanups(
                self.catalog, self.store, self.tier.prefix, self.config.storage.streams_dir
            )
        except TierlogError as exc:
            log.warning("stream_cleanup_failed", error=repr(exc))

    async def _housekeeping(self) -> None:
        """Local retention on each writer thread; cleanups and due deletions."""
        interval = max(0.05, self.tier.local_retention_interval_seconds)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            await loop.run_in_executor(None, self.run_cleanups)
            for incarnation, pending in list(self._not_started.items()):
                due, delay = self._retry_at.get(incarnation, (0.0, RESOLUTION_RETRY_MIN))
                if not pending.closed and time.monotonic() >= due:
                    # per stream, with backoff: one stream's outage does not delay others
                    self._retry_at[incarnation] = (
                        time.monotonic() + delay,
                        min(RESOLUTION_RETRY_MAX, delay * 2),
                    )
                    await self.opened(pending)
                    if incarnation not in self._not_started:
                        self._retry_at.pop(incarnation, None)
            for incarnation, service in list(self.offloads.items()):
                handle = self._handles.get(incarnation)
                if handle is None or handle.closed:
                    continue
                try:
                    freed = await loop.run_in_executor(
                        handle.executor, service.apply_local_deletion
                    )
                except (TierlogError, OSError) as exc:
                    log.warning("offload_deletion_failed", stream=handle.name, error=repr(exc))
                    continue
                if freed:
                    log.info("local_segments_freed", stream=handle.name, segments=freed)
            for incarnation, tierer in list(self.tierers.items()):
                handle = self._handles.get(incarnation)
                if handle is None or handle.closed:
                    continue
                settings = handle.record.settings
                tierer.set_retention_if_changed(
                    RetentionPolicy(settings.max_bytes, settings.max_age_seconds)
                )
                if len(handle.log.segment_refs()) < 2:
                    continue  # only sealed segments are freed: nothing to do, no thread hop
                try:
                    freed = await loop.run_in_executor(
                        handle.executor,
                        tierer.apply_local_retention,
                        settings.local_max_bytes,
                        settings.local_max_age_seconds,
                    )
                except (TierlogError, OSError) as exc:
                    log.warning("local_retention_failed", stream=handle.name, error=repr(exc))
                    continue
                if freed:
                    log.info("local_segments_freed", stream=handle.name, segments=freed)

    # -- metrics ----------------------------------------------------------------------
    def _register_metrics(self, metrics: Metrics) -> None:
        """Per-stream tiering values, read from the tierers at scrape time."""

        def per_stream(value: Callable[[StreamTierer], float]) -> Callable[[], list[Any]]:
            def read() -> list[tuple[tuple[str, str], float]]:
                out = []
                for incarnation, tierer in list(self.tierers.items()):
                    handle = self._handles.get(incarnation)
                    if handle is not None:
                        out.append(((handle.vhost, handle.name), float(value(tierer))))
                return out

            return read

        def per_offload(value: Callable[[SegmentOffloadService], float]) -> Callable[[], list[Any]]:
            def read() -> list[tuple[tuple[str, str], float]]:
                out = []
                for incarnation, service in list(self.offloads.items()):
                    handle = self._handles.get(incarnation)
                    if handle is not None:
                        out.append(((handle.vhost, handle.name), float(value(service))))
                return out

            return read

        metrics.offload_early_deletions.read = per_offload(lambda s: s.early_deletions)
        metrics.offloaded_segments.read = per_offload(lambda s: s.offloaded_segments)
        metrics.tier_lag_bytes.read = per_stream(lambda t: t.lag_bytes)
        metrics.tier_backpressure.read = per_stream(lambda t: t.backpressure_active)
        metrics.tiering_halted.read = per_stream(lambda t: t.halted is not None)
        metrics.remote_next_offset.read = per_stream(lambda t: t.committed_tree().next_offset)
        metrics.manifest_commits.read = per_stream(lambda t: t.manifest_commits)
        metrics.manifest_conflicts.read = per_stream(lambda t: t.manifest_conflicts)
        metrics.prefetch_memory_bytes.read = lambda: [((), float(default_prefetcher().budget.used))]
        metrics.tier_lag_seconds.read = per_stream(lambda t: t.lag_seconds)
        metrics.tier_degraded.read = per_stream(lambda t: t.task_health.degraded)
        metrics.tier_stalled_tasks.read = per_stream(lambda t: t.task_health.stalls)
        metrics.cold_chunk_bytes.read = per_stream(lambda t: t.coder.chunk_bytes if t.coder else 0)
        metrics.cold_stored_bytes.read = per_stream(
            lambda t: t.coder.stored_bytes if t.coder else 0
        )
        metrics.cold_compression_ratio.read = per_stream(
            lambda t: (
                t.coder.chunk_bytes / t.coder.stored_bytes
                if t.coder and t.coder.stored_bytes
                else 0.0
            )
        )
        metrics.cold_dictionary_trainings.read = per_stream(
            lambda t: t.coder.dictionaries_trained if t.coder else 0
        )

        def task_failures() -> list[tuple[tuple[str, str, str], float]]:
            out = []
            for incarnation, tierer in list(self.tierers.items()):
                handle = self._handles.get(incarnation)
                if handle is not None:
                    for task, n in list(tierer.task_health.failures.items()):
                        out.append(((handle.vhost, handle.name, task), float(n)))
            return out

        metrics.tier_task_failures.read = task_failures
        metrics.object_store_retries.read = lambda: [
            ((op, kind), float(n)) for (op, kind), n in RETRY_LOG.snapshot().items()
        ]
        metrics.object_store_lost_replies_resolved.read = lambda: [
            ((), float(getattr(self.store.inner, "resolved_creates", 0)))
        ]
