"""The node's cluster runtime inside the server (``[cluster]`` config table).

* Registers the node's one lease once the listeners are bound (their addresses are
  what it advertises) and keeps it alive from its own thread; every renewal and its
  loss reach every stream the node leads (``cluster.node.ClusterNode``).
* Leads streams: a stream is opened here only after this node acquired its leadership
  in the directory (``next_leader_epoch``: above the record, the manifest pointer and
  the local disk), then the log begins the new epoch with a tracking-snapshot chunk,
  then tiering starts, whose first remote action is the fencing commit of the manifest
  pointer in that epoch.
* Gates confirms: a written publish group is confirmed when the stream's ``Commit``
  effect reaches its last chunk, which the leader emits only while it may confirm
  (before last renewal + TTL - drift). A leader that steps down refuses what waits
  (STREAM_NOT_AVAILABLE; a named producer's retry is deduplicated) and closes the
  stream here, so its clients look the leader up again.
* Watches the directory: one scan per ``cluster.scan_interval_seconds`` reads every
  stream record and the live nodes, takes over streams whose leader's lease is gone
  (this node being a voter), and learns streams created elsewhere.

One timer task drives every led stream's ``LeaderState``; no task or thread per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierlog.cluster.errors import (
    ClusterError,
    LeaderAliveError,
    NotAMemberError,
    NotLeaderError,
)
from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.membership import ClusterDirectory, Leadership, NodeInfo
from tierlog.cluster.node import (
    ClusterNode,
    DirectoryView,
    NodeLease,
    StreamLeader,
    register_stream,
)
from tierlog.cluster.state import (
    AppendTrackingSnapshot,
    Commit,
    Effect,
    LeaseLost,
    LeaseRenewed,
    LeaseTiming,
    RequestAdopt,
    StepDown,
)
from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.protocol.commands import BrokerAddress, StreamMetadata
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.storage.errors import (
    KeyDeletedError,
    LeaseHeldError,
    LeaseLostError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore
from tierlog.tiering.errors import DeposedError

if TYPE_CHECKING:
    from tierlog.server.broker import Broker, Done, StreamHandle
    from tierlog.server.config import ServerConfig

log = get_logger("tierlog.server.cluster")

CLUSTER_SIZE_ARGUMENTS = ("initial-cluster-size", "x-initial-cluster-size")


@dataclass(frozen=True, slots=True)
class StreamLocation:
    """What Metadata tells a client about a stream: its leader and replicas."""

    code: int
    leader: NodeInfo | None
    replicas: tuple[NodeInfo, ...]


class ClusterService:
    """One node of a cluster, wired into the broker as its ``placement``."""

    def __init__(self, config: ServerConfig, meta: MetaStore, catalog: Catalog) -> None:
        c = config.cluster
        self.config = config
        self.cluster = c
        self.catalog = catalog
        self.timing = LeaseTiming(c.lease_ttl_seconds, c.drift_seconds)
        self.directory = ClusterDirectory(meta)
        self.node = ClusterNode(c.node, self.timing)
        self.name = c.node
        self.lease: NodeLease | None = None
        self.view = DirectoryView({}, {})
        self.broker: Broker | None = None
        self.handles: dict[str, StreamHandle] = {}  # led streams by incarnation
        self.registered = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        # the lease keepalive never waits behind directory reads or acquisitions
        self._lease_thread = ThreadPoolExecutor(1, thread_name_prefix="cluster-lease")
        self._directory_threads = ThreadPoolExecutor(2, thread_name_prefix="cluster-directory")
        self.stepped_down = 0
        self.acquired = 0

    # -- lifecycle --------------------------------------------------------------------
    async def start(self, broker: Broker, stream_address: str, admin_address: str) -> None:
        """Attach to the broker and register in the background (an earlier run's lease
        may still be held for up to one TTL after a crash)."""
        self.broker = broker
        broker.placement = self
        info = NodeInfo(
            self.name,
            self.cluster.stream_address or stream_address,
            self.cluster.admin_address or admin_address,
            self.cluster.replication_address,
        )
        self.lease = NodeLease(self.directory, info, self.timing)
        self._tasks.append(asyncio.create_task(self._run()))

    async def close(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for incarnation in list(self.node.leaders):
            leader = self.node.forget(incarnation)
            if leader is not None and not leader.stepped_down:
                with contextlib.suppress(TierlogError, OSError):
                    await self._directory(self.directory.resign, leader.leadership)
        if self.lease is not None and self.lease.held:
            with contextlib.suppress(TierlogError, OSError):
                await asyncio.get_running_loop().run_in_executor(
                    self._lease_thread, self.lease.release
                )
        self._lease_thread.shutdown(wait=False)
        self._directory_threads.shutdown(wait=False)

    async def _run(self) -> None:
        await self._register()
        self._tasks.append(asyncio.create_task(self._keepalive()))
        self._tasks.append(asyncio.create_task(self._timer()))
        self._tasks.append(asyncio.create_task(self._scan_loop()))

    async def _register(self) -> None:
        assert self.lease is not None
        loop = asyncio.get_running_loop()
        lease = self.lease
        while not self._stopping:
            try:
                info, _ = await loop.run_in_executor(self._lease_thread, lease.register)
            except LeaseHeldError:
                # our previous run's lease: it expires within one TTL
                await asyncio.sleep(min(1.0, self.timing.ttl / 4))
                continue
            except (TierlogError, OSError) as exc:
                log.error("cluster_register_failed", node=self.name, error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            log.info(
                "cluster_node_registered",
                node=self.name,
                lease_epoch=info.lease_epoch,
                stream_address=info.stream_address,
            )
            self.registered.set()
            return

    async def _keepalive(self) -> None:
        """One renewal every TTL/4 for every stream the node leads."""
        assert self.lease is not None
        loop = asyncio.get_running_loop()
        lease = self.lease
        interval = max(0.1, self.timing.ttl / 4)
        while True:
            await asyncio.sleep(interval)
            if not lease.held:
                self.registered.clear()
                await self._register()
                continue
            try:
                sent_at = await loop.run_in_executor(self._lease_thread, lease.renew)
            except LeaseLostError as exc:
                log.warning("cluster_lease_lost", node=self.name, error=str(exc))
                lease.lost()
                self._carry(self.node.broadcast(LeaseLost()))
                continue
            except (TierlogError, OSError) as exc:
                # the MetaStore is out of reach: keep trying; the led streams stop
                # confirming at their deadline and step down at the lease's end
                log.warning("cluster_lease_renewal_failed", node=self.name, error=repr(exc))
                continue
            self._carry(self.node.broadcast(LeaseRenewed(sent_at)))

    async def _timer(self) -> None:
        """The shared timer of every led stream (lease deadlines, check-quorum)."""
        interval = max(0.05, min(0.5, self.timing.drift / 4))
        while True:
            await asyncio.sleep(interval)
            self._carry(self.node.tick())

    async def _scan_loop(self) -> None:
        while True:
            try:
                await self.scan()
            except (TierlogError, OSError) as exc:
                log.warning("cluster_scan_failed", node=self.name, error=repr(exc))
            except Exception as exc:  # a bug must not end failover for good
                log.error("cluster_scan_crashed", node=self.name, error=repr(exc))
            await asyncio.sleep(self.cluster.scan_interval_seconds)

    async def scan(self) -> None:
        """Read the directory and the catalog once; take over leaderless streams this
        node is a voter of, learn streams led elsewhere, drop deleted ones."""
        broker = self.broker
        assert broker is not None
        view, records = await self._directory(self._read)
        self.view = view
        if not self.registered.is_set() or not broker.catalog_loaded.is_set():
            return
        by_incarnation = {r.incarnation: r for r in records}
        for record in records:
            if broker.get(record.vhost, record.name) is None:
                broker.led_elsewhere(record)
        for incarnation in view.to_take_over(self.name):
            record = by_incarnation.get(incarnation)
            if record is None or incarnation in self.handles:
                continue
            try:
                await broker.take_over(record)
            except (TierlogError, OSError) as exc:
                log.error("cluster_take_over_failed", stream=record.name, error=repr(exc))
        known = {(r.vhost, r.name) for r in records}
        for opening in broker.opening_streams():
            key = (opening.record.vhost, opening.record.name)
            if key not in known:
                broker.forget_elsewhere(*key)

    def _read(self) -> tuple[DirectoryView, list[StreamRecord]]:
        return DirectoryView.read(self.directory), self.catalog.list()

    async def _directory(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._directory_threads, fn, *args)

    # -- placement (called by the broker) ---------------------------------------------
    async def should_open(self, record: StreamRecord) -> bool:
        await self.registered.wait()
        existing = await self._directory(self.directory.stream, record.incarnation)
        if existing is None:
            return True  # a stream from before the cluster: the first node to open it leads
        if not existing.membership.is_voter(self.name):
            return False
        place = (await self._directory(DirectoryView.read, self.directory)).streams.get(
            record.incarnation
        )
        return place is None or place.leader is None or place.leader.name == self.name

    def not_available(self, vhost: str, name: str) -> bool:
        return False  # streams this node knows of are listed by the broker as led elsewhere

    async def leading(self, handle: StreamHandle) -> None:
        """Acquire the stream's leadership for a log just opened here, begin its epoch
        (a tracking-snapshot chunk), and gate its confirms on the cluster commit."""
        await self.registered.wait()
        node_lease = self.lease.lease if self.lease is not None else None
        if node_lease is None:
            raise NotLeaderError(f"{handle.name}: this node holds no lease right now")
        incarnation = handle.record.incarnation
        disk_epoch = handle.log.max_epoch
        try:
            await self._directory(register_stream, self.directory, incarnation, (self.name,))
            sent_at = time.monotonic()
            leadership: Leadership = await self._directory(
                self.directory.acquire_leadership,
                incarnation,
                self.name,
                node_lease,
                (disk_epoch,),
            )
        except (LeaderAliveError, NotAMemberError, VersionConflictError, KeyDeletedError) as exc:
            raise NotLeaderError(f"{handle.name}: {exc}") from exc
        if leadership.membership.voters != (self.name,) or leadership.membership.learners:
            # several members need replication between nodes, which is not wired here
            await self._directory(self.directory.resign, leadership)
            raise NotLeaderError(
                f"{handle.name}: members {leadership.membership.members} need replication"
            )
        leader = self.node.lead(leadership, _tail(handle), sent_at)
        self.handles[incarnation] = handle
        self.acquired += 1
        try:
            effects = leader.start(time.monotonic())
            await self._carry_now(leader, handle, effects)
        except BaseException:
            self.node.forget(incarnation)
            self.handles.pop(incarnation, None)
            raise
        if leader.stepped_down:
            self.node.forget(incarnation)
            self.handles.pop(incarnation, None)
            raise NotLeaderError(f"{handle.name}: {leader.state.step_down_reason}")
        handle.confirm_gate = _LeaderGate(self, leader)
        handle.commit_fence = _lease_fence(leader)
        log.info(
            "cluster_stream_leading",
            stream=handle.name,
            incarnation=incarnation,
            epoch=leadership.epoch,
            disk_epoch=disk_epoch,
        )

    async def _carry_now(
        self, leader: StreamLeader, handle: StreamHandle, effects: list[Effect]
    ) -> None:
        """Carry out a new leader's first effects before the stream is used: begin the
        epoch on the log (its writer lane), feed the chunk back."""
        loop = asyncio.get_running_loop()
        pending = list(effects)
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, AppendTrackingSnapshot):
                chunk_id = await loop.run_in_executor(
                    handle.executor, _start_epoch, handle.log, effect.epoch
                )
                pending.extend(leader.written(chunk_id, effect.epoch, [], [], time.monotonic()))
            elif isinstance(effect, StepDown | Commit):
                continue  # applied by the leader object itself
            elif isinstance(effect, RequestAdopt) and not effect.members:
                continue  # a single member: nobody else to ask
            else:  # CatchUp, PromoteLearner, RequestAdopt to others: replication
                raise ClusterError(f"{handle.name}: replication effect {effect!r} not supported")

    def _carry(self, effects: dict[str, list[Effect]]) -> None:
        for incarnation, stream_effects in effects.items():
            for effect in stream_effects:
                if isinstance(effect, StepDown):
                    self._step_down(incarnation, effect.reason)

    def _step_down(self, incarnation: str, reason: str) -> None:
        leader = self.node.forget(incarnation)
        handle = self.handles.pop(incarnation, None)
        self.stepped_down += 1
        log.warning("cluster_stream_step_down", incarnation=incarnation, reason=reason)
        if handle is not None and self.broker is not None:
            asyncio.get_running_loop().create_task(self._release(handle, leader, reason))

    async def _release(
        self, handle: StreamHandle, leader: StreamLeader | None, reason: str
    ) -> None:
        assert self.broker is not None
        await self.broker.release(handle, reason)
        if leader is not None:
            with contextlib.suppress(TierlogError, OSError):
                await self._directory(self.directory.resign, leader.leadership)

    # -- what clients see ---------------------------------------------------------------
    def check_create(self, arguments: Mapping[str, str]) -> None:
        """The replication factor asked for at creation (``x-initial-cluster-size``,
        else ``cluster.initial_cluster_size``): refused unless this node can run it."""
        size = self.cluster.initial_cluster_size
        for key in CLUSTER_SIZE_ARGUMENTS:
            if key in arguments:
                try:
                    size = int(arguments[key])
                except ValueError:
                    raise ConfigError(f"{key} must be an integer, got {arguments[key]!r}") from None
        if size < 1:
            raise ConfigError(f"initial-cluster-size must be >= 1, got {size}")
        if size > 1:
            raise ConfigError(
                f"initial-cluster-size {size}: replication between nodes is not available"
                " in this version (1 only)"
            )

    def locate(self, vhost: str, name: str) -> StreamLocation:
        """Leader and replicas of a stream as Metadata reports them."""
        broker = self.broker
        assert broker is not None
        handle = broker.get(vhost, name)
        me = self.lease.info if self.lease is not None else None
        if handle is not None and handle.record.incarnation in self.handles and me is not None:
            return StreamLocation(ResponseCode.OK, me, ())
        opening = broker.opening(vhost, name)
        if opening is None:
            return StreamLocation(ResponseCode.STREAM_DOES_NOT_EXIST, None, ())
        place = self.view.streams.get(opening.record.incarnation)
        if place is None or place.leader is None or place.leader.name == self.name:
            return StreamLocation(ResponseCode.STREAM_NOT_AVAILABLE, None, ())
        return StreamLocation(ResponseCode.OK, place.leader, ())

    def status(self) -> dict[str, Any]:
        return {
            "node": self.name,
            "registered": self.registered.is_set(),
            "leading": sorted(self.handles),
            "acquired": self.acquired,
            "stepped_down": self.stepped_down,
            "live_nodes": sorted(self.view.nodes),
        }


class _LeaderGate:
    """A led stream's confirm gate: a written group's confirms wait for the commit."""

    def __init__(self, service: ClusterService, leader: StreamLeader) -> None:
        self.service = service
        self.leader = leader

    def group_written(
        self, handle: StreamHandle, chunk_id: int, dones: list[tuple[Done, int]]
    ) -> None:
        confirms = []
        refuses = []
        for done, code in dones:
            if code != ResponseCode.OK:
                done(code)
                continue
            confirms.append(_call(done, ResponseCode.OK))
            refuses.append(_refuse(done))
        effects = self.leader.written(
            chunk_id, handle.log.epoch, confirms, refuses, time.monotonic()
        )
        if effects:
            self.service._carry({self.leader.incarnation: effects})


def _lease_fence(leader: StreamLeader) -> Callable[[], None]:
    """The manifest-commit fence of a led stream (called from tiering threads): no
    commit once the leader stepped down or is past its confirm deadline."""

    def fence() -> None:
        if leader.stepped_down or not leader.state.may_confirm(time.monotonic()):
            raise DeposedError(
                f"{leader.incarnation}: epoch {leader.epoch} may no longer commit"
                f" ({leader.state.step_down_reason or 'lease deadline passed'})"
            )

    return fence


def _call(done: Done, code: int) -> Any:
    return lambda: done(code)


def _refuse(done: Done) -> Any:
    return lambda reason: done(ResponseCode.STREAM_NOT_AVAILABLE)


def _start_epoch(stream_log: StreamLog, epoch: int) -> int:
    """The epoch's first chunk (a tracking snapshot), fsynced: the leader counts it as
    written only once it is on disk."""
    chunk_id = stream_log.start_epoch(epoch)
    stream_log.sync_to_disk()
    return chunk_id


def _tail(handle: StreamHandle) -> Tail:
    point = handle.log.commit_point()
    if point.chunk_id == NO_CHUNK:
        return Tail(0, NO_CHUNK)
    return Tail(handle.log.max_epoch, point.chunk_id)


def cluster_metadata(
    service: ClusterService, vhost: str, names: Sequence[str]
) -> tuple[list[BrokerAddress], list[StreamMetadata]]:
    """A Metadata answer from the directory: each stream's leader (and replicas) with
    their advertised stream addresses; a stream without a live leader is
    STREAM_NOT_AVAILABLE (clients retry), never pointed at a lagging member."""
    refs: dict[str, int] = {}
    brokers: list[BrokerAddress] = []

    def ref(info: NodeInfo) -> int:
        if info.name not in refs:
            host, _, port = info.stream_address.rpartition(":")
            refs[info.name] = len(brokers)
            brokers.append(BrokerAddress(len(brokers), host, int(port)))
        return refs[info.name]

    streams = []
    for name in names:
        where = service.locate(vhost, name)
        if where.code != ResponseCode.OK or where.leader is None:
            streams.append(StreamMetadata(name, where.code, NO_LEADER, ()))
            continue
        leader = ref(where.leader)
        streams.append(
            StreamMetadata(name, ResponseCode.OK, leader, tuple(ref(r) for r in where.replicas))
        )
    return brokers, streams


NO_LEADER = 0xFFFF
