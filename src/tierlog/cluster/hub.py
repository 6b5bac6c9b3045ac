"""The replication hub of one node: every stream it leads or follows, over one
authenticated connection per pair of nodes.

Public API (what the server's cluster integration calls; all from the event loop)::

    hub = ReplicationHub(node="n1", secret=b"cluster secret", peers=resolve)
    port = await hub.start("127.0.0.1", 0)       # listen for other nodes' links
    ...
    # leading a stream (after the MetaStore acquisition and persisting the epoch):
    hub.lead(stream, log, epoch, members=("n2", "n3"), listener=leader_listener,
             executor=lane)
    hub.request_adopt(stream, epoch, ("n2", "n3"))  # LeaderState's RequestAdopt
    hub.serve(stream)                              # LEADING: answer members' fetches
    hub.set_commit(stream, chunk_id)               # LeaderState's Commit: tell members
    tail = await hub.catch_up(stream, source="n2", tail=(epoch, chunk_id))  # CatchUp
    hub.unlead(stream)

    # following a stream (a member; also answers ADOPT from any newer leader):
    hub.follow(stream, log, leader="n1", epoch=epoch, executor=lane,
               on_commit=lambda chunk_id: ...)    # cluster commit visible here
    hub.unfollow(stream)

    # any node: the committed tail of a stream led elsewhere (None: no answer in time)
    tail = await hub.query_tail(stream, leader="n1", reference="", timeout=1.0)
    hub.tail_answerer = answer   # how this node answers such queries for what it leads
    # any node: a consumer's StoreOffset / QueryOffset sent to the leader (None: no answer)
    answer = await hub.forward_offset(stream, leader="n1", reference="c", store=42)
    hub.offset_answerer = answer_offsets  # how this node answers them for what it leads

    await hub.stop()

``peers(node) -> (host, port)`` resolves a node name to its replication address (the
node's ``NodeInfo`` in the cluster directory). ``executor`` is the stream's writer
lane (``concurrency.SerialPool``): every log call of a stream runs there, so the
stream's log keeps one writer thread at a time; without one the hub uses its own
bounded pool. ``LeaderListener`` (``fetch_server``) receives, on the event loop, what members send:
``member_written(member, chunk_id, epoch)`` (feed ``MemberAcked``),
``member_adopted(member, epoch, highest, tail_epoch, tail_chunk_id)`` (feed
``EpochAdopted``), ``member_refused(member, highest_epoch)`` (feed ``EpochRefused``).

Written offset: a member reports ``WRITTEN`` only after ``StreamLog.sync_to_disk()``;
on the leader, ``StreamLog.durable_point()`` (or a commit listener in ``fsync`` mode)
gives the local written chunk for ``LocalWritten``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

from tierlog.cluster.errors import LinkAuthError
from tierlog.cluster.fetch_server import LeaderListener, LedStream, answer, log_history
from tierlog.cluster.link import (
    HANDSHAKE_TIMEOUT,
    FileCache,
    Link,
    LinkTraffic,
    handshake_acceptor,
    handshake_dialer,
)
from tierlog.cluster.log_history import NO_CHUNK, Tail
from tierlog.cluster.offset_requests import OffsetAnswerer, OffsetRequests
from tierlog.cluster.replica_runner import (
    ByteBudget,
    CatchUpRun,
    FollowedStream,
    ReplicaCounts,
    ReplicaStatus,
)
from tierlog.cluster.tail_queries import TailAnswerer, TailQueries
from tierlog.concurrency import SerialPool
from tierlog.formats import replication as wire
from tierlog.formats.errors import FormatError, InvalidSizeError
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger

log = get_logger(__name__)

DIAL_LOG_EVERY = 12
"""A failing dial is logged at the first attempt of a streak, then every this many."""

PeerResolver = Callable[[str], tuple[str, int]]
_HANDSHAKE_ERRORS = (TimeoutError, LinkAuthError, FormatError, OSError, asyncio.IncompleteReadError)
MAX_PENDING_FRAMES = 10_000  # per peer while its link is being dialed
# Incoming connections open at once, authenticated links included. A cluster has a
# handful of nodes, each keeping one link to us (two for a moment while both dial);
# whoever reaches the port beyond this is refused at accept, before a byte is read.
MAX_INCOMING_CONNECTIONS = 64
# Why incoming connections were refused (``refusals`` counts each; exported by reason).
REFUSAL_REASONS = (
    "connection_cap",
    "auth",
    "oversized",
    "malformed",
    "timeout",
    "closed",
)

__all__ = ["LeaderListener", "PeerResolver", "ReplicationHub"]


class ReplicationHub:
    """All replication of one node (see the module docstring)."""

    def __init__(
        self,
        node: str,
        secret: bytes,
        peers: PeerResolver,
        *,
        workers: int = 4,
        fetch_bytes: int = 8 << 20,
        max_open_files: int = 1024,
        max_buffered_bytes: int = 256 << 20,
        heartbeat: float = 2.0,
        fetch_timeout: float | None = None,
        retry_delay: float = 0.2,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        max_incoming: int = MAX_INCOMING_CONNECTIONS,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        self.node = node
        self._secret = secret
        self._peers = peers
        self._pool = SerialPool(workers, "replication")
        self._lanes: dict[str, Executor] = {}
        self.fetch_bytes = min(fetch_bytes, wire.MAX_FRAME_BYTES - 4096)
        self.files = FileCache(max_open_files)
        self.budget = ByteBudget(max_buffered_bytes)
        self.heartbeat = heartbeat
        self.fetch_timeout = fetch_timeout if fetch_timeout is not None else 4 * heartbeat
        self.retry_delay = retry_delay
        self._server_ssl = server_ssl
        self._client_ssl = client_ssl
        self.max_incoming = max_incoming
        self.handshake_timeout = handshake_timeout
        self.incoming = 0  # incoming connections open now (handshaking or linked)
        self.refusals: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self._server: asyncio.Server | None = None
        self.links: dict[str, Link] = {}
        self._pending: dict[str, deque[wire.Frame]] = {}
        self._dialing: dict[str, asyncio.Task[None]] = {}
        self.followed: dict[str, FollowedStream] = {}
        self.led: dict[str, LedStream] = {}
        self._catch_ups: dict[str, CatchUpRun] = {}
        self.tails = TailQueries(self.send)
        self.offsets = OffsetRequests(self.send, self._link_open)
        self.auth_failures = 0
        self.malformed_frames = 0
        self.send_failures = 0  # links closed because a write failed
        self.traffic: dict[str, LinkTraffic] = {}  # by peer, over all its links
        self._unfollowed = ReplicaCounts()  # counts of the streams no longer followed
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Listen for other nodes' links; returns the bound port."""
        # With TLS, asyncio runs the TLS handshake (bounded by the same deadline) before
        # ``_accept``; a failed one never becomes a connection here, so it is neither
        # counted under the cap nor as a refusal. (Starting TLS inside ``_accept``
        # instead races the peer's ClientHello into the plain stream's buffer.)
        self._server = await asyncio.start_server(
            self._accept,
            host,
            port,
            ssl=self._server_ssl,
            ssl_handshake_timeout=self.handshake_timeout if self._server_ssl else None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self._closing = True
        for stream in list(self.followed):
            self.unfollow(stream)
        for stream in list(self.led):
            self.unlead(stream)
        for run in list(self._catch_ups.values()):
            run.close()
        for task in list(self._dialing.values()):
            task.cancel()
        for link in list(self.links.values()):
            link.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self.files.close()
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)

    def _executor(self, stream: str, executor: Executor | None) -> Executor:
        if executor is not None:
            return executor
        lane = self._lanes.get(stream)
        if lane is None:
            lane = self._lanes[stream] = self._pool.lane(stream)
        return lane

    # -- following -------------------------------------------------------------------
    def follow(
        self,
        stream: str,
        log: StreamLog,
        leader: str | None = None,
        epoch: int | None = None,
        *,
        executor: Executor | None = None,
        on_commit: Callable[[int], None] | None = None,
        on_truncate: Callable[[int], None] | None = None,
    ) -> None:
        """Be a member of ``stream`` with ``log``: answer ``ADOPT`` from any newer
        leader and replicate from it; with ``leader`` and ``epoch`` (the directory's
        current leader), start fetching from it now. ``on_commit(chunk_id)``: the
        cluster commit offset as this member may show it (never past its log);
        ``on_truncate(keep_through)``: the log was cut after that chunk."""
        followed = self.followed.get(stream)
        if followed is None:
            followed = FollowedStream(
                stream,
                log,
                self._executor(stream, executor),
                self.send,
                on_commit=on_commit,
                fetch_bytes=self.fetch_bytes,
                fetch_timeout=self.fetch_timeout,
                retry_delay=self.retry_delay,
                budget=self.budget,
            )
            self.followed[stream] = followed
        elif on_commit is not None:
            followed.on_commit = on_commit
        if on_truncate is not None:
            followed.on_truncate = on_truncate
        if leader is not None and epoch is not None:
            followed.follow(leader, epoch)

    def unfollow(self, stream: str) -> None:
        followed = self.followed.pop(stream, None)
        if followed is not None:
            followed.close()
            self._unfollowed.add(followed)

    def replica_status(self, stream: str) -> ReplicaStatus | None:
        """How this member replicates ``stream`` (state, last error, written and commit
        offsets); None when it does not follow it."""
        followed = self.followed.get(stream)
        return None if followed is None else followed.status()

    def replica_counts(self) -> ReplicaCounts:
        """Every followed stream's counters summed, those no longer followed included."""
        total = dataclasses.replace(self._unfollowed)
        for followed in self.followed.values():
            total.add(followed)
        return total

    # -- leading ---------------------------------------------------------------------
    def lead(
        self,
        stream: str,
        log: StreamLog,
        epoch: int,
        members: tuple[str, ...],
        listener: LeaderListener,
        *,
        executor: Executor | None = None,
    ) -> None:
        """Lead ``stream`` in ``epoch`` (adopting phase: members' fetches are refused
        as "not serving yet" until ``serve``). Replaces a follower role."""
        self.unfollow(stream)
        old = self.led.pop(stream, None)
        if old is not None:
            old.close()
        self._executor(stream, executor)
        self.led[stream] = LedStream(stream, log, epoch, members, listener, self.heartbeat)

    def request_adopt(self, stream: str, epoch: int, members: tuple[str, ...]) -> None:
        """Send ``ADOPT`` in ``epoch`` to ``members`` (answers reach the listener)."""
        for member in members:
            if member != self.node:
                self.send(member, wire.Adopt(stream, epoch))

    def serve(self, stream: str) -> None:
        """The election is over (leading): answer members' fetches from now on."""
        led = self.led[stream]
        led.serving = True
        led.wake()

    def wake(self, stream: str) -> None:
        """Chunks were written to a led stream: answer parked fetches now (commit
        listeners do this too after each local commit)."""
        led = self.led.get(stream)
        if led is not None:
            led.wake()

    def set_commit(self, stream: str, chunk_id: int) -> None:
        """LeaderState's ``Commit``: tell every member (and carry it in answers)."""
        led = self.led[stream]
        if chunk_id <= led.commit:
            return
        led.commit = chunk_id
        for member in led.members:
            link = self.links.get(member)
            if member != self.node and link is not None and not link.closed:
                link.send(wire.Commit(stream, led.epoch, chunk_id))

    def unlead(self, stream: str) -> None:
        led = self.led.pop(stream, None)
        if led is not None:
            led.close()
        run = self._catch_ups.pop(stream, None)
        if run is not None:
            run.close()

    async def catch_up(
        self, stream: str, source: str, tail: tuple[int, int], *, give_up_after: float = 30.0
    ) -> tuple[int, int]:
        """LeaderState's ``CatchUp``: take ``source``'s log up to ``tail`` (epoch,
        chunk id) into our own, cutting our divergent suffix first; returns our new
        tail. Raises ``CatchUpError`` (feed ``CatchUpFailed``)."""
        led = self.led[stream]
        run = CatchUpRun(
            stream,
            led.log,
            self._executor(stream, None),
            self.send,
            source=source,
            epoch=led.epoch,
            target=Tail(*tail),
            fetch_bytes=self.fetch_bytes,
            fetch_timeout=self.fetch_timeout,
            retry_delay=self.retry_delay,
            give_up_after=give_up_after,
        )
        self._catch_ups[stream] = run
        try:
            result = await run.done
        finally:
            if self._catch_ups.get(stream) is run:
                del self._catch_ups[stream]
        return (result.epoch, result.chunk_id)

    # -- committed tails -------------------------------------------------------------
    async def query_tail(
        self, stream: str, leader: str, reference: str = "", *, timeout: float = 1.0
    ) -> wire.Tail | None:
        """Ask ``leader`` for the stream's committed tail (``cluster.tail_queries``)."""
        return await self.tails.ask(stream, leader, reference, timeout)

    @property
    def tail_answerer(self) -> TailAnswerer | None:
        return self.tails.answerer

    @tail_answerer.setter
    def tail_answerer(self, answerer: TailAnswerer | None) -> None:
        self.tails.answerer = answerer

    # -- consumer offsets ------------------------------------------------------------
    async def forward_offset(
        self, stream: str, leader: str, reference: str, store: int | None, *, timeout: float
    ) -> wire.Offset | None:
        """Send a consumer's StoreOffset (``store``) or QueryOffset (None) to ``leader``
        (``cluster.offset_requests``)."""
        return await self.offsets.ask(stream, leader, reference, store, timeout)

    @property
    def offset_answerer(self) -> OffsetAnswerer | None:
        return self.offsets.answerer

    @offset_answerer.setter
    def offset_answerer(self, answerer: OffsetAnswerer | None) -> None:
        self.offsets.answerer = answerer

    def _link_open(self, peer: str) -> bool:
        link = self.links.get(peer)
        return link is not None and not link.closed

    # -- frames ----------------------------------------------------------------------
    def _on_frame(self, link: Link, frame: wire.Frame) -> None:
        peer = link.peer
        if isinstance(frame, wire.Hello | wire.Challenge | wire.Proof):
            log.warning("replication_unexpected_handshake_frame", peer=peer)
            self.malformed_frames += 1
            link.close()
            return
        if isinstance(frame, wire.TailQuery | wire.Tail):
            self.tails.on_frame(link, frame)
            return
        if isinstance(frame, wire.OffsetStore | wire.OffsetQuery | wire.Offset):
            self.offsets.on_frame(link, frame)
            return
        stream = frame.stream
        if isinstance(frame, wire.Fetch):
            self._on_fetch(link, frame)
            return
        if isinstance(frame, wire.Adopted | wire.Written):
            led = self.led.get(stream)
            if led is None:
                return
            if isinstance(frame, wire.Written):
                led.listener.member_written(peer, frame.chunk_id, frame.epoch)
            elif frame.accepted:
                led.listener.member_adopted(
                    peer, frame.epoch, frame.highest_epoch, frame.tail_epoch, frame.tail_chunk_id
                )
            else:
                led.listener.member_refused(peer, frame.highest_epoch)
            return
        run = self._catch_ups.get(stream)
        if run is not None and peer == run.leader and not isinstance(frame, wire.Adopt):
            run.deliver(peer, frame)
            return
        led = self.led.get(stream)
        if led is not None:
            if isinstance(frame, wire.Refused):
                if frame.code is wire.RefusalCode.STALE_EPOCH:
                    led.listener.member_refused(peer, frame.highest_epoch)
                elif frame.code is wire.RefusalCode.UNKNOWN_STREAM and not led.serving:
                    # the member's node has not registered the stream yet (starting up):
                    # ask it to adopt again a little later, while the election runs
                    asyncio.get_running_loop().call_later(
                        5 * self.retry_delay, self._adopt_again, stream, led, peer
                    )
            elif frame.epoch > led.epoch:
                led.listener.member_refused(peer, frame.epoch)  # a newer leader exists
            return
        followed = self.followed.get(stream)
        if followed is not None:
            followed.deliver(peer, frame)
        elif not isinstance(frame, wire.Refused):
            link.send(
                wire.Refused(
                    stream,
                    frame.epoch,
                    wire.RefusalCode.UNKNOWN_STREAM,
                    0,
                    f"{self.node} holds no member of {stream}",
                )
            )

    def _adopt_again(self, stream: str, led: LedStream, member: str) -> None:
        if self.led.get(stream) is led and not led.serving and not led.closed:
            self.send(member, wire.Adopt(stream, led.epoch))

    def _on_fetch(self, link: Link, fetch: wire.Fetch) -> None:
        led = self.led.get(fetch.stream)
        if led is not None:
            led.on_fetch(link, fetch)
            return
        followed = self.followed.get(fetch.stream)
        if followed is not None and followed.serving_epoch() == fetch.epoch:
            # a new leader of the epoch we adopted takes our log (its catch-up)
            answer(link, fetch.stream, followed.log, fetch.epoch, NO_CHUNK, fetch)
            return
        link.send(
            wire.Refused(
                fetch.stream,
                fetch.epoch,
                wire.RefusalCode.NOT_LEADER,
                0,
                f"{self.node} does not lead {fetch.stream}",
            )
        )

    # -- links -----------------------------------------------------------------------
    def send(self, peer: str, frame: wire.Frame) -> None:
        """Send ``frame`` to ``peer``, dialing it first if there is no link (frames
        wait, up to a bound, while it is being dialed)."""
        if self._closing:
            return
        link = self.links.get(peer)
        if link is not None and not link.closed:
            link.send(frame)
            return
        pending = self._pending.setdefault(peer, deque(maxlen=MAX_PENDING_FRAMES))
        pending.append(frame)
        if peer not in self._dialing:
            self._dialing[peer] = asyncio.create_task(self._dial(peer), name=f"dial-{peer}")

    async def _dial(self, peer: str) -> None:
        try:
            delay = self.retry_delay
            failures = 0
            while not self._closing and self._pending.get(peer):
                try:
                    host, port = self._peers(peer)
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(host, port, ssl=self._client_ssl),
                        self.handshake_timeout,
                    )
                except (TimeoutError, OSError, KeyError) as exc:
                    # logged at the first failure of a streak, then every
                    # ``DIAL_LOG_EVERY``th (about once a minute at the 5 s retry pause)
                    if failures % DIAL_LOG_EVERY == 0:
                        if isinstance(exc, KeyError):
                            log.info(
                                "replication_peer_unknown",
                                peer=peer,
                                reason="no registered replication address: its node lease "
                                "is gone (down, cut from the MetaStore, or retired)",
                                attempts=failures + 1,
                            )
                        else:
                            log.info(
                                "replication_dial_failed",
                                peer=peer,
                                error=repr(exc),
                                attempts=failures + 1,
                            )
                    failures += 1
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                try:
                    name = await asyncio.wait_for(
                        handshake_dialer(reader, writer, self.node, self._secret, peer),
                        self.handshake_timeout,
                    )
                except (
                    TimeoutError,
                    LinkAuthError,
                    FormatError,
                    OSError,
                    asyncio.IncompleteReadError,
                ) as exc:
                    if isinstance(exc, LinkAuthError):
                        self.auth_failures += 1
                    log.warning("replication_handshake_failed", peer=peer, error=repr(exc))
                    writer.close()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                self._register(name, self.node, reader, writer)
                return
        finally:
            self._dialing.pop(peer, None)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An incoming connection: refused at once past the connection cap, else it must
        finish the handshake (frames of at most ``MAX_HANDSHAKE_FRAME_BYTES``) within
        ``handshake_timeout``; every refusal is counted by reason."""
        if self._closing or self.incoming >= self.max_incoming:
            self._refuse("closed" if self._closing else "connection_cap", writer, None)
            return
        self.incoming += 1
        registered = False
        try:
            try:
                peer = await asyncio.wait_for(
                    handshake_acceptor(reader, writer, self.node, self._secret),
                    self.handshake_timeout,
                )
            except _HANDSHAKE_ERRORS as exc:
                self._refuse(_refusal_reason(exc), writer, exc)
                return
            if self._closing:
                writer.close()
                return
            # an accepted link's close gives its place back (``_closed``)
            registered = self._register(peer, peer, reader, writer) is not None
        finally:
            if not registered:
                self.incoming -= 1

    def _refuse(self, reason: str, writer: asyncio.StreamWriter, exc: BaseException | None) -> None:
        self.refusals[reason] += 1
        if reason == "auth":
            self.auth_failures += 1
        elif reason in ("malformed", "oversized"):
            self.malformed_frames += 1
        peer = writer.get_extra_info("peername")
        # rate-limited by nature: one line per refused connection, and the cap bounds them
        log.warning(
            "replication_link_refused",
            reason=reason,
            peer_address=repr(peer),
            error=repr(exc) if exc is not None else None,
        )
        writer.close()

    def _register(
        self, peer: str, dialer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Link | None:
        existing = self.links.get(peer)
        if existing is not None and not existing.closed:
            # Both nodes dialed at once: keep the link dialed by the lower name (each side
            # applies the same rule, so they keep the same connection).
            keep_new = dialer == min(self.node, peer)
            if not keep_new or existing.dialer == dialer:
                writer.close()
                return None
            existing.close()
        link = Link(
            peer,
            dialer,
            reader,
            writer,
            self.files,
            self._on_frame,
            self._closed,
            self.budget.wait_for_room,
            self.traffic.setdefault(peer, LinkTraffic()),
        )
        self.links[peer] = link
        pending = self._pending.pop(peer, None)
        while pending:
            link.send(pending.popleft())
        return link

    def _closed(self, link: Link) -> None:
        if link.dialer != self.node:  # accepted by us: its place under the cap is free
            self.incoming -= 1
        if isinstance(link.error, FormatError):
            self.malformed_frames += 1
        if link.failed_side == "send":
            self.send_failures += 1
        if self.links.get(link.peer) is link:
            del self.links[link.peer]
        if self._closing:
            return
        # fetches in flight on it are lost: members ask again
        for followed in self.followed.values():
            if followed.leader == link.peer:
                followed.refetch()
        for run in self._catch_ups.values():
            if run.leader == link.peer:
                run.refetch()


def _refusal_reason(exc: BaseException) -> str:
    if isinstance(exc, LinkAuthError):
        return "auth"
    if isinstance(exc, InvalidSizeError):
        return "oversized"
    if isinstance(exc, FormatError):
        return "malformed"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "closed"  # the peer went away (EOF, reset) before finishing


_ = log_history  # re-exported for the server integration
