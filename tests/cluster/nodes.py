"""Multi-process cluster harness: ``tierlog serve`` nodes on loopback sharing one etcd
(optionally each through its own TCP proxy, to cut a node from etcd alone) and one
SeaweedFS bucket; an ``rstream`` publisher with a named producer that survives any
fault by reconnecting through Metadata and resending what was not confirmed; a watcher
of the manifest pointer; and the oracle.

Oracle: every confirmed message is read back exactly once, in order; the manifest
pointer's epoch and version only go up; a leader that may have been deposed sent no
confirm and committed no manifest from the moment it could have been deposed until it
led again in a higher epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rstream import ConsumerOffsetSpecification, OffsetType, Producer
from rstream.client import Client
from rstream.consumer import Consumer, MessageContext
from rstream.exceptions import StreamNotAvailable
from rstream.producer import ConfirmationStatus
from rstream.utils import RawMessage

from tests.plugins import seaweed
from tests.plugins.tierlog_server import TierlogServerProcess
from tests.support.streams import FAST_TIERING
from tests.support.waiting import until
from tierlog.cluster.membership import ClusterDirectory
from tierlog.errors import TierlogError
from tierlog.formats import replication as wire
from tierlog.remote.catalog import Catalog, ManifestPointer, pointer_key
from tierlog.storage.meta_store import MetaStore, open_meta_store

HOST = "127.0.0.1"
TTL = 5.0
DRIFT = 1.0
PRODUCER = "cluster-producer"
STREAM_ARGS = dict(FAST_TIERING)


class TcpProxy:
    """A loopback TCP proxy that can cut every connection through it and refuse new
    ones until healed (a network partition of one node from one service)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._cut = False
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or self._cut:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()


class ReplicationProxy(TcpProxy):
    """A node's replication listener behind a proxy that knows who dialed: the first
    frame of a replication link is the dialer's ``HELLO`` (its node name, in clear when
    links are not TLS). ``cut_from(node)`` cuts that node's links through here and
    refuses its new ones, so a test can cut one node from all the others (its own proxy
    cut, plus ``cut_from`` it on every other proxy) while the others still reach each
    other whoever dials."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._blocked: set[str] = set()
        self._dialers: dict[socket.socket, str] = {}
        super().__init__(target_host, target_port)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        try:
            client.settimeout(5)
            head = _recv_exactly(client, 4)
            size = wire.frame_size(head)
            assert size is not None
            first = head + _recv_exactly(client, size - 4)
            hello = wire.decode(first)
            client.settimeout(None)
        except (OSError, AssertionError, ValueError, TierlogError):
            client.close()
            return
        dialer = hello.node if isinstance(hello, wire.Hello) else ""
        if self._cut or dialer in self._blocked:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.sendall(first)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets.update((client, upstream))
            self._dialers[client] = self._dialers[upstream] = dialer
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        super()._pipe(source, sink)
        with self._lock:
            self._dialers.pop(source, None)
            self._dialers.pop(sink, None)

    def cut_from(self, node: str) -> None:
        self._blocked.add(node)
        with self._lock:
            sockets = [s for s, d in self._dialers.items() if d == node]
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def heal_from(self, node: str) -> None:
        self._blocked.discard(node)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = sock.recv(size - len(data))
        if not part:
            raise OSError("closed before the first frame")
        data += part
    return data


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    name: str
    process: TierlogServerProcess
    etcd_proxy: TcpProxy | None = None
    replication_proxy: ReplicationProxy | None = None

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def log_events(self, event: str) -> list[dict[str, str]]:
        """The node's structured log lines of ``event`` (kv format), oldest first."""
        out = []
        for line in self.process.log_path.read_text(errors="replace").splitlines():
            if f"event={event}" not in line:
                continue
            out.append(dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line)))
        return out


def log_time(fields: dict[str, str]) -> float:
    """Wall-clock seconds of a log line's ``ts=2026-...Z``."""
    return datetime.fromisoformat(fields["ts"].replace("Z", "+00:00")).timestamp()


