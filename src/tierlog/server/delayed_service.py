"""Delayed delivery in the server: the publish path of delayed streams, their hidden system
streams, one scheduler per delayed stream, admin routes and metrics (docs/delayed.md).

A stream created with ``x-tierlog-delayed=true`` gets a hidden system stream
(``delayed_intake.system_stream_name``: ``SYSTEM_PREFIX + name``, or a hashed name when
that is too long) in its vhost, with the stream's settings (same ack / sync mode, same
tiering) minus retention: it is the durable copy of every scheduled message until it is
delivered. Its retention is the scheduler's last checkpoint: records below it go. It is
created on the first need, not listed, not creatable or deletable by users, and deleted
when its stream is (the service's reconcile pass, every ``RECONCILE_SECONDS``, notices).

The scheduler of a stream runs on the node that leads both the stream and its system
stream (single node: this one). In a cluster the system stream gets the stream's voters
(same replication factor), this node takes over a leaderless system stream only when it
leads the stream (``may_take_over``; the server registers this service as the cluster's
``leadership_hooks``), and the reconcile pass starts the scheduler
(``Scheduler.rebuild()`` then ``start()``) once both are led here. A step-down of either
stops the scheduler's rounds at once (``stepping_down``); a dispatch already under way
then fails at the deposed leader's confirm gate and the new leader's rebuild decides, by
the dispatcher's producer sequence in its log, what was delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tierlog.delayed.clock import MetaStoreClock, ReferencedClock
from tierlog.delayed.errors import DelayedError, NotScheduledError
from tierlog.delayed.pointer import CheckpointPointer
from tierlog.delayed.scheduler import Scheduler, SchedulerConfig
from tierlog.delayed.timers import TimerStore
from tierlog.errors import TierlogError
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.remote.catalog import StreamRecord
from tierlog.remote.errors import StreamExistsError, StreamNotFoundError
from tierlog.remote.settings import StreamSettings
from tierlog.server.admin_security import AdminGuard
from tierlog.server.broker import Broker, StreamHandle
from tierlog.server.cluster_service import ClusterService
from tierlog.server.delayed_intake import (
    DelayedIntake,
    HandlePort,
    is_system_stream,
    parent_stream_name,
    resolve_system_name,
)
from tierlog.server.tiering_service import TieringService
from tierlog.storage.meta_store import MetaStore
from tierlog.storage.object_store import ObjectStore

log = get_logger("tierlog.server.delayed")

RECONCILE_SECONDS = 0.5


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _free_below(system: StreamHandle, floor: int) -> list[int]:
    """Delete the sealed local segments of ``system`` wholly below ``floor``, oldest first
    (on its writer thread)."""
    freed = []
    for segment in system.log.list_segments():
        if not segment.sealed or segment.next_offset > floor:
            break
        system.log.delete_segment(segment.first_offset)
        freed.append(segment.first_offset)
    return freed


def system_settings(parent: StreamSettings) -> StreamSettings:
    """The parent's settings (ack mode, tiering) without the parent's retention: nothing
    scheduled may be removed before it is delivered. The system stream's retention is its
    checkpoints' floor (``_apply_floor``)."""
    return parent.updated(
        delayed=False,
        max_bytes=None,
        max_age_seconds=None,
        local_max_bytes=None,
        local_max_age_seconds=None,
    )


