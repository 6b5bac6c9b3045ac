"""The server collects its own garbage: on a schedule (``tier.gc_interval_seconds``, on by
default), every object of the remote tier that no manifest references, no deletion is
pending for and no writer may still adopt is deleted once it is older than
``tier.gc_grace_seconds``, and incomplete multipart uploads that old are aborted.

The rule is ``remote/gc.py`` and the work for one incarnation ``tiering/gc.py``: the same
code ``tierlog spark gc`` runs. This module only chooses *what* this node collects and
*when*, and runs it on its own thread (never on the event loop):

* the streams whose tiering runs here: this node is their leader (in a cluster only the
  leader tiers a stream), so two nodes never collect one live stream's garbage at once;
* deleted incarnations (objects under an incarnation the catalog no longer holds, e.g. a
  fragment a writer uploaded while the stream was being deleted): only by the node
  holding the MetaStore lease ``gc/deleted-incarnations`` (renewed between
  incarnations, released after the run), so only one node of a cluster does it.
  Incarnations still in the cleanup queue are left to stream cleanup.

Why the grace period is safe: an object is unreferenced between its upload and the
commit of the root that names it, and the writer may be anywhere in that window when a
collection lists it. The server's writers report an upload or a commit running longer
than ``store.task_stall_seconds`` as stalled, so a healthy upload-to-commit interval is
under ``2 x task_stall_seconds`` (an upload, then its commit); the grace period must be
longer than that (checked at start-up) and defaults to a day, far above it, which also
covers the length of one collection (the walk happens before the listing).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tierlog.errors import ConfigError, TierlogError
from tierlog.logs import get_logger
from tierlog.metrics import Metrics
from tierlog.remote.catalog import Catalog
from tierlog.storage.errors import LeaseHeldError, LeaseLostError, UnsupportedBackendError
from tierlog.storage.meta_store import Lease
from tierlog.storage.object_store import ObjectStore
from tierlog.tiering.gc import IncarnationGc, Pacer, collect_incarnation, discover_incarnations
from tierlog.tiering.gc import streams_root as streams_root_of

if TYPE_CHECKING:
    from tierlog.server.config import ServerConfig

log = get_logger("tierlog.server.gc")

DELETED_LEASE = "gc/deleted-incarnations"
LEASE_TTL_SECONDS = 60.0
FIRST_RUN_MAX_DELAY = 60.0
"""The first collection runs this long after start at most (a server restarted more
often than ``gc_interval_seconds`` still collects)."""
GC_SETTINGS = ("gc_enabled", "gc_interval_seconds", "gc_grace_seconds", "gc_deletes_per_second")


def check_gc_settings(config: ServerConfig, defaults: Any) -> None:
    """``ConfigError`` for an invalid ``tier.gc_*`` value, or one that would do nothing:
    a gc setting on a node that does not tier (``tier.enabled = false``, a read-only
    node), or a gc tuning with ``gc_enabled = false``."""
    t = config.tier
    changed = [n for n in GC_SETTINGS if getattr(t, n) != getattr(defaults, n)]
    if not t.enabled or config.reader.read_only:
        if changed:
            why = "tier.enabled = false" if not t.enabled else "reader.read_only = true"
            raise ConfigError(f"tier.{changed[0]} does nothing with {why}: remove it")
        return
    if not t.gc_enabled:
        tuned = [n for n in changed if n != "gc_enabled"]
        if tuned:
            raise ConfigError(f"tier.{tuned[0]} does nothing with tier.gc_enabled = false")
        return
    for name in ("gc_interval_seconds", "gc_grace_seconds"):
        value = getattr(t, name)
        if not value > 0:
            raise ConfigError(f"tier.{name} must be > 0, got {value}")
    if not t.gc_deletes_per_second >= 0:
        raise ConfigError(
            f"tier.gc_deletes_per_second must be >= 0 (0: unlimited), got {t.gc_deletes_per_second}"
        )
    floor = 2 * config.store.task_stall_seconds
    if t.gc_grace_seconds <= floor:
        raise ConfigError(
            f"tier.gc_grace_seconds ({t.gc_grace_seconds}) must be longer than an upload and "
            f"its commit may take: > 2 x store.task_stall_seconds = {floor}"
        )


@dataclass
class GcRun:
    """One collection of this node: what it found, deleted and left alone."""

    started: float
    finished: float = 0.0
    incarnations: list[IncarnationGc] = field(default_factory=list)
    deleted_lease: bool = False

    @property
    def deleted(self) -> int:
        return sum(i.deleted for i in self.incarnations)

    @property
    def deleted_bytes(self) -> int:
        return sum(i.deleted_bytes for i in self.incarnations)

    @property
    def aborted(self) -> int:
        return sum(i.uploads_aborted for i in self.incarnations)

    @property
    def skipped(self) -> list[IncarnationGc]:
        return [i for i in self.incarnations if i.problems]


class GcService:
    """The scheduled collection of one server (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        store: ObjectStore,
        catalog: Catalog,
        metrics: Metrics,
        leading: Callable[[], list[str]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tier = config.tier
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.leading = leading
        self.clock = clock
        self.holder = config.cluster.node or "standalone"
        self._stopping = False
        self.pacer = Pacer(self.tier.gc_deletes_per_second, stopping=lambda: self._stopping)
        self.last_run: GcRun | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tierlog-gc")

    async def start(self) -> None:
        if self.tier.gc_enabled:
            self._task = asyncio.create_task(self._schedule())

    async def close(self) -> None:
        self._stopping = True  # a running collection stops between incarnations
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(min(self.tier.gc_interval_seconds, FIRST_RUN_MAX_DELAY))
        while True:
            try:
                await loop.run_in_executor(self._executor, self.collect)
            except (TierlogError, OSError) as exc:  # the store or MetaStore failing
                self.metrics.gc_runs.labels(outcome="failed").inc()
                log.warning("gc_failed", error=repr(exc))
            except Exception as exc:  # a defect: reported, and the schedule goes on
                self.metrics.gc_runs.labels(outcome="failed").inc()
                log.exception("gc_failed", error=repr(exc))
            await asyncio.sleep(self.tier.gc_interval_seconds)

    # -- one collection (on the gc thread) ------------------------------------------------
    def collect(self) -> GcRun:
        """Collect the garbage of every stream this node leads, then (holding the lease)
        of every deleted incarnation; record the run in the metrics and the log."""
        run = GcRun(self.clock())
        for incarnation in sorted(self.leading()):
            if self._stopping:
                return run
            self._collect_one(run, incarnation, live=True)
        self._collect_deleted(run)
        run.finished = self.clock()
        self.last_run = run
        m = self.metrics
        m.gc_runs.labels(outcome="ok").inc()
        m.gc_last_run_timestamp.set(run.finished)
        m.gc_last_run_seconds.set(run.finished - run.started)
        log.info(
            "gc_run",
            incarnations=len(run.incarnations),
            deleted=run.deleted,
            deleted_bytes=run.deleted_bytes,
            uploads_aborted=run.aborted,
            skipped=len(run.skipped),
            deleted_incarnations=run.deleted_lease,
            seconds=round(run.finished - run.started, 3),
        )
        return run

    def _collect_one(self, run: GcRun, incarnation: str, *, live: bool) -> None:
        try:
            result = collect_incarnation(
                self.store,
                self.catalog,
                self.tier.prefix,
                incarnation,
                live=live,
                grace_seconds=self.tier.gc_grace_seconds,
                now=self.clock,
                apply=True,
                pacer=self.pacer,
            )
        except (TierlogError, OSError) as exc:  # this stream waits for the next run
            log.warning("gc_stream_failed", incarnation=incarnation, error=repr(exc))
            return
        run.incarnations.append(result)
        m = self.metrics
        m.gc_deleted_objects.inc(result.deleted)
        m.gc_deleted_bytes.inc(result.deleted_bytes)
        m.gc_aborted_uploads.inc(result.uploads_aborted)
        if result.problems:
            m.gc_skipped_streams.inc()
            log.warning(
                "gc_skipped",
                incarnation=incarnation,
                reason=result.skipped_reason,
                problems=result.problems[:3],
            )
        elif result.deleted or result.uploads_aborted:
            log.info(
                "gc_collected",
                incarnation=incarnation,
                live=live,
                deleted=result.deleted,
                deleted_bytes=result.deleted_bytes,
                uploads_aborted=result.uploads_aborted,
                truncated=result.truncated,
            )

    def _collect_deleted(self, run: GcRun) -> None:
        meta = self.catalog.meta
        try:
            lease: Lease = meta.acquire_lease(DELETED_LEASE, self.holder, LEASE_TTL_SECONDS)
        except LeaseHeldError:
            return  # another node collects deleted incarnations now
        except UnsupportedBackendError:
            return
        run.deleted_lease = True
        held = True
        try:
            # the catalog before the listing: a stream created in between has only
            # objects younger than the grace period
            known = {r.incarnation for r in self.catalog.list()}
            known |= {inc for _item, inc, _at in self.catalog.pending_cleanups()}
            found = discover_incarnations(self.store, streams_root_of(self.tier.prefix))
            for incarnation in found:
                if self._stopping:
                    return
                if incarnation in known:
                    continue
                lease = meta.renew_lease(lease, LEASE_TTL_SECONDS)
                self._collect_one(run, incarnation, live=False)
        except LeaseLostError:
            held = False
            log.warning("gc_lease_lost", lease=DELETED_LEASE)
        finally:
            if held:
                with contextlib.suppress(LeaseLostError):
                    meta.release_lease(lease)
