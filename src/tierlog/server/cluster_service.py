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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from tierlog.cluster.errors import (
    LeaderAliveError,
    NotAMemberError,
    NotLeaderError,
)
from tierlog.cluster.hub import ReplicationHub
from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.membership import ClusterDirectory, Leadership, NodeInfo, StreamMembers
from tierlog.cluster.new_streams import NeverLedStreams
from tierlog.cluster.node import (
    ClusterNode,
    DirectoryView,
    NodeLease,
    StreamLeader,
    register_stream,
)
from tierlog.cluster.state import (
    AppendTrackingSnapshot,
    CatchUp,
    CatchUpFailed,
    CaughtUp,
    Commit,
    Effect,
    Event,
    LeaseLost,
    LeaseRenewed,
    LeaseTiming,
    Phase,
    PromoteLearner,
    RequestAdopt,
    StepDown,
)
from tierlog.errors import ConfigError, TierlogError
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.log.config import LogConfig
from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog, StreamRecord
from tierlog.server.arguments import initial_cluster_size
from tierlog.server.cluster_gates import (
    LeaderGate,
    MemberEvents,
    StreamLocation,
    lease_fence,
    retrieved,
    start_epoch,
    tail_of_handle,
)
from tierlog.server.cluster_members import Followers, holds_unregistered_stream
from tierlog.server.cluster_reads import ClusterCommitView
from tierlog.server.deleted_streams import DeletedStreams
from tierlog.server.disk_trust import DiskTrust
from tierlog.server.member_changes import MemberChanges
from tierlog.server.member_disk import MemberDisk
from tierlog.server.member_reads import MEMBER_READ_MAX_BEHIND
from tierlog.server.tls import replication_contexts
from tierlog.storage.errors import (
    KeyDeletedError,
    LeaseHeldError,
    LeaseLostError,
    VersionConflictError,
)
from tierlog.storage.meta_store import MetaStore

if TYPE_CHECKING:
    from tierlog.server.broker import Broker, StreamHandle
    from tierlog.server.config import ServerConfig

log = get_logger("tierlog.server.cluster")
ACQUIRE_ATTEMPTS = 5  # acquisitions in a row while the record moves (a member's disk claim)


