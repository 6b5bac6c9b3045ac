"""In-process replication hubs on loopback around real stream logs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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


async def until(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.01)


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