class Cluster:
    """``names`` nodes sharing one etcd namespace and one S3 prefix."""

    def __init__(
        self,
        base: Path,
        etcd_endpoint: str,
        s3: seaweed.SeaweedServer,
        names: tuple[str, ...] = ("n1", "n2", "n3"),
        proxied_etcd: bool = False,
        replicated: bool = False,
        proxied_replication: bool = False,
        meta_uri: Callable[[str, str], str] | None = None,
        node_config: Callable[[str], str] | None = None,
    ) -> None:
        """``meta_uri(endpoint, namespace)``: the MetaStore URI (default plain etcd);
        ``node_config(name)``: more lines for a node's ``[cluster]`` table."""
        self.base = base
        etcd_host, etcd_port = etcd_endpoint.rsplit(":", 1)
        self.namespace = f"t-{uuid.uuid4().hex}"
        uri_of = meta_uri or (lambda endpoint, namespace: f"etcd://{endpoint}/{namespace}")
        self.meta_uri = uri_of(etcd_endpoint, self.namespace)
        prefix = f"t/{uuid.uuid4().hex}"
        self.object_uri = f"s3://{s3.bucket}/{prefix}?endpoint={s3.endpoint}&region={s3.region}"
        self.env = {
            "AWS_ACCESS_KEY_ID": seaweed.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": seaweed.SECRET_KEY,
            "AWS_REGION": seaweed.REGION,
        }
        self.nodes: dict[str, Node] = {}
        for name in names:
            proxy = TcpProxy(etcd_host, int(etcd_port)) if proxied_etcd else None
            endpoint = f"{HOST}:{proxy.port}" if proxy else etcd_endpoint
            config = f"""
[storage]
meta_store = "{uri_of(endpoint, self.namespace)}"
object_store = "{self.object_uri}"

[tier]
retention_interval_seconds = 0.2
local_retention_interval_seconds = 0.2
delete_grace_seconds = 0.0

[cluster]
node = "{name}"
lease_ttl_seconds = {TTL}
drift_seconds = {DRIFT}
scan_interval_seconds = 0.3
"""
            if replicated or proxied_replication:
                config += 'secret = "cluster-secret-for-the-tests"\n'
            if node_config is not None:
                config += node_config(name)
            replication_proxy = None
            if proxied_replication:
                # peers dial the advertised address (the proxy), which forwards to the
                # node's own replication listener
                listen_port = free_port()
                replication_proxy = ReplicationProxy(HOST, listen_port)
                config += f"replication_port = {listen_port}\n"
                config += f'replication_address = "{HOST}:{replication_proxy.port}"\n'

            process = TierlogServerProcess(base / name, config_text=config, env=self.env)
            self.nodes[name] = Node(name, process, proxy, replication_proxy)
        self.meta: MetaStore = open_meta_store(self.meta_uri)

    def start(self) -> Cluster:
        for node in self.nodes.values():
            node.process.start()
        return self

    def close(self) -> None:
        for node in self.nodes.values():
            if node.process.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, 18)  # SIGCONT: a stopped process cannot exit
            try:
                node.process.stop()
            except RuntimeError:
                node.process.kill()
            if node.etcd_proxy is not None:
                node.etcd_proxy.close()
            if node.replication_proxy is not None:
                node.replication_proxy.close()
        self.meta.close()

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def live(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.process.alive()]

    def incarnation(self, stream: str) -> str:
        return Catalog(self.meta).require("/", stream).incarnation

    def members_of(self, stream: str) -> tuple[str, ...]:
        record = ClusterDirectory(self.meta).require_stream(self.incarnation(stream))
        return record.membership.members

    def stream_files(self, node: str, stream: str) -> dict[str, bytes]:
        """A member's segment and index files of the stream."""
        directory = self.nodes[node].process.data_dir / "streams" / self.incarnation(stream)
        return {
            p.name: p.read_bytes()
            for p in sorted(directory.iterdir())
            if p.suffix in (".segment", ".index")
        }

    def leader_of(self, stream: str) -> tuple[str | None, int]:
        record = ClusterDirectory(self.meta).require_stream(self.incarnation(stream))
        return record.leader, record.epoch


class PointerWatch:
    """Samples a stream's manifest pointer every 50 ms from the test process: the
    pointer's (epoch, version) must never go down."""

    def __init__(self, meta: MetaStore, incarnation: str) -> None:
        self.meta = meta
        self.key = pointer_key(incarnation)
        self.samples: list[tuple[float, int, int]] = []  # (wall time, epoch, version)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pointer-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                stored = self.meta.get(self.key)
                if stored is not None:
                    pointer = ManifestPointer.decode(stored.value, stored.version)
                    self.samples.append((time.time(), pointer.epoch, stored.version))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def regressions(self) -> list[str]:
        out = []
        for (_, e1, v1), (t2, e2, v2) in zip(self.samples, self.samples[1:], strict=False):
            if e2 < e1 or v2 < v1:
                out.append(f"pointer went from epoch {e1} v{v1} to epoch {e2} v{v2} at {t2}")
        return out

    def commits_in_epoch_after(self, epoch: int, after: float) -> list[tuple[float, int]]:
        """Pointer versions of ``epoch`` first seen after ``after`` that were not
        already there before it (a commit in that epoch after that moment)."""
        before = max((v for t, e, v in self.samples if t <= after and e == epoch), default=-1)
        return [(t, v) for t, e, v in self.samples if t > after and e == epoch and v > before]