class LeadershipHooks(Protocol):
    """What a service that runs per-stream work on the leader (delayed delivery) needs:
    a say in which leaderless streams this node takes over (a stream and its companion
    stream led on one node), and word of a step-down before the stream is released."""

    def may_take_over(self, record: StreamRecord) -> bool: ...

    def stepping_down(self, handle: StreamHandle) -> None: ...


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
        self.read_views: dict[str, ClusterCommitView] = {}  # consumers' limit, led streams
        self.registered = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        # the lease keepalive never waits behind directory reads or acquisitions
        self._lease_thread = ThreadPoolExecutor(1, thread_name_prefix="cluster-lease")
        self._directory_threads = ThreadPoolExecutor(2, thread_name_prefix="cluster-directory")
        self.stepped_down = 0
        self.acquired = 0
        self.hub: ReplicationHub | None = None
        self.followers: Followers | None = None
        self.member_disk: MemberDisk | None = None  # followed streams' local retention
        self.replication_port = 0
        self._acquired: dict[str, tuple[Leadership, float]] = {}  # by the scan, to open
        # streams this node stepped down from lately: it lets the other voters take them
        # first (a leader cut from its members would otherwise win the leaderless record
        # back at once, again and again, while the majority side waits)
        self._held_off: dict[str, float] = {}
        self.never_led = NeverLedStreams(self.timing.ttl)
        self._ready: dict[str, asyncio.Future[None]] = {}  # elections in progress
        self._new_voters: dict[tuple[str, str], tuple[str, ...]] = {}  # streams being created
        self._effect_tasks: set[asyncio.Task[Any]] = set()
        self.leadership_hooks: LeadershipHooks | None = None
        self.replicas_serve = False  # members serve consumers (``server.member_reads``)
        self.member_refusal: Callable[[str], str | None] = lambda _: None  # member_reads
        self.changes = MemberChanges(self)
        self.deleted = DeletedStreams(self, config.storage.streams_dir)
        self.disks = DiskTrust(c.node, self.directory, config.storage.streams_dir, self._directory)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self, broker: Broker, stream_address: str, admin_address: str) -> None:
        """Attach to the broker and register in the background (an earlier run's lease
        may still be held for up to one TTL after a crash)."""
        self.broker = broker
        broker.placement = self
        replication_address = self.cluster.replication_address
        if self.cluster.secret:
            accepting, dialing = replication_contexts(self.cluster)
            self.hub = ReplicationHub(
                self.name,
                self.cluster.secret.encode(),
                self._peer_address,
                heartbeat=1.0,
                server_ssl=accepting,
                client_ssl=dialing,
                max_incoming=self.cluster.max_incoming_links,
                handshake_timeout=self.cluster.handshake_timeout_seconds,
            )
            host = self.config.server.host
            self.replication_port = await self.hub.start(host, self.cluster.replication_port)
            self.followers = Followers(self.hub, self.config.storage.streams_dir)
            interval = self.config.tier.local_retention_interval_seconds
            self.member_disk = MemberDisk(
                self.followers, self.hub, interval, self.config.tier.min_free_disk_bytes
            )
            advertised = stream_address.rpartition(":")[0]
            replication_address = replication_address or f"{advertised}:{self.replication_port}"
        info = NodeInfo(
            self.name,
            self.cluster.stream_address or stream_address,
            self.cluster.admin_address or admin_address,
            replication_address,
        )
        self.lease = NodeLease(self.directory, info, self.timing)
        self._tasks.append(asyncio.create_task(self._run()))

    async def detach(self) -> None:
        """Before the broker closes its streams: stop scanning and following (the
        follower logs close on their writer lanes, which the broker shuts down)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.followers is not None:
            await self.followers.close()

    async def close(self) -> None:
        """After the broker closed its streams: stop replication, resign what this
        node led (a successor need not wait for the lease) and release the lease."""
        await self.detach()
        for task in list(self._effect_tasks):
            task.cancel()
        if self.hub is not None:
            await self.hub.stop()
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

    def _peer_address(self, node: str) -> tuple[str, int]:
        """A node's replication address from the last directory scan (``KeyError``
        while unknown: the hub retries)."""
        host, _, port = self.view.nodes[node].replication_address.rpartition(":")
        return host, int(port)

    async def _run(self) -> None:
        await self._register()
        self._tasks.append(asyncio.create_task(self._keepalive()))
        self._tasks.append(asyncio.create_task(self._timer()))
        self._tasks.append(asyncio.create_task(self._scan_loop()))
        if self.member_disk is not None:
            self._tasks.append(asyncio.create_task(self.member_disk.run()))

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
                if self.changes.retired:
                    continue  # retired: the lease was released for good
                await self._register()
                continue
            try:
                sent_at = await loop.run_in_executor(self._lease_thread, lease.renew)
            except LeaseLostError as exc:
                log.warning("cluster_lease_lost", node=self.name, error=str(exc))
                lease.lost()
                self.registered.clear()  # nothing may be acquired until registered again
                self._carry(self.node.broadcast(LeaseLost()))
                await self._register()
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
            self._repeat_adopt_requests()

    def _repeat_adopt_requests(self) -> None:
        """An election waits for a majority to adopt its epoch; members that had not
        opened the stream yet (a new stream) or were unreachable are asked again on
        every tick until the election ends (adopting is idempotent)."""
        if self.hub is None:
            return
        for incarnation, leader in self.node.leaders.items():
            if leader.state.phase is Phase.ADOPTING and incarnation in self.hub.led:
                others = tuple(m for m in leader.leadership.membership.members if m != self.name)
                self.hub.request_adopt(incarnation, leader.epoch, others)

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
        """Read the directory and the catalog once; follow the streams this node is a
        member of, take over leaderless streams it is a voter of, learn streams led
        elsewhere, drop deleted ones."""
        broker = self.broker
        assert broker is not None
        held = await self.deleted.held_here()  # before the catalog is read
        view, records = await self._directory(self._read)
        self.view = view
        await self.deleted.sweep(held, records)
        if not self.registered.is_set() or not broker.catalog_loaded.is_set():
            return
        await self.changes.refresh()
        by_incarnation = {r.incarnation: r for r in records}
        for record in records:
            if broker.get(record.vhost, record.name) is None:
                broker.led_elsewhere(record)
        for incarnation, place in view.streams.items():
            record = by_incarnation.get(incarnation)
            membership = place.record.membership
            if record is None or incarnation in self.handles:
                continue
            if self.name not in membership.members:
                continue
            if broker.busy(record.vhost, record.name):
                continue  # open, being created or being opened here right now
            try:
                if not await self.disks.admit(place.record, self._log_config(record)):
                    continue  # not the disk the stream trusts: neither votes nor leads
                if place.leader is None or place.leader.name == self.name:
                    # leaderless, or recorded as ours but not open here (an acquisition
                    # whose opening lost a race): take it (again, in a new epoch)
                    hooks = self.leadership_hooks
                    if (
                        membership.is_voter(self.name)
                        and not self.changes.retiring_here
                        and not self._holding_off(incarnation)
                        and self.never_led.may_take(
                            incarnation, place.record.epoch, time.monotonic()
                        )
                        and (hooks is None or hooks.may_take_over(record))
                    ):
                        await self._take_over(record)
                else:
                    await self._follow(record, place.leader.name, place.record.epoch)
            except (TierlogError, OSError) as exc:
                log.error("cluster_member_action_failed", stream=record.name, error=repr(exc))
        known = {(r.vhost, r.name) for r in records}
        for opening in broker.opening_streams():
            key = (opening.record.vhost, opening.record.name)
            if key not in known:
                broker.forget_elsewhere(*key)
        self.disks.keep(view.streams)
        await self.changes.after_scan(view)

    async def _follow(self, record: StreamRecord, leader: str, epoch: int) -> None:
        if self.followers is None:
            log.warning("cluster_cannot_follow", stream=record.name, reason="no cluster.secret")
            return
        assert self.broker is not None
        lane = self.broker.writers.lane(record.name)
        await self.followers.follow(record, self._log_config(record), lane, leader, epoch)

    async def _take_over(self, record: StreamRecord) -> None:
        """Acquire a leaderless stream (above every epoch this node's copy has seen),
        then close the follower log and open the stream as its leader."""
        assert self.broker is not None
        node_lease = self.lease.lease if self.lease is not None else None
        if node_lease is None:
            return
        incarnation = record.incarnation
        seen = self.followers.seen_epochs(incarnation) if self.followers else ()
        disk = await self._directory(self.disks.claim_for, incarnation, self._log_config(record))
        sent_at = time.monotonic()
        try:
            leadership: Leadership = await self._directory(
                self.directory.acquire_leadership, incarnation, self.name, node_lease, seen, disk
            )
        except (LeaderAliveError, NotAMemberError, VersionConflictError, KeyDeletedError):
            return  # another voter got it first (the next scan follows it)
        except LeaseLostError:
            return  # our node lease expired unnoticed: the keepalive registers again
        if self.followers is not None:
            await self.followers.stop(incarnation)
        self._acquired[incarnation] = (leadership, sent_at)
        try:
            await self.broker.take_over(record)
        finally:
            self._acquired.pop(incarnation, None)

    def _log_config(self, record: StreamRecord) -> LogConfig:
        settings = record.settings
        return self.config.log.log_config(
            settings.max_segment_bytes,
            settings.max_segment_chunks,
            self.config.server.frame_max,
            settings.sync,
            settings.filter_size,
        )

    def _read(self) -> tuple[DirectoryView, list[StreamRecord]]:
        return DirectoryView.read(self.directory), self.catalog.list()

    async def _directory(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._directory_threads, fn, *args)

    # -- placement (called by the broker) ---------------------------------------------
    async def should_open(self, record: StreamRecord) -> bool:
        await self.registered.wait()
        await self.changes.refresh(max_age=self.cluster.scan_interval_seconds)
        if self.changes.retiring_here:
            return False  # a retiring node leads nothing, not even after a restart
        existing = await self._directory(self.directory.stream, record.incarnation)
        if existing is None:  # from before the cluster: led first where its log is
            return holds_unregistered_stream(self.config.storage.streams_dir, record)
        if not existing.membership.is_voter(self.name):
            return False  # a learner follows; a non-member is pointed at the leader
        if not await self._directory(self.disks.may_lead, existing):
            return False  # not the disk the stream trusts (the scan records it lost)
        place = (await self._directory(DirectoryView.read, self.directory)).streams.get(
            record.incarnation
        )
        if place is not None and place.leader is not None and place.leader.name != self.name:
            return False
        # leaderless or recorded as ours: opened here only where the scan would take it over
        # (a system stream only with its stream, also at a whole-cluster restart)
        if self._holding_off(record.incarnation):
            return False
        hooks = self.leadership_hooks
        return hooks is None or hooks.may_take_over(record)

    def _holding_off(self, incarnation: str) -> bool:
        until = self._held_off.get(incarnation)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._held_off[incarnation]
        return False

    def not_available(self, vhost: str, name: str) -> bool:
        return False  # streams this node knows of are listed by the broker as led elsewhere

    async def leading(self, handle: StreamHandle) -> None:
        """Lead a stream whose log was just opened here: acquire it (unless the
        directory scan already did), win the election among its members (adopt, catch
        up), begin the epoch with a tracking-snapshot chunk, and only then let clients
        in, with confirms gated on the cluster commit."""
        await self.registered.wait()
        incarnation = handle.record.incarnation
        disk_epoch = handle.log.max_epoch
        acquired = self._acquired.pop(incarnation, None)
        if acquired is None:
            leadership, sent_at = await self._acquire(handle)
        else:
            leadership, sent_at = acquired
        others = tuple(m for m in leadership.membership.members if m != self.name)
        if others and self.hub is None:
            await self._directory(self.directory.resign, leadership)
            raise NotLeaderError(f"{handle.name}: several members need cluster.secret")
        held = self.lease.lease if self.lease is not None else None
        if held is None or held.epoch != leadership.lease_epoch:
            # the lease it was acquired on was lost (and maybe taken again) meanwhile:
            # renewals of another lease must never keep this leadership alive
            with contextlib.suppress(TierlogError, OSError):
                await self._directory(self.directory.resign, leadership)
            raise NotLeaderError(
                f"{handle.name}: node lease epoch {leadership.lease_epoch} lost while acquiring"
            )
        leader = self.node.lead(leadership, tail_of_handle(handle), sent_at)
        self.handles[incarnation] = handle
        self._limit_reads(handle)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(retrieved)
        self._ready[incarnation] = ready
        self.acquired += 1
        if others:
            assert self.hub is not None
            self.hub.lead(
                incarnation,
                handle.log,
                leadership.epoch,
                others,
                MemberEvents(self, incarnation),
                executor=handle.executor,
            )
        try:
            self._apply(incarnation, leader.start(time.monotonic()))
            await asyncio.wait_for(asyncio.shield(ready), 2 * self.timing.ttl)
        except BaseException as exc:
            self._step_down(incarnation, f"election did not finish: {exc!r}", release=False)
            if isinstance(exc, NotLeaderError | asyncio.CancelledError):
                raise
            raise NotLeaderError(f"{handle.name}: {exc!r}") from exc
        finally:
            self._ready.pop(incarnation, None)
        handle.confirm_gate = LeaderGate(self, leader)
        handle.commit_fence = lease_fence(leader)
        handle.cluster_commit = lambda: leader.committed
        log.info(
            "cluster_stream_leading",
            stream=handle.name,
            incarnation=incarnation,
            epoch=leadership.epoch,
            disk_epoch=disk_epoch,
            members=",".join(leadership.membership.members),
        )

    async def _acquire(self, handle: StreamHandle) -> tuple[Leadership, float]:
        node_lease = self.lease.lease if self.lease is not None else None
        if node_lease is None:
            raise NotLeaderError(f"{handle.name}: this node holds no lease right now")
        incarnation = handle.record.incarnation
        voters = self._new_voters.pop((handle.vhost, handle.name), (self.name,))
        try:
            await self._directory(register_stream, self.directory, incarnation, voters)
            for attempt in range(ACQUIRE_ATTEMPTS):
                disk = await self._directory(self.disks.claim_for, incarnation)
                sent_at = time.monotonic()
                try:
                    leadership: Leadership = await self._directory(
                        self.directory.acquire_leadership,
                        incarnation,
                        self.name,
                        node_lease,
                        (handle.log.max_epoch, handle.log.read_member_epoch()),
                        disk,
                    )
                    return leadership, sent_at
                except VersionConflictError:  # e.g. a member claimed its disk on the new
                    if attempt + 1 == ACQUIRE_ATTEMPTS:  # stream: re-read, decide again
                        raise
            raise AssertionError("unreachable")
        except (
            LeaderAliveError,
            NotAMemberError,
            VersionConflictError,
            KeyDeletedError,
            LeaseLostError,
        ) as exc:
            raise NotLeaderError(f"{handle.name}: {exc}") from exc

    # -- effects --------------------------------------------------------------------------
    def _feed(self, incarnation: str, event: Event) -> None:
        leader = self.node.leaders.get(incarnation)
        if leader is not None and not leader.stepped_down:
            self._apply(incarnation, leader.handle(event, time.monotonic()))

    def _apply(self, incarnation: str, effects: list[Effect]) -> None:
        """Carry out a led stream's effects (on the event loop)."""
        for effect in effects:
            if isinstance(effect, StepDown):
                self._step_down(incarnation, effect.reason)
                return
            leader = self.node.leaders.get(incarnation)
            handle = self.handles.get(incarnation)
            if leader is None or handle is None:
                return
            if isinstance(effect, RequestAdopt):
                if effect.members and self.hub is not None:
                    self.hub.request_adopt(incarnation, effect.epoch, effect.members)
            elif isinstance(effect, AppendTrackingSnapshot):
                self._spawn(self._begin_epoch(leader, handle, effect.epoch))
            elif isinstance(effect, CatchUp):
                self._spawn(self._catch_up(leader, effect))
            elif isinstance(effect, Commit):
                if self.hub is not None and incarnation in self.hub.led:
                    self.hub.set_commit(incarnation, effect.chunk_id)
                view = self.read_views.get(incarnation)
                if view is not None and view.set_limit(effect.chunk_id):
                    handle.notifier.notify()
                if handle.tier_poke is not None:
                    handle.tier_poke()
            elif isinstance(effect, PromoteLearner):
                self._spawn(self.changes.promote(leader, effect))

    def _limit_reads(self, handle: StreamHandle) -> None:
        """Consumers of a led stream read up to the cluster commit, not the local fsync
        (an ``ack = remote`` stream's view is stricter already: the remote tier holds
        committed chunks only)."""
        from tierlog.server.tiered_source import StreamChunkSource

        if handle.remote_ack is not None:
            return
        view = ClusterCommitView(handle.log)
        self.read_views[handle.record.incarnation] = view
        source = handle.source
        assert isinstance(source, StreamChunkSource)
        source.limit_reads(view)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._effect_tasks.add(task)
        task.add_done_callback(self._effect_tasks.discard)

    async def _begin_epoch(self, leader: StreamLeader, handle: StreamHandle, epoch: int) -> None:
        incarnation = leader.incarnation
        try:
            chunk_id = await asyncio.get_running_loop().run_in_executor(
                handle.executor, start_epoch, handle.log, epoch
            )
        except (TierlogError, OSError) as exc:
            self._step_down(incarnation, f"cannot begin epoch {epoch}: {exc!r}")
            return
        self._apply(incarnation, leader.written(chunk_id, epoch, [], [], time.monotonic()))
        if leader.stepped_down:
            return
        if self.hub is not None and incarnation in self.hub.led:
            self.hub.serve(incarnation)
        ready = self._ready.get(incarnation)
        if ready is not None and not ready.done():
            ready.set_result(None)

    async def _catch_up(self, leader: StreamLeader, effect: CatchUp) -> None:
        assert self.hub is not None
        target = (effect.tail.epoch, effect.tail.chunk_id)
        try:
            epoch, chunk_id = await self.hub.catch_up(
                leader.incarnation, effect.source, target, give_up_after=self.timing.ttl
            )
        except Exception as exc:
            self._feed(leader.incarnation, CatchUpFailed(repr(exc)))
            return
        self._feed(leader.incarnation, CaughtUp(Tail(epoch, chunk_id)))

    def _carry(self, effects: dict[str, list[Effect]]) -> None:
        for incarnation, stream_effects in effects.items():
            self._apply(incarnation, stream_effects)

    def _step_down(self, incarnation: str, reason: str, release: bool = True) -> None:
        leader = self.node.forget(incarnation)
        handle = self.handles.pop(incarnation, None)
        self.read_views.pop(incarnation, None)
        if handle is not None and self.leadership_hooks is not None:
            self.leadership_hooks.stepping_down(handle)
        if leader is not None and not leader.stepped_down:
            leader.state.handle(LeaseLost(), time.monotonic())  # refuse what waits
            leader.apply_local([StepDown(reason)])
        if self.hub is not None:
            self.hub.unlead(incarnation)
        ready = self._ready.pop(incarnation, None)
        if ready is not None and not ready.done():
            ready.set_exception(NotLeaderError(reason))
        if leader is None:
            return
        self.stepped_down += 1
        log.warning("cluster_stream_step_down", incarnation=incarnation, reason=reason)
        if len(leader.leadership.membership.voters) > 1:
            self._held_off[incarnation] = time.monotonic() + self.timing.ttl
        if handle is not None and self.broker is not None:
            self._spawn(self._release(handle if release else None, leader, reason))

    async def _release(
        self, handle: StreamHandle | None, leader: StreamLeader, reason: str
    ) -> None:
        assert self.broker is not None
        if handle is not None:
            await self.broker.release(handle, reason)
        with contextlib.suppress(TierlogError, OSError):
            await self._directory(self.directory.resign, leader.leadership)

    # -- what clients see ---------------------------------------------------------------
    def cluster_size(self, arguments: Mapping[str, str]) -> int:
        """The replication factor asked for at creation (``server.arguments``)."""
        return initial_cluster_size(arguments, self.cluster.initial_cluster_size)

    def check_create(self, vhost: str, name: str, arguments: Mapping[str, str]) -> None:
        """Whether a new stream of that replication factor can be run now: this node
        and the first other live nodes by name become the voters. Refused (typed) when
        it cannot. Only for a stream that does not exist: declaring an existing one
        answers STREAM_ALREADY_EXISTS whatever the cluster's state."""
        size = self.cluster_size(arguments)
        if size > 1 and self.hub is None:
            raise ConfigError(
                f"initial-cluster-size {size} needs replication: set cluster.secret on every node"
            )
        if self.changes.retiring_here:
            raise ConfigError(f"node {self.name} is retiring: create the stream on another node")
        others = sorted(
            n for n in self.view.nodes if n != self.name and n not in self.changes.retiring
        )
        if size - 1 > len(others):
            raise ConfigError(
                f"initial-cluster-size {size}: only {len(others) + 1} live nodes in the cluster"
            )
        self._new_voters[(vhost, name)] = (self.name, *others[: size - 1])

    def locate(self, vhost: str, name: str) -> StreamLocation:
        """Leader and replicas of a stream as Metadata reports them. Replicas are listed
        when members serve consumers (clients such as rstream read from a listed replica
        when there is one), which needs the remote tier for what a member lacks."""
        where = self._locate(vhost, name)
        if not self.replicas_serve:
            return StreamLocation(where.code, where.leader, ())
        return where

    def _locate(self, vhost: str, name: str) -> StreamLocation:
        broker = self.broker
        assert broker is not None
        handle = broker.get(vhost, name)
        me = self.lease.info if self.lease is not None else None
        if handle is not None and handle.record.incarnation in self.handles and me is not None:
            leader = self.node.leaders.get(handle.record.incarnation)
            members = leader.leadership.membership.members if leader is not None else ()
            # only members that follow this epoch (they wrote something we sent), not far
            # behind (``member_reads``): one waking up, truncating or stuck would refuse
            replicas = tuple(
                self.view.nodes[m]
                for m in members
                if m != self.name
                and m in self.view.nodes
                and leader is not None
                and leader.state.written(m) != NO_CHUNK
                and leader.committed - leader.state.written(m) <= MEMBER_READ_MAX_BEHIND
            )
            return StreamLocation(ResponseCode.OK, me, replicas)
        opening = broker.opening(vhost, name)
        if opening is None:
            return StreamLocation(ResponseCode.STREAM_DOES_NOT_EXIST, None, ())
        place = self.view.streams.get(opening.record.incarnation)
        if place is None or place.leader is None or place.leader.name == self.name:
            return StreamLocation(ResponseCode.STREAM_NOT_AVAILABLE, None, ())
        return StreamLocation(ResponseCode.OK, place.leader, self._replicas(place.record))

    def _replicas(self, record: StreamMembers) -> tuple[NodeInfo, ...]:
        """The members but the leader; this node only while it serves consumers."""
        return tuple(
            self.view.nodes[m]
            for m in record.membership.members
            if m != record.leader
            and m in self.view.nodes
            and (m != self.name or self.member_refusal(record.incarnation) is None)
        )

    async def stream_deleted(self, record: StreamRecord) -> None:
        await self.deleted.deleted_here(record.incarnation)

    def leading_now(self, incarnation: str) -> tuple[StreamHandle, StreamLeader] | None:
        """The stream's handle and leadership when this node leads it and its election
        has ended (clients are let in); None otherwise."""
        handle = self.handles.get(incarnation)
        leader = self.node.leaders.get(incarnation)
        if handle is None or leader is None or leader.stepped_down or handle.closed:
            return None
        if handle.confirm_gate is None:
            return None  # elected, not leading yet
        return handle, leader

    def leader_elsewhere(self, incarnation: str) -> str | None:
        """The node that leads the stream by the last directory scan, when it is another
        node and replication links exist to ask it; None otherwise."""
        place = self.view.streams.get(incarnation)
        if self.hub is None or place is None or place.leader is None:
            return None
        return None if place.leader.name == self.name else place.leader.name

    def status(self) -> dict[str, Any]:
        return {
            "node": self.name,
            "registered": self.registered.is_set(),
            "leading": sorted(self.handles),
            "acquired": self.acquired,
            "stepped_down": self.stepped_down,
            "live_nodes": sorted(self.view.nodes),
            **self.disks.status(),
            **self.changes.status(),
        }
