"""In-process replication hubs on loopback around real stream logs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.log.acceptor_helpers import SMALL, write_leader_chunks
from tests.support import waiting
from tierlog.cluster.hub import ReplicationHub
from tierlog.log.writer import StreamLog

SECRET = b"cluster-secret-for-tests"
STREAM = "v_s_1"


@dataclass
class Recorder:
    """A LeaderListener that keeps everything it hears."""

    written: dict[str, int] = field(default_factory=dict)
    adopted: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    refused: list[tuple[str, int]] = field(default_factory=list)

    def member_written(self, member: str, chunk_id: int, epoch: int) -> None:
        self.written[member] = max(self.written.get(member, -1), chunk_id)

    def member_adopted(
        self, member: str, epoch: int, highest: int, tail_epoch: int, tail_chunk_id: int
    ) -> None:
        self.adopted[member] = (epoch, highest, tail_epoch, tail_chunk_id)

    def member_refused(self, member: str, highest_epoch: int) -> None:
        self.refused.append((member, highest_epoch))


class Cluster:
    """Hubs by node name, each resolving the others through ``addresses``."""

    def __init__(self) -> None:
        self.addresses: dict[str, tuple[str, int]] = {}
        self.hubs: dict[str, ReplicationHub] = {}

    async def add(self, node: str, secret: bytes = SECRET, **options: object) -> ReplicationHub:
        hub = ReplicationHub(
            node,
            secret,
            self.addresses.__getitem__,
            heartbeat=0.2,
            **options,  # type: ignore[arg-type]
        )
        port = await hub.start("127.0.0.1", 0)
        self.addresses[node] = ("127.0.0.1", port)
        self.hubs[node] = hub
        return hub

    async def stop(self) -> None:
        for hub in self.hubs.values():
            await hub.stop()


def leader_log(tmp_path: Path, node: str = "n1") -> StreamLog:
    """The leader's log of ``STREAM`` (vhost ``v``, name ``s``) under ``tmp_path/node``."""
    return StreamLog.create(str(tmp_path / node), "v", "s", SMALL, created_ns=1)


def member_log(tmp_path: Path, node: str = "n2") -> StreamLog:
    """An empty member's log of ``STREAM`` under ``tmp_path/node``."""
    return StreamLog.create_follower(str(tmp_path / node / STREAM), SMALL)


async def until(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    await waiting.until(predicate, timeout, what, interval=0.01)


def caught_up(follower: StreamLog, leader: StreamLog) -> Callable[[], bool]:
    return lambda: (
        follower.next_offset == leader.next_offset
        and follower.durable_point().next_offset == leader.next_offset
    )


class CuttingProxy:
    """A TCP proxy to ``target`` that cuts the first connection once ``cut_after``
    bytes went from the target back to the client; later connections pass intact."""

    def __init__(self, target: tuple[str, int], cut_after: int) -> None:
        self.target = target
        self.cut_after = cut_after
        self.cuts = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return ("127.0.0.1", self._server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cut = self.cut_after if self.connections == 1 else None
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, limit: int | None
        ) -> None:
            sent = 0
            try:
                while True:
                    data = await src.read(4096)
                    if not data:
                        break
                    if limit is not None and sent + len(data) >= limit:
                        dst.write(data[: limit - sent])
                        await dst.drain()
                        self.cuts += 1
                        break
                    dst.write(data)
                    sent += len(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (writer, up_writer):
                    w.close()

        await asyncio.gather(pipe(reader, up_writer, None), pipe(up_reader, writer, cut))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


async def hubs_linked_through_a_cut(
    hubs: Cluster, cut_after: int = 5000
) -> tuple[ReplicationHub, ReplicationHub, CuttingProxy]:
    """Hubs ``n1`` (fetch answers of at most 3000 bytes) and ``n2``, whose link to ``n1``
    goes through a ``CuttingProxy`` that cuts its first connection after ``cut_after``
    bytes; the caller stops the proxy."""
    n1 = await hubs.add("n1", fetch_bytes=3000)
    proxy = CuttingProxy(hubs.addresses["n1"], cut_after=cut_after)
    proxied = await proxy.start()
    n2 = await hubs.add("n2")
    real = dict(hubs.addresses)
    n2._peers = lambda node: proxied if node == "n1" else real[node]
    return n1, n2, proxy


def replicate_streams(
    tmp_path: Path,
    leader_hub: ReplicationHub,
    member_hub: ReplicationHub,
    names: list[str],
    chunks: int,
) -> tuple[list[StreamLog], list[StreamLog]]:
    """One stream per name (vhost ``v``) with ``chunks`` chunks, led and served by
    ``leader_hub`` (node ``n1``, epoch 1) and followed by ``member_hub`` (node ``n2``)
    into an empty log: the leaders' and the members' logs, in the order of ``names``."""
    leaders, members = [], []
    for stream_name in names:
        leader = StreamLog.create(str(tmp_path / "n1"), "v", stream_name, SMALL, created_ns=1)
        write_leader_chunks(leader, chunks)
        name = os.path.basename(leader.stream_dir)
        member = StreamLog.create_follower(str(tmp_path / "n2" / name), SMALL)
        leader_hub.lead(name, leader, 1, ("n2",), Recorder())
        leader_hub.serve(name)
        member_hub.follow(name, member, "n1", 1)
        leaders.append(leader)
        members.append(member)
    return leaders, members


def lead_and_follow(
    leader_hub: ReplicationHub,
    member_hub: ReplicationHub,
    leader: StreamLog,
    member: StreamLog,
    epoch: int = 1,
) -> Recorder:
    """``leader_hub`` (node ``n1``) leads ``STREAM`` from ``leader`` in ``epoch`` with
    ``n2`` as its member and serves it; ``member_hub`` (node ``n2``) follows it into
    ``member``. Returns what the leader hears."""
    recorder = Recorder()
    leader_hub.lead(STREAM, leader, epoch, ("n2",), recorder)
    leader_hub.serve(STREAM)
    member_hub.follow(STREAM, member, "n1", epoch)
    return recorder
