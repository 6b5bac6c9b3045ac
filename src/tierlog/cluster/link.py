"""One authenticated connection between two nodes, carrying every stream's frames.

Authentication (both sides prove they hold the cluster secret, which never crosses
the wire): the dialer sends ``HELLO`` + ``CHALLENGE``; the acceptor answers ``HELLO``
+ ``CHALLENGE`` + ``PROOF``; the dialer checks that proof and answers its own
``PROOF``. A proof is HMAC-SHA256 keyed with the secret over its role, the *peer's*
nonce and both node names, so it cannot be replayed on another connection or
reflected back. A failed proof closes the connection (``LinkAuthError``). TLS can
wrap the connection as well (the hub takes SSL contexts).

Sending goes through one queue per link drained by one task, so a ``CHUNKS`` frame's
header and its data (sent with ``loop.sendfile`` straight from the segment file where
the event loop has it, else read from the file and written in pieces: uvloop has no
``sendfile``) are never interleaved with other frames. A link whose writer fails is
closed and logged (``replication_link_failed``), never left half-dead. Receiving is
one task per link that decodes frames and hands them to the hub; a malformed frame
(``FormatError``) closes that link only.

``LinkTraffic`` counts the bytes and frames exchanged with one peer; the hub keeps one
per peer across reconnections, so the counts only go up (they are exported as metrics).

``FileCache`` keeps the segment files being served open, at most ``max_open`` of them
(least recently used closed first, never one being sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import BinaryIO

from tierlog.cluster.errors import LinkAuthError, LinkClosedError, LinkError
from tierlog.formats import replication as wire
from tierlog.formats.errors import FormatError
from tierlog.logs import get_logger

log = get_logger(__name__)

HANDSHAKE_TIMEOUT = 5.0  # the whole handshake, from accept (or dial) to the last proof
SPAN_PIECE = 256 * 1024  # bytes read and written at a time without sendfile


def proof(secret: bytes, role: bytes, peer_nonce: bytes, dialer: str, acceptor: str) -> bytes:
    message = b"\0".join((b"tierlog-link-v1", role, peer_nonce, dialer.encode(), acceptor.encode()))
    return hmac.new(secret, message, hashlib.sha256).digest()


async def read_frame(reader: asyncio.StreamReader) -> wire.Frame:
    """One whole frame (``FormatError`` if malformed, ``IncompleteReadError`` at EOF)."""
    frame, _size = await read_sized_frame(reader)
    return frame


async def read_sized_frame(
    reader: asyncio.StreamReader, limit: int = wire.MAX_FRAME_BYTES
) -> tuple[wire.Frame, int]:
    """One whole frame and its size in bytes on the wire; a length above ``limit`` is
    refused (``InvalidSizeError``) before any of the body is read."""
    head = await reader.readexactly(4)
    size = wire.frame_size(head, limit)
    assert size is not None
    rest = await reader.readexactly(size - 4)
    return wire.decode(head + rest), size


async def _expect(reader: asyncio.StreamReader, kind: type[wire.Frame]) -> wire.Frame:
    frame, _size = await read_sized_frame(reader, wire.MAX_HANDSHAKE_FRAME_BYTES)
    if not isinstance(frame, kind):
        raise LinkAuthError(f"expected {kind.__name__} during the handshake, got {frame!r:.80}")
    return frame


async def handshake_dialer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    node: str,
    secret: bytes,
    expected_peer: str | None,
) -> str:
    """Authenticate an outgoing connection; returns the peer's node name."""
    nonce = os.urandom(wire.AUTH_BYTES)
    writer.write(wire.encode(wire.Hello(node)) + wire.encode(wire.Challenge(nonce)))
    await writer.drain()
    hello = await _expect(reader, wire.Hello)
    assert isinstance(hello, wire.Hello)
    challenge = await _expect(reader, wire.Challenge)
    assert isinstance(challenge, wire.Challenge)
    theirs = await _expect(reader, wire.Proof)
    assert isinstance(theirs, wire.Proof)
    peer = hello.node
    if not hmac.compare_digest(theirs.mac, proof(secret, b"acceptor", nonce, node, peer)):
        raise LinkAuthError(f"node {peer!r} failed to prove the cluster secret")
    if expected_peer is not None and peer != expected_peer:
        raise LinkAuthError(f"dialed {expected_peer!r} but {peer!r} answered")
    writer.write(wire.encode(wire.Proof(proof(secret, b"dialer", challenge.nonce, node, peer))))
    await writer.drain()
    return peer


