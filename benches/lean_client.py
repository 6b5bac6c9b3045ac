"""A lean stream-protocol client on tierlog's own codec, for benchmarks.

Blocking sockets, no per-message work: the consumer receives into one buffer, reads the
Deliver frame's chunk header (records, chunk id) and sends one credit back per chunk;
the publisher pipelines pre-encoded Publish frames and counts confirms. Unlike rstream
(which decodes every message in Python and tops out near 340 MiB/s), it measures the
server, not the client.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Mapping, Sequence

from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command, OffsetType
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.publish import encode_publish

_SIZE = struct.Struct(">I")
_KEY = struct.Struct(">H")
_CHUNK = struct.Struct(">BBHIqQQ")  # magic/version, type, entries, records, ts, epoch, id
_CONFIRM_HEAD = struct.Struct(">HHBI")  # key, version, publisher id, count
MAX_FRAME = 64 << 20
_DELIVER_V1 = 5  # key u16, version u16, subscription id u8
BUFFER = 2 << 20  # grows to the largest frame; 100 readers share the bench process


class LeanConnection:
    """An open, authenticated connection (PeerProperties, SASL PLAIN, Tune, Open)."""

    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest"):
        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._splitter = FrameSplitter()
        self._pending: list[object] = []
        self._corr = 0
        self.send(c.PeerPropertiesRequest(self.corr(), {"product": "lean"}).encode())
        self.expect(c.PeerPropertiesResponse)
        self.send(c.SaslHandshakeRequest(self.corr()).encode())
        self.expect(c.SaslHandshakeResponse)
        auth = c.SaslAuthenticateRequest(self.corr(), "PLAIN", c.plain_data(user, password))
        self.send(auth.encode())
        self.expect(c.SaslAuthenticateResponse)
        tune = self.expect(c.Tune)
        assert isinstance(tune, c.Tune)
        self.frame_max = tune.frame_max
        self.send(c.Tune(tune.frame_max, 0).encode())
        self.send(c.OpenRequest(self.corr(), "/").encode())
        opened = self.expect(c.OpenResponse)
        assert isinstance(opened, c.OpenResponse) and opened.response_code == 1, opened

    def corr(self) -> int:
        self._corr += 1
        return self._corr

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def expect(self, kind: type) -> object:
        """Decode frames (control path only) until one of ``kind`` arrives."""
        while True:
            while self._pending:
                frame = self._pending.pop(0)
                if isinstance(frame, kind):
                    return frame
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed while waiting for {kind.__name__}")
            self._pending.extend(c.decode_server_frame(f) for f in self._splitter.feed(data))

    def create(self, stream: str, arguments: Mapping[str, str]) -> None:
        self.send(c.CreateRequest(self.corr(), stream, dict(arguments)).encode())
        response = self.expect(c.SimpleResponse)
        assert isinstance(response, c.SimpleResponse)
        assert response.response_code in (1, 5), response  # OK or already exists

    def close(self) -> None:
        self.sock.close()


class LeanPublisher(LeanConnection):
    """Publishes pre-encoded frames; ``publish`` pipelines, ``publish_one`` measures."""

    def __init__(self, host: str, port: int, stream: str, publisher_id: int = 1):
        super().__init__(host, port)
        self.publisher_id = publisher_id
        self.next_id = 1
        declare = c.DeclarePublisherRequest(self.corr(), publisher_id, "", stream)
        self.send(declare.encode())
        self.expect(c.SimpleResponse)
        self._buf = bytearray()

    def _frame(self, messages: Sequence[bytes]) -> bytes:
        first = self.next_id
        self.next_id += len(messages)
        return encode_publish(self.publisher_id, [(first + i, m) for i, m in enumerate(messages)])

    def _read_confirms(self) -> int:
        """Confirmed ids in the frames received so far (blocks for at least one read)."""
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("server closed the publisher")
        buf = self._buf
        buf += data
        confirmed = 0
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            key, _v, _p, count = _CONFIRM_HEAD.unpack_from(buf, pos + 4)
            if key == Command.PUBLISH_CONFIRM:
                confirmed += count
            elif key == Command.PUBLISH_ERROR:
                raise RuntimeError("publish error")
            pos += 4 + size
        del buf[:pos]
        return confirmed

    def publish(self, messages: Sequence[bytes], frames: int, window: int = 64) -> float:
        """Send ``frames`` frames of ``messages`` with up to ``window`` unconfirmed;
        returns seconds until the last confirm."""
        started = time.perf_counter()
        outstanding = 0
        sent = 0
        per = len(messages)
        while sent < frames or outstanding:
            while sent < frames and outstanding < window * per:
                self.send(self._frame(messages))
                sent += 1
                outstanding += per
            outstanding -= self._read_confirms()
        return time.perf_counter() - started

    def publish_one(self, messages: Sequence[bytes]) -> float:
        """One frame, waiting for all its confirms; returns the latency in seconds."""
        started = time.perf_counter()
        self.send(self._frame(messages))
        left = len(messages)
        while left > 0:
            left -= self._read_confirms()
        return time.perf_counter() - started


class LeanConsumer(LeanConnection):
    """Subscribes and reads Deliver frames with per-chunk work only."""

    def __init__(self, host: str, port: int, stream: str, offset: int | None = None, credit=8):
        super().__init__(host, port)
        spec = (
            c.WireOffsetSpec(OffsetType.FIRST)
            if offset is None
            else c.WireOffsetSpec(OffsetType.OFFSET, offset)
        )
        self.send(c.SubscribeRequest(self.corr(), 1, stream, spec, credit).encode())
        response = self.expect(c.SimpleResponse)
        assert isinstance(response, c.SimpleResponse) and response.response_code == 1, response
        self._credit = c.CreditRequest(1, 1).encode()
        # the recv that brought the subscribe response may also hold the start of a
        # Deliver frame: the splitter keeps it, and the data path must begin with it
        partial = b"".join(self._splitter._parts)
        self._buf = bytearray(max(BUFFER, len(partial) + 65536))
        self._buf[: len(partial)] = partial
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = len(partial)
        # frames that arrived with the subscribe response are already decoded: replay
        self._early = [f for f in self._pending if hasattr(f, "chunk")]
        self._pending.clear()
        # and the start of a frame that came in the same read stays in the splitter:
        # it goes first into the receive buffer, or the stream would be read mid-frame
        leftover = b"".join(self._splitter._parts)
        self._splitter = FrameSplitter()
        if len(leftover) > len(self._buf):
            self._buf = bytearray(len(leftover) + BUFFER)
            self._view = memoryview(self._buf)
        self._buf[: len(leftover)] = leftover
        self._end = len(leftover)
        self.first_chunk_id: int | None = None

    def read_until(self, next_offset: int) -> tuple[int, int]:
        """Read chunks until the stream's next offset reaches ``next_offset``;
        returns (records, chunk bytes) received."""
        records = 0
        size = 0
        position = 0
        for frame in self._early:
            chunk = frame.chunk  # type: ignore[attr-defined]
            _m, _t, _e, n, _ts, _ep, chunk_id = _CHUNK.unpack_from(chunk, 0)
            self.first_chunk_id = chunk_id if self.first_chunk_id is None else self.first_chunk_id
            records += n
            size += len(chunk)
            position = chunk_id + n
            self.send(self._credit)
        self._early = []
        buf, view, sock = self._buf, self._view, self.sock
        start, end = self._start, self._end
        while position < next_offset:
            if len(buf) - end < 65536:
                rest = end - start
                buf[:rest] = bytes(view[start:end])  # no overlapping self-copy
                start, end = 0, rest
            got = sock.recv_into(view[end:])
            if not got:
                raise ConnectionError("server closed the consumer")
            end += got
            while end - start >= 4:
                (frame_size,) = _SIZE.unpack_from(buf, start)
                if frame_size > MAX_FRAME:
                    raise ConnectionError(f"frame of {frame_size} bytes: stream out of sync")
                if end - start - 4 < frame_size:
                    if frame_size + 4 > len(buf):
                        grown = bytearray(frame_size + 4 + 65536)
                        grown[: end - start] = bytes(view[start:end])
                        self._buf = buf = grown
                        self._view = view = memoryview(buf)
                        start, end = 0, end - start
                    break
                (key,) = _KEY.unpack_from(buf, start + 4)
                if key == Command.DELIVER:
                    at = start + 4 + _DELIVER_V1
                    _m, _t, _e, n, _ts, _ep, chunk_id = _CHUNK.unpack_from(buf, at)
                    if self.first_chunk_id is None:
                        self.first_chunk_id = chunk_id
                    records += n
                    size += frame_size - _DELIVER_V1
                    position = chunk_id + n
                    sock.sendall(self._credit)
                start += 4 + frame_size
        self._start, self._end = start, end
        return records, size
