"""An HTTP proxy in front of an S3 endpoint (SeaweedFS in tests) that injects the faults real
object stores produce, over real sockets.

Fault kinds (``KINDS``):

- ``500``: an ``InternalError`` answer; the request is not forwarded.
- ``503``: a ``SlowDown`` answer (S3's XML error body); not forwarded.
- ``reset``: the connection is reset (RST) before any answer; not forwarded.
- ``delay``: the request waits ``delay_s`` (a range) before it is forwarded.
- ``slow_body``: forwarded; the answer's body trickles out over ``delay_s``.
- ``lost_reply``: forwarded and applied upstream, then the connection is reset instead of
  answering, the ambiguous case a client must resolve itself.

Each request meets a fault with probability ``rate``, its kind drawn from ``kinds``
(weights). ``inject_next(kind, match)`` queues one-shot faults for the next request that
matches (e.g. the next PUT of a fragment). Everything is adjustable while the proxy runs
(``configure``), and ``injected`` counts what was done, by kind.

Requests are forwarded byte for byte (the SigV4 signature covers the Host header, which
stays the proxy's), one upstream connection per client connection. The proxy runs its own
asyncio loop on a daemon thread, so synchronous tests and subprocess servers can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

KINDS = ("500", "503", "reset", "delay", "slow_body", "lost_reply")

_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><Resource>{resource}</Resource>"
    "<RequestId>fault-proxy</RequestId></Error>"
)
_ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}

Matcher = Callable[[str, str], bool]
"""(method, path) -> whether a one-shot fault applies to this request."""


@dataclass
class _Request:
    method: str
    path: str
    raw: bytes  # request line, headers and body exactly as received


class FaultProxy:
    """A fault-injecting S3 proxy; ``endpoint`` is its URL once ``start()`` returned."""

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        kinds: Mapping[str, float] | None = None,
        delay_s: tuple[float, float] = (0.05, 0.3),
        seed: int | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname and parts.port, upstream
        self.upstream = (parts.hostname, parts.port)
        self.rng = random.Random(seed)
        self.rate = 0.0
        self.kinds: dict[str, float] = {}
        self.delay_s = delay_s
        self.configure(rate=rate, kinds=kinds or {k: 1.0 for k in KINDS}, delay_s=delay_s)
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.log: list[tuple[str, str, str]] = []  # (method, path, fault or "ok"), bounded
        self._one_shots: list[tuple[str, Matcher]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- control (thread-safe) --------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configure(
        self,
        *,
        rate: float | None = None,
        kinds: Mapping[str, float] | None = None,
        delay_s: tuple[float, float] | None = None,
    ) -> None:
        if rate is not None:
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"fault rate {rate} outside [0, 1]")
            self.rate = rate
        if kinds is not None:
            unknown = set(kinds) - set(KINDS)
            if unknown or not kinds:
                raise ValueError(f"unknown fault kinds {sorted(unknown)} (known: {KINDS})")
            self.kinds = dict(kinds)
        if delay_s is not None:
            self.delay_s = delay_s

    def off(self) -> None:
        self.rate = 0.0

    def inject_next(self, kind: str, match: Matcher = lambda m, p: True) -> None:
        """Inject ``kind`` into the next request that ``match``es (one-shot, in order)."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._one_shots.append((kind, match))

    def pending_one_shots(self) -> int:
        with self._lock:
            return len(self._one_shots)

    def total_injected(self) -> int:
        with self._lock:
            return sum(self.injected.values())

    def reset_counts(self) -> None:
        with self._lock:
            self.injected.clear()
            self.requests = 0
            self.log.clear()

    def _choose(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests += 1
            kind: str | None = None
            for i, (one_shot, match) in enumerate(self._one_shots):
                if match(method, path):
                    del self._one_shots[i]
                    kind = one_shot
                    break
            else:
                if self.rate and self.rng.random() < self.rate:
                    names = list(self.kinds)
                    kind = self.rng.choices(names, [self.kinds[n] for n in names])[0]
            if kind is not None:
                self.injected[kind] += 1
            if len(self.log) < 100_000:
                self.log.append((method, path, kind or "ok"))
            return kind

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0, reuse_address=True)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    # -- the proxy ------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                request = await _read_request(reader, writer)
                if request is None:
                    return
                kind = self._choose(request.method, request.path)
                if kind == "reset":
                    _reset(writer)
                    return
                if kind in _ERRORS:
                    status, reason, code, message = _ERRORS[kind]
                    body = _ERROR_BODY.format(code=code, message=message, resource=request.path)
                    writer.write(_response_head(status, reason, len(body), "application/xml"))
                    if request.method != "HEAD":
                        writer.write(body.encode())
                    await writer.drain()
                    continue
                if kind == "delay":
                    await asyncio.sleep(self.rng.uniform(*self.delay_s))
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                up_reader, up_writer = upstream
                up_writer.write(request.raw)
                await up_writer.drain()
                head, body, keep = await _read_response(up_reader, request.method)
                if kind == "lost_reply":
                    _reset(writer)
                    return
                writer.write(head)
                if kind == "slow_body" and body:
                    await self._trickle(writer, body)
                else:
                    writer.write(body)
                await writer.drain()
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            if upstream is not None:
                upstream[1].close()
            with contextlib.suppress(Exception):
                writer.close()

    async def _trickle(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        pieces = 10
        step = max(1, -(-len(body) // pieces))
        pause = self.rng.uniform(*self.delay_s) / pieces
        for at in range(0, len(body), step):
            writer.write(body[at : at + step])
            await writer.drain()
            await asyncio.sleep(pause)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed or overloaded server would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _response_head(status: int, reason: str, length: int, content_type: str) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nx-amz-request-id: fault-proxy\r\n\r\n"
    ).encode()


def _headers(head: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            name, _, value = line.partition(b":")
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, raw (framing kept, for forwarding) including the trailer."""
    raw = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        raw += size_line
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailer lines up to the empty line
                line = await reader.readuntil(b"\r\n")
                raw += line
                if line == b"\r\n":
                    return bytes(raw)
        raw += await reader.readexactly(size + 2)


def _dechunk(raw: bytes) -> bytes:
    out = bytearray()
    at = 0
    while True:
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end].split(b";")[0].strip(), 16)
        if size == 0:
            return bytes(out)
        out += raw[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    method, path, _version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    headers = _headers(head)
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return _Request(method, path, head + body)


async def _read_response(reader: asyncio.StreamReader, method: str) -> tuple[bytes, bytes, bool]:
    """The upstream's final answer as (head, body, keep-alive); 1xx interim answers are
    skipped, a chunked body is re-framed with a Content-Length."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if 100 <= status < 200:
            continue
        break
    headers = _headers(head)
    keep = headers.get("connection", "").lower() != "close"
    if method == "HEAD" or status in (204, 304):
        return head, b"", keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(await _read_chunked(reader))
        lines = [
            line
            for line in head[:-4].split(b"\r\n")
            if not line.lower().startswith((b"transfer-encoding:", b"content-length:"))
        ]
        lines.append(f"Content-Length: {len(body)}".encode())
        return b"\r\n".join(lines) + b"\r\n\r\n", body, keep
    if "content-length" in headers:
        return head, await reader.readexactly(int(headers["content-length"])), keep
    return head, await reader.read(), False  # until close


# -- pytest fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_fault_proxy_session(request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    """One fault proxy per session in front of the session's SeaweedFS (faults off)."""
    seaweed = request.getfixturevalue("seaweed")
    proxy = FaultProxy(seaweed.endpoint).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def s3_fault_proxy(s3_fault_proxy_session: FaultProxy) -> Iterator[FaultProxy]:
    """The session's fault proxy, faults off and counts cleared before and after the test."""
    proxy = s3_fault_proxy_session
    proxy.configure(rate=0.0, kinds={k: 1.0 for k in KINDS}, delay_s=(0.05, 0.3))
    proxy.reset_counts()
    with proxy._lock:
        proxy._one_shots.clear()
    try:
        yield proxy
    finally:
        proxy.off()
        with proxy._lock:
            proxy._one_shots.clear()


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