class DelayedService:
    """Every delayed stream's system stream, intake and scheduler on this server."""

    def __init__(
        self,
        broker: Broker,
        metrics: Metrics,
        meta: MetaStore,
        *,
        objects: ObjectStore | None = None,
        tier_prefix: str = "",
        epoch: int = 1,
        schedule_deletion: Callable[[list[str]], None] | None = None,
        config: SchedulerConfig | None = None,
        tiering: TieringService | None = None,
    ) -> None:
        self.broker = broker
        self.tiering = tiering
        self._floors: dict[tuple[str, str], int] = {}
        self.metrics = metrics
        self.meta = meta
        self.objects = objects
        self.tier_prefix = tier_prefix
        self.epoch = epoch
        self.schedule_deletion = schedule_deletion
        self.config = config
        self.root = os.path.join(broker.config.storage.data_dir, "delayed")
        self.reference = MetaStoreClock(meta)
        self.accept_clock = ReferencedClock(self.reference)
        self.schedulers: dict[tuple[str, str], Scheduler] = {}
        self._creating: dict[tuple[str, str], asyncio.Task[StreamHandle | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.broker.handle_opened = self._attach
        self._register_metrics()
        self._task = asyncio.create_task(self._reconcile_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for scheduler in list(self.schedulers.values()):
            await scheduler.stop()
        self.schedulers.clear()
        for task in list(self._stopping):
            with contextlib.suppress(asyncio.CancelledError, TierlogError, OSError):
                await task

    def _cluster(self) -> ClusterService | None:
        placement = self.broker.placement
        return placement if isinstance(placement, ClusterService) else None

    def may_take_over(self, record: StreamRecord) -> bool:
        """A leaderless system stream is taken over only by the leader of its stream (or
        when its stream is unknown here, so that an orphan can still be deleted): the
        scheduler needs both on one node."""
        if not is_system_stream(record.name):
            return True
        parent = parent_stream_name(self.broker, record.vhost, record.name)
        if parent is None:
            return True  # its stream is unknown here: an orphan, to be deleted
        if self.broker.get(record.vhost, parent) is not None:
            return True
        return self.broker.opening(record.vhost, parent) is None

    def stepping_down(self, handle: StreamHandle) -> None:
        """This node no longer leads ``handle`` (a delayed stream or a system stream):
        its scheduler's rounds stop now, before the stream is released; the working set
        closes in the background."""
        name: str | None = handle.name
        if is_system_stream(handle.name):
            name = parent_stream_name(self.broker, handle.vhost, handle.name)
        if name is None:
            return
        scheduler = self.schedulers.get((handle.vhost, name))
        if scheduler is None:
            return
        del self.schedulers[(handle.vhost, name)]
        scheduler.halt()
        task = asyncio.get_running_loop().create_task(scheduler.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        log.info("delayed_scheduler_stopped", vhost=handle.vhost, stream=name, reason="step_down")

    def _attach(self, handle: StreamHandle) -> None:
        """Every publish to a delayed stream goes through its intake from the first one."""
        if handle.settings.delayed and not is_system_stream(handle.name):
            handle.delayed = DelayedIntake(self, handle)
            self._wake.set()

    async def _reconcile_loop(self) -> None:
        await self.broker.all_open.wait()
        try:
            await self._sweep_deleted()
        except (TierlogError, OSError) as exc:
            log.error("delayed_sweep_failed", error=repr(exc))
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except (TierlogError, OSError) as exc:
                log.error("delayed_reconcile_failed", error=repr(exc))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RECONCILE_SECONDS)

    async def reconcile(self) -> None:
        """Intakes on open delayed streams, their system streams and schedulers; system
        streams and schedulers of deleted streams removed."""
        handles = {(h.vhost, h.name): h for h in self.broker.streams()}
        for key, handle in handles.items():
            if is_system_stream(handle.name) or not handle.settings.delayed:
                continue
            if getattr(handle, "delayed", None) is None:
                handle.delayed = DelayedIntake(self, handle)
            scheduler = self.schedulers.get(key)
            if scheduler is not None and scheduler.incarnation != handle.record.incarnation:
                await self._retire(key, scheduler)  # deleted and created again
                scheduler = None
            if scheduler is not None and self.open_system_stream(handle) is None:
                await self._pause(key, scheduler, "system stream not led here")
                scheduler = None
            if scheduler is None and handle.unavailable is None:
                system = await self.ensure_system_stream(handle)
                if system is not None and system.unavailable is None:
                    await self._start_scheduler(handle)
        for key, scheduler in list(self.schedulers.items()):
            if key in handles:
                await self._apply_floor(handles[key], scheduler)
                continue
            if self.broker.opening(*key) is None:
                await self._retire(key, scheduler)
            else:  # led elsewhere now: its state is the new leader's to rebuild
                await self._pause(key, scheduler, "stream not led here")
        for handle in handles.values():  # system streams whose stream is gone
            if not is_system_stream(handle.name):
                continue
            parent_name = parent_stream_name(self.broker, handle.vhost, handle.name)
            if parent_name is None:
                await self._delete_system(handle.vhost, handle.name)
                continue
            parent_key = (handle.vhost, parent_name)
            parent = handles.get(parent_key)
            if parent is None and self.broker.opening(*parent_key) is None:
                await self._delete_system(handle.vhost, handle.name)
            elif parent is not None and handle.record.created_ns < parent.record.created_ns:
                await self._delete_system(handle.vhost, handle.name)  # of an older stream

    async def _apply_floor(self, handle: StreamHandle, scheduler: Scheduler) -> None:
        """Let the system stream's retention drop what the scheduler's last checkpoint
        summarized: through the tiering service (whole fragments below the floor, then the
        local segments below the new remote start), or, without a remote tier on a single
        node, the sealed local segments wholly below it. In a cluster without a remote tier
        the local copies are kept (a lagging member may still need them)."""
        floor = scheduler.floor
        key = (handle.vhost, handle.name)
        if floor is None or floor <= self._floors.get(key, -1):
            return
        system = self.open_system_stream(handle)
        if system is None:
            return
        if self.tiering is not None:
            self.tiering.set_retention_floor(system, floor)
        elif system.confirm_gate is None:
            loop = asyncio.get_running_loop()
            freed = await loop.run_in_executor(system.executor, _free_below, system, floor)
            if freed:
                log.info("delayed_system_segments_freed", stream=handle.name, segments=freed)
        self._floors[key] = floor

    async def _sweep_deleted(self) -> None:
        """Working sets, timer manifests and timer objects of streams deleted while the
        server was down (their incarnation is in no catalog record any more)."""
        loop = asyncio.get_running_loop()
        live = {r.incarnation for r in await loop.run_in_executor(None, self.broker.catalog.list)}
        names = os.listdir(self.root) if os.path.isdir(self.root) else []
        for incarnation in names:
            if incarnation in live:
                continue
            path = self._working_dir(incarnation)
            await loop.run_in_executor(None, _remove_tree, path)
            await loop.run_in_executor(None, CheckpointPointer(self.meta, incarnation).delete)
            if self.objects is not None:
                timers = TimerStore(
                    self.objects, self.meta, self.tier_prefix, incarnation, self.epoch
                )
                keys = await loop.run_in_executor(None, timers.all_keys)
                if keys and self.schedule_deletion is not None:
                    self.schedule_deletion(keys)
                await loop.run_in_executor(None, timers.delete_manifest)
            log.info("delayed_state_of_deleted_stream_removed", incarnation=incarnation)

    def _working_dir(self, incarnation: str) -> str:
        return os.path.join(self.root, incarnation)

    async def _start_scheduler(self, handle: StreamHandle) -> None:
        key = (handle.vhost, handle.name)
        incarnation = handle.record.incarnation
        timers = None
        if self.objects is not None:
            timers = TimerStore(
                self.objects,
                self.meta,
                self.tier_prefix,
                incarnation,
                max(self.epoch, handle.log.max_epoch),  # the stream's writer epoch
                settings=handle.settings,
            )
        base = self.config or SchedulerConfig()
        config = dataclasses.replace(
            base, horizon_ms=int(handle.settings.delayed_horizon_seconds * 1000)
        )
        scheduler = Scheduler(
            handle.vhost,
            handle.name,
            incarnation,
            HandlePort(self.broker, handle.vhost, handle.name),
            self._working_dir(incarnation),
            self.metrics,
            config=config,
            timers=timers,
            reference=self.reference,
            schedule_deletion=self.schedule_deletion,
            pointer=CheckpointPointer(self.meta, incarnation),
        )
        await scheduler.rebuild()
        scheduler.start()
        self.schedulers[key] = scheduler

    async def _pause(self, key: tuple[str, str], scheduler: Scheduler, reason: str) -> None:
        """Stop a scheduler whose stream lives on (led elsewhere, or its system stream not
        available here): nothing of its durable state is touched."""
        self.schedulers.pop(key, None)
        await scheduler.stop()
        log.info("delayed_scheduler_stopped", vhost=key[0], stream=key[1], reason=reason)

    async def _retire(self, key: tuple[str, str], scheduler: Scheduler) -> None:
        """The stream is gone: stop its scheduler, drop its working set, timer manifest and
        timer objects (through the deletion queue), and its system stream."""
        self.schedulers.pop(key, None)
        await scheduler.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, lambda: shutil.rmtree(scheduler.working_dir, ignore_errors=True)
        )
        await loop.run_in_executor(None, CheckpointPointer(self.meta, scheduler.incarnation).delete)
        if scheduler.timers is not None:
            timers = scheduler.timers
            keys = await loop.run_in_executor(None, timers.all_keys)
            if keys and self.schedule_deletion is not None:
                self.schedule_deletion(keys)
            await loop.run_in_executor(None, timers.delete_manifest)
        log.info("delayed_stream_retired", vhost=key[0], stream=key[1])

    async def _delete_system(self, vhost: str, name: str) -> None:
        with contextlib.suppress(StreamNotFoundError):
            await self.broker.delete_stream(vhost, name)
            log.info("delayed_system_stream_deleted", vhost=vhost, stream=name)

    def open_system_stream(self, handle: StreamHandle) -> StreamHandle | None:
        """The stream's system stream when it is open and available now."""
        system = self.broker.get(
            handle.vhost, resolve_system_name(self.broker, handle.vhost, handle.name)
        )
        if system is None or system.unavailable is not None:
            return None
        return system if system.record.created_ns >= handle.record.created_ns else None

    async def ensure_system_stream(self, handle: StreamHandle) -> StreamHandle | None:
        """The open system stream of a delayed stream, created when missing; None while it
        is not available (opening after a restart, or creation failed)."""
        name = resolve_system_name(self.broker, handle.vhost, handle.name)
        system = self.broker.get(handle.vhost, name)
        if system is not None:
            if system.record.created_ns >= handle.record.created_ns:
                return system if system.unavailable is None else None
            return None  # of an older incarnation: reconcile deletes it first
        if self.broker.opening(handle.vhost, name) is not None:
            return None
        key = (handle.vhost, name)
        task = self._creating.get(key)
        if task is None:
            task = asyncio.create_task(self._create_system(handle, name))
            self._creating[key] = task
            task.add_done_callback(lambda _t: self._creating.pop(key, None))
        return await asyncio.shield(task)

    def _same_voters(self, handle: StreamHandle, name: str) -> None:
        """In a cluster the system stream gets the stream's voters: the same replication
        factor, on the same nodes (so its leadership can follow the stream's)."""
        cluster = self._cluster()
        if cluster is None:
            return
        leader = cluster.node.leaders.get(handle.record.incarnation)
        if leader is None:
            return
        members = leader.leadership.membership.voters
        cluster.check_create(handle.vhost, name, {"x-initial-cluster-size": str(len(members))})
        mine = (cluster.name, *(m for m in members if m != cluster.name))
        cluster._new_voters[(handle.vhost, name)] = mine  # the stream's, not the first live

    async def _create_system(self, handle: StreamHandle, name: str) -> StreamHandle | None:
        try:
            self._same_voters(handle, name)
            system = await self.broker.create_stream(
                handle.vhost, name, system_settings(handle.settings)
            )
        except StreamExistsError:
            return self.broker.get(handle.vhost, name)
        except (TierlogError, OSError) as exc:
            log.error("delayed_system_stream_create_failed", stream=handle.name, error=repr(exc))
            return None
        self._wake.set()
        log.info("delayed_system_stream_created", vhost=handle.vhost, stream=name)
        for _ in range(200):  # the lifecycle (tiering) resolves it first
            if system.unavailable is None:
                break
            await asyncio.sleep(0.05)
        return system if system.unavailable is None else None

    # ----------------------------------------------------------------- admin and metrics

    def scheduler(self, vhost: str, name: str) -> Scheduler | None:
        return self.schedulers.get((vhost, name))

    def _register_metrics(self) -> None:
        m = self.metrics

        def per_stream(value: Callable[[Scheduler], float | None]) -> Callable[[], list[Any]]:
            def read() -> list[Any]:
                out = []
                for (vhost, name), s in list(self.schedulers.items()):
                    v = value(s)
                    if v is not None:
                        out.append(((vhost, name), float(v)))
                return out

            return read

        def next_due(s: Scheduler) -> float | None:
            due = s.state.next_due_ms()
            return None if due is None else due / 1000

        m.delayed_scheduled.read = per_stream(lambda s: s.state.count())
        m.delayed_next_due_seconds.read = per_stream(next_due)
        m.delayed_dispatch_halted.read = per_stream(lambda s: 1.0 if s.halted else 0.0)

    def add_routes(self, app: web.Application, guard: AdminGuard) -> None:
        """``GET /api/streams/{name}/delayed``: the scheduler's status;
        ``POST /api/streams/{name}/delayed/cancel`` ``{"reference": ..., "publishing_id": n}``:
        cancel a scheduled message (404 when it is not scheduled any more)."""

        def lookup(request: web.Request) -> tuple[str, str]:
            return request.query.get("vhost", "/"), request.match_info["name"]

        def missing(vhost: str, name: str) -> web.Response:
            handle = self.broker.get(vhost, name)
            if handle is not None and not handle.settings.delayed:
                return web.json_response(
                    {"error": f"stream {name!r} was not created with x-tierlog-delayed=true"},
                    status=400,
                )
            return web.json_response(
                {"error": f"no delayed-delivery scheduler for {name!r} in vhost {vhost!r}"},
                status=404 if handle is None else 503,
            )

        async def status(request: web.Request) -> web.Response:
            vhost, name = lookup(request)
            if not guard.may(request, vhost, "configure", name):
                guard.require(request, vhost, "read", name)
            scheduler = self.scheduler(vhost, name)
            if scheduler is None:
                return missing(vhost, name)
            body = dict(scheduler.status())
            # the hidden system stream (refused on the stream routes, a reserved name):
            # how far it is written and tiered, what a disk loss would replay from
            system = self.broker.get(vhost, resolve_system_name(self.broker, vhost, name))
            if system is not None:
                sys_status = system.status()
                body["system_stream"] = {
                    "next_offset": sys_status["local"]["next_offset"],
                    "tiered_offset": sys_status["remote"].get("tiered_offset"),
                }
            return web.json_response(body)

        async def cancel(request: web.Request) -> web.Response:
            vhost, name = lookup(request)
            guard.require(request, vhost, "configure", name)
            try:
                data = await request.json()
            except ValueError:
                return web.json_response({"error": "body must be JSON"}, status=400)
            reference = data.get("reference") if isinstance(data, dict) else None
            pid = data.get("publishing_id") if isinstance(data, dict) else None
            if not isinstance(reference, str) or not reference:
                return web.json_response(
                    {"error": "'reference' must be a non-empty string"}, status=400
                )
            if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
                return web.json_response(
                    {"error": "'publishing_id' must be a non-negative integer"}, status=400
                )
            scheduler = self.scheduler(vhost, name)
            if scheduler is None:
                return missing(vhost, name)
            try:
                place = await scheduler.cancel(reference, pid)
            except NotScheduledError as exc:
                return web.json_response({"error": str(exc)}, status=404)
            except DelayedError as exc:
                return web.json_response({"error": str(exc)}, status=503)
            return web.json_response({"cancelled": True, "was": place})

        app.router.add_get("/api/streams/{name}/delayed", status)
        app.router.add_post("/api/streams/{name}/delayed/cancel", cancel)