async def handshake_acceptor(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: str, secret: bytes
) -> str:
    """Authenticate an incoming connection; returns the peer's node name."""
    hello = await _expect(reader, wire.Hello)
    assert isinstance(hello, wire.Hello)
    challenge = await _expect(reader, wire.Challenge)
    assert isinstance(challenge, wire.Challenge)
    peer = hello.node
    nonce = os.urandom(wire.AUTH_BYTES)
    mine = proof(secret, b"acceptor", challenge.nonce, peer, node)
    writer.write(
        wire.encode(wire.Hello(node))
        + wire.encode(wire.Challenge(nonce))
        + wire.encode(wire.Proof(mine))
    )
    await writer.drain()
    theirs = await _expect(reader, wire.Proof)
    assert isinstance(theirs, wire.Proof)
    if not hmac.compare_digest(theirs.mac, proof(secret, b"dialer", nonce, peer, node)):
        raise LinkAuthError(f"node {peer!r} failed to prove the cluster secret")
    return peer


_NO_SENDFILE: set[type] = set()  # event loop types whose sendfile raised NotImplementedError


def _loop_has_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    return type(loop) not in _NO_SENDFILE


class FileCache:
    """Open segment files for ``sendfile``, at most ``max_open`` (LRU; pinned files,
    being sent, are never closed)."""

    def __init__(self, max_open: int = 1024) -> None:
        if max_open < 1:
            raise ValueError("max_open must be >= 1")
        self.max_open = max_open
        self._files: OrderedDict[str, BinaryIO] = OrderedDict()
        self._pins: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._files)

    def acquire(self, path: str) -> BinaryIO:
        """The open file at ``path`` (pinned until ``release``). A cached file whose
        path now names another file (a segment cut away and written again under the
        same name) is reopened: a span is never sent from a stale inode."""
        f = self._files.get(path)
        if f is not None and path not in self._pins:
            current = os.stat(path)
            opened = os.fstat(f.fileno())
            if (current.st_ino, current.st_dev) != (opened.st_ino, opened.st_dev):
                self._files.pop(path).close()
                f = None
        if f is None:
            f = open(path, "rb")  # noqa: SIM115 - kept open in the cache
            self._files[path] = f
        self._files.move_to_end(path)
        self._pins[path] = self._pins.get(path, 0) + 1
        self._evict()
        return f

    def release(self, path: str) -> None:
        left = self._pins[path] - 1
        if left:
            self._pins[path] = left
        else:
            del self._pins[path]
        self._evict()

    def _evict(self) -> None:
        if len(self._files) <= self.max_open:
            return
        for path in list(self._files):
            if len(self._files) <= self.max_open:
                return
            if path not in self._pins:
                self._files.pop(path).close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


@dataclass(slots=True)
class LinkTraffic:
    """What went over the links to one peer, counted once per frame (never per record)."""

    bytes_sent: int = 0
    frames_sent: int = 0
    bytes_received: int = 0
    frames_received: int = 0


Span = tuple[bytes, str, int, int]  # CHUNKS header, segment path, position, length


