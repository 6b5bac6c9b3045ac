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

    await hub.stop()

``peers(node) -> (host, port)`` resolves a node name to its replication address (the
node's ``NodeInfo`` in the cluster directory). ``executor`` is the stream's writer
lane (``concurrency.SerialPool``): every log call of a stream runs there, so the
stream's log keeps one writer thread at a time; without one the hub uses its own
bounded pool. ``LeaderListener`` receives, on the event loop, what the members send:
``member_written(member, chunk_id, epoch)`` (feed ``MemberAcked``),
``member_adopted(member, epoch, highest, tail_epoch, tail_chunk_id)`` (feed
``EpochAdopted``), ``member_refused(member, highest_epoch)`` (feed ``EpochRefused``).

Written offset: a member reports ``WRITTEN`` only after ``StreamLog.sync_to_disk()``;
on the leader, ``StreamLog.durable_point()`` (or a commit listener in ``fsync`` mode)
gives the local written chunk for ``LocalWritten``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

from tierlog.log.writer import StreamLog

PeerResolver = Callable[[str], tuple[str, int]]


class LeaderListener(Protocol):
    def member_written(self, member: str, chunk_id: int, epoch: int) -> None: ...

    def member_adopted(
        self, member: str, epoch: int, highest: int, tail_epoch: int, tail_chunk_id: int
    ) -> None: ...

    def member_refused(self, member: str, highest_epoch: int) -> None: ...


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
        heartbeat: float = 1.0,
    ) -> None:
        raise NotImplementedError

    async def start(self, host: str, port: int) -> int:
        """Listen for other nodes' links; returns the bound port."""
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def follow(
        self,
        stream: str,
        log: StreamLog,
        leader: str,
        epoch: int,
        *,
        executor: Executor | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        raise NotImplementedError

    def unfollow(self, stream: str) -> None:
        raise NotImplementedError

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
        raise NotImplementedError

    def request_adopt(self, stream: str, epoch: int, members: tuple[str, ...]) -> None:
        raise NotImplementedError

    def serve(self, stream: str) -> None:
        raise NotImplementedError

    def set_commit(self, stream: str, chunk_id: int) -> None:
        raise NotImplementedError

    def unlead(self, stream: str) -> None:
        raise NotImplementedError