def body(i: int) -> bytes:
    return b"msg-%08d-" % i + bytes([i % 251]) * 200


def id_of(data: bytes) -> int:
    return int(data[4:12])


@dataclass
class Publisher:
    """Publishes ids 1..n with one named producer through whichever node is up; on any
    error or a stall it drops the connection, asks Metadata again and resends every id
    not confirmed yet (the server deduplicates ids it already stored)."""

    cluster: Cluster
    stream: str
    batch: int = 20
    stall_seconds: float = 4.0
    confirmed: set[int] = field(default_factory=set)
    confirm_times: dict[int, float] = field(default_factory=dict)
    refused: int = 0
    sessions: int = 0
    next_id: int = 1

    async def run(self, until: Callable[[], bool], limit: int = 10**9) -> None:
        while not until() and len(self.confirmed) < limit:
            live = self.cluster.live()
            if not live:
                await asyncio.sleep(0.2)
                continue
            self.sessions += 1
            node = live[self.sessions % len(live)]
            try:
                await self._session(node, until, limit)
            except Exception:
                await asyncio.sleep(0.3)

    def _confirm_handler(
        self, waiting: set[int], progress: asyncio.Event
    ) -> Callable[[ConfirmationStatus], Any]:
        async def on_confirm(status: ConfirmationStatus) -> None:
            if status.is_confirmed:
                self.confirmed.add(status.message_id)
                self.confirm_times.setdefault(status.message_id, time.time())
            else:
                self.refused += 1
            waiting.discard(status.message_id)
            if not waiting:
                progress.set()

        return on_confirm

    async def _session(self, node: Node, until: Callable[[], bool], limit: int) -> None:
        producer = Producer(
            HOST,
            port=node.process.stream_port,
            username="guest",
            password="guest",
            heartbeat=0,
        )
        try:
            await asyncio.wait_for(producer.start(), 5)
            # resend from the first id not confirmed (ascending, so the order holds)
            pending = [i for i in range(1, self.next_id) if i not in self.confirmed]
            while not until() and len(self.confirmed) < limit:
                if not pending:
                    pending = list(range(self.next_id, self.next_id + self.batch))
                    self.next_id += self.batch
                waiting = set(pending)
                progress = asyncio.Event()
                on_confirm = self._confirm_handler(waiting, progress)
                messages = [RawMessage(body(i), publishing_id=i) for i in pending]
                await asyncio.wait_for(
                    producer.send_batch(
                        self.stream,
                        messages,
                        publisher_name=PRODUCER,
                        on_publish_confirm=on_confirm,
                    ),
                    self.stall_seconds,
                )
                await asyncio.wait_for(progress.wait(), self.stall_seconds)
                pending = [i for i in pending if i not in self.confirmed]
                if pending:
                    return  # refused: start a new session (Metadata, leader, resend)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.close(), 3)


class PinnedConsumer(Consumer):
    """An rstream consumer that reads from the node it connected to instead of the
    leader or a replica named by Metadata (rstream always follows Metadata)."""

    async def _get_or_create_client(self, stream: str) -> Client:
        if stream not in self._clients:
            self._clients[stream] = await self._pool.get(
                connection_name=self._connection_name,
                connection_closed_handler=self._on_connection_closed,
                stream=stream,
                max_clients_by_connections=self._max_subscribers_by_connection,
            )
        return self._clients[stream]


@dataclass
class ResumingReader:
    """Reads a stream through one node from its first offset and, whenever the node ends
    the subscription (MetadataUpdate: it took the stream over, or stopped serving it) or
    the connection drops, subscribes again on that node after the last offset it got,
    as a client resuming at its stored offset does. ``ids`` in delivery order."""

    port: int
    stream: str
    ids: list[int] = field(default_factory=list)
    ended: int = 0  # subscriptions the node ended (MetadataUpdate or connection lost)
    next_offset: int | None = None

    async def run(self, stop: Callable[[], bool]) -> None:
        async def on_message(msg: Any, ctx: MessageContext) -> None:
            if self.next_offset is not None and ctx.offset < self.next_offset:
                return  # the rest of a chunk a resumed subscription started inside
            self.ids.append(id_of(bytes(msg)))
            self.next_offset = ctx.offset + 1

        while not stop():
            gone = asyncio.Event()
            consumer = PinnedConsumer(
                HOST,
                port=self.port,
                username="guest",
                password="guest",
                heartbeat=0,
                on_close_handler=lambda info, gone=gone: gone.set(),  # type: ignore[misc]
            )
            try:
                await asyncio.wait_for(consumer.start(), 5)
                spec = (
                    ConsumerOffsetSpecification(OffsetType.FIRST)
                    if self.next_offset is None
                    else ConsumerOffsetSpecification(OffsetType.OFFSET, self.next_offset)
                )
                await asyncio.wait_for(
                    consumer.subscribe(self.stream, on_message, offset_specification=spec), 5
                )
                while not stop() and not gone.is_set():
                    await asyncio.sleep(0.1)
                if gone.is_set():
                    self.ended += 1
            except Exception:
                await asyncio.sleep(0.3)  # not available yet (or the node is down): again
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.close(), 3)