class Link:
    """An authenticated connection to ``peer``: a send queue drained by one task and a
    receive task handing frames to ``on_frame``."""

    def __init__(
        self,
        peer: str,
        dialer: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        files: FileCache,
        on_frame: Callable[[Link, wire.Frame], None],
        on_closed: Callable[[Link], None],
        wait_for_room: Callable[[], Awaitable[None]] | None = None,
        traffic: LinkTraffic | None = None,
    ) -> None:
        self.peer = peer
        self.traffic = traffic if traffic is not None else LinkTraffic()
        self._wait_for_room = wait_for_room
        self.dialer = dialer
        self._reader = reader
        self._writer = writer
        self._files = files
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._queue: deque[bytes | Span] = deque()
        self._wake = asyncio.Event()
        self.closed = False
        self.error: BaseException | None = None
        self.failed_side: str | None = None  # "send" or "receive" once it failed
        self._tasks = [
            asyncio.create_task(self._send_loop(), name=f"link-send-{peer}"),
            asyncio.create_task(self._receive_loop(), name=f"link-recv-{peer}"),
        ]

    def send(self, frame: wire.Frame) -> None:
        self.send_bytes(wire.encode(frame))

    def send_bytes(self, raw: bytes) -> None:
        if self.closed:
            raise LinkClosedError(f"link to {self.peer} is closed")
        self._queue.append(raw)
        self._wake.set()

    def send_span(self, header: bytes, path: str, position: int, length: int) -> None:
        """A ``CHUNKS`` header then ``length`` bytes of ``path`` from ``position``."""
        if self.closed:
            raise LinkClosedError(f"link to {self.peer} is closed")
        self._queue.append((header, path, position, length))
        self._wake.set()

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        writer = self._writer
        traffic = self.traffic
        try:
            while not self.closed:
                if not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                item = self._queue.popleft()
                if isinstance(item, bytes):
                    parts = [item]
                    while self._queue and isinstance(self._queue[0], bytes):
                        parts.append(self._queue.popleft())  # type: ignore[arg-type]
                    raw = b"".join(parts)
                    writer.write(raw)
                    traffic.bytes_sent += len(raw)
                    traffic.frames_sent += len(parts)
                    await writer.drain()
                    continue
                header, path, position, length = item
                try:
                    f = self._files.acquire(path)
                except OSError as exc:
                    # gone since the fetch was answered (local retention): nothing was
                    # sent for it, the member asks again
                    log.info("replication_span_gone", peer=self.peer, path=path, error=str(exc))
                    continue
                try:
                    writer.write(header)
                    await writer.drain()
                    sent = await self._send_file(loop, writer, f, position, length)
                finally:
                    self._files.release(path)
                if sent != length:
                    raise LinkError(f"{path}: sent {sent} of {length} bytes (file shrank)")
                traffic.bytes_sent += len(header) + length
                traffic.frames_sent += 1
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a link that cannot send is closed, never left half-dead
            self._fail(exc, "send")

    async def _send_file(
        self,
        loop: asyncio.AbstractEventLoop,
        writer: asyncio.StreamWriter,
        f: BinaryIO,
        position: int,
        length: int,
    ) -> int:
        """Send ``length`` bytes of ``f`` from ``position``; the bytes sent (fewer only
        when the file is shorter)."""
        if _loop_has_sendfile(loop):
            try:
                return await loop.sendfile(writer.transport, f, position, length)
            except NotImplementedError:
                _NO_SENDFILE.add(type(loop))  # then write the file's bytes ourselves
        sent = 0
        fd = f.fileno()
        while sent < length:
            piece = os.pread(fd, min(SPAN_PIECE, length - sent), position + sent)
            if not piece:
                break
            writer.write(piece)
            sent += len(piece)
            await writer.drain()
        return sent

    async def _receive_loop(self) -> None:
        traffic = self.traffic
        try:
            while not self.closed:
                if self._wait_for_room is not None:
                    await self._wait_for_room()  # received chunks wait to be written
                frame, size = await read_sized_frame(self._reader)
                traffic.bytes_received += size
                traffic.frames_received += 1
                try:
                    self._on_frame(self, frame)
                except Exception:
                    log.exception(
                        "replication_frame_failed", peer=self.peer, frame=repr(frame)[:80]
                    )
        except FormatError as exc:
            log.warning("replication_frame_malformed", peer=self.peer, error=str(exc))
            self._fail(exc, "receive")
        except (asyncio.IncompleteReadError, OSError, ConnectionError) as exc:
            self._fail(exc, "receive")
        except asyncio.CancelledError:
            pass

    def _fail(self, exc: BaseException, side: str) -> None:
        if self.error is None:
            self.error = exc
            self.failed_side = side
        if not self.closed:
            # a peer going away ends the receive side: expected, not a warning
            report = log.warning if side == "send" else log.info
            report("replication_link_failed", peer=self.peer, side=side, error=repr(exc))
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._wake.set()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        with contextlib.suppress(Exception):
            self._writer.close()
        self._on_closed(self)