async def read_stream(
    port: int, stream: str, at_least: int, timeout: float = 30.0, pinned: bool = False
) -> list[int]:
    """Message ids of the whole stream read through one node, in order: reads until
    ``at_least`` ids arrived and the stream has been quiet for a second. ``pinned``:
    from that node itself, not from the leader or a replica Metadata names."""
    got: list[int] = []
    last = [time.monotonic()]

    async def on_message(msg: Any, ctx: MessageContext) -> None:
        got.append(id_of(bytes(msg)))
        last[0] = time.monotonic()

    deadline = time.monotonic() + timeout
    while True:  # the stream may still be opening (resolution after a take-over)
        kind = PinnedConsumer if pinned else Consumer
        consumer = kind(HOST, port=port, username="guest", password="guest", heartbeat=0)
        await consumer.start()
        try:
            await consumer.subscribe(
                stream,
                on_message,
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
            )
            break
        except StreamNotAvailable:
            await consumer.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    try:
        while time.monotonic() < deadline:
            if len(got) >= at_least and time.monotonic() - last[0] > 1.0:
                break
            await asyncio.sleep(0.1)
    finally:
        await consumer.close()
    return got


def oracle(confirmed: set[int], read: list[int]) -> list[str]:
    """Every confirmed id read exactly once, every id at most once, in order."""
    problems = []
    if read != sorted(set(read)):
        problems.append("ids read out of order or twice")
    missing = sorted(confirmed - set(read))
    if missing:
        problems.append(f"{len(missing)} confirmed ids not read, first {missing[:5]}")
    return problems


async def subscribe_retrying(consumer: Consumer, stream: str, *args: Any, **kwargs: Any) -> None:
    """``consumer.subscribe``, retrying STREAM_NOT_AVAILABLE for up to 15 s as a client
    should: rstream subscribes through a replica Metadata listed, which may not serve
    the stream yet (just woken, joining or truncating)."""
    deadline = time.monotonic() + 15.0
    while True:
        try:
            await consumer.subscribe(stream, *args, **kwargs)
            return
        except StreamNotAvailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    await until(predicate, timeout, what, interval=0.1)


def admin_json(node: Node, path: str) -> Any:
    import urllib.request

    request = urllib.request.Request(
        node.process.admin_url + path, headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def admin_call(node: Node, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One admin API call (guest credentials): the status and the JSON answer, also for
    an error status."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
        node.process.admin_url + path, data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=40) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def create_replicated(
    cluster: Cluster, stream: str, arguments: dict[str, str], on: str = "n1"
) -> None:
    """Create a stream through ``on`` once the nodes know each other (the directory
    scan), so the replication factor asked for can be met."""
    port = cluster.node(on).process.stream_port
    deadline = time.monotonic() + 3 * TTL
    while True:
        try:
            async with Producer(HOST, port=port, username="guest", password="guest") as p:
                await p.create_stream(stream, arguments=arguments)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def same_files_as_leader(cluster: Cluster, stream: str, member: str) -> bool:
    """Whether ``member`` holds every segment and index file from its first one on,
    byte-identical to the leader's (a late joiner starts at a segment of the leader)."""
    leader, _ = cluster.leader_of(stream)
    if leader is None:
        return False
    theirs = cluster.stream_files(leader, stream)
    mine = cluster.stream_files(member, stream)
    if not mine:
        return False
    first = min(mine)
    return mine == {name: data for name, data in theirs.items() if name >= first}


@contextlib.contextmanager
def running_cluster(
    tmp_path: Path, etcd_server: str, seaweed_server: seaweed.SeaweedServer, **options: Any
) -> Iterator[Cluster]:
    """A started ``Cluster`` (options as ``Cluster`` takes them), closed on exit: the body
    of the tests' ``cluster`` fixtures."""
    cluster = Cluster(tmp_path, etcd_server, seaweed_server, **options)
    try:
        yield cluster.start()
    finally:
        cluster.close()
