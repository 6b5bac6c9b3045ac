"""A small synchronous RabbitMQ Stream protocol client, for Spark tasks.

It speaks just what a writer task needs: connect (PeerProperties, SASL PLAIN, Tune,
Open), create a stream, declare a named publisher, query its sequence, publish
messages with explicit publishing ids, wait for their confirms, close. Publish frames
are built straight from an Arrow-style buffer pair (offsets + data) with numpy, so a
task never makes one Python object per message just to frame it.

Blocking sockets keep it simple: one client per task, confirms read while the window
of unconfirmed messages is full and at the end.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command, OffsetType, ResponseCode
from tierlog.formats.protocol.frames import FrameSplitter
from tierlog.formats.protocol.publish import (
    PUBLISH_FRAME_HEADER_SIZE,
    PUBLISH_V1_MESSAGE_HEADER_SIZE,
    PublishConfirm,
    PublishError,
    encode_publish_columns,
)
from tierlog.spark.errors import PublishFailedError, ResponseError, StreamClientError

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_IN_FLIGHT = 10_000
MAX_REFERENCE_BYTES = 255


@dataclass
class _Publisher:
    outstanding: int = 0
    confirmed: int = 0
    errors: list[tuple[int, int]] = field(default_factory=list)


class StreamClient:
    """One blocking connection to a stream server (use ``connect``)."""

    def __init__(self, sock: socket.socket, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self.sock = sock
        self.splitter = FrameSplitter()
        self.frame_max = 0
        self.max_in_flight = max_in_flight
        self._frames: list[object] = []
        self._corr = 0
        self._publishers: dict[int, _Publisher] = {}

    # ------------------------------------------------------------------ connection

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        *,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        timeout: float = DEFAULT_TIMEOUT_S,
        frame_max: int = 0,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> StreamClient:
        """Open a connection: PeerProperties, SASL PLAIN, Tune (no heartbeats), Open."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise StreamClientError(f"cannot connect to {host}:{port}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = cls(sock, max_in_flight)
        try:
            client._handshake(user, password, vhost, frame_max)
        except BaseException:
            sock.close()
            raise
        return client

    def _handshake(self, user: str, password: str, vhost: str, frame_max: int) -> None:
        props = {"product": "tierlog-spark", "connection_name": "tierlog-spark-writer"}
        self._request(c.PeerPropertiesRequest(self._next_corr(), props), "peer properties")
        self._request(c.SaslHandshakeRequest(self._next_corr()), "SASL handshake")
        auth = c.SaslAuthenticateRequest(self._next_corr(), "PLAIN", c.plain_data(user, password))
        self._request(auth, "authentication")
        tune = self._expect(c.Tune)
        assert isinstance(tune, c.Tune)
        self.frame_max = min(tune.frame_max, frame_max) if frame_max else tune.frame_max
        if not self.frame_max:
            self.frame_max = 1_048_576
        self.splitter.max_frame_size = 0
        self._send(c.Tune(self.frame_max, 0).encode())
        self._request(c.OpenRequest(self._next_corr(), vhost), f"open vhost {vhost!r}")

    def close(self) -> None:
        """Close politely (Close request, wait for its answer), then the socket."""
        try:
            self._send(c.CloseRequest(self._next_corr(), ResponseCode.OK, "done").encode())
            self._expect_response(Command.CLOSE)
        except (OSError, StreamClientError):
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ streams

    def create_stream(
        self, stream: str, arguments: Mapping[str, str] | None = None, *, exist_ok: bool = False
    ) -> bool:
        """Create ``stream``; False when it already existed and ``exist_ok``."""
        corr = self._next_corr()
        self._send(c.CreateRequest(corr, stream, dict(arguments or {})).encode())
        code = self._expect_response(Command.CREATE).response_code
        if code == ResponseCode.STREAM_ALREADY_EXISTS and exist_ok:
            return False
        if code != ResponseCode.OK:
            raise ResponseError(f"create stream {stream!r}", code)
        return True

    def delete_stream(self, stream: str) -> None:
        self._send(c.DeleteRequest(self._next_corr(), stream).encode())
        code = self._expect_response(Command.DELETE).response_code
        if code != ResponseCode.OK:
            raise ResponseError(f"delete stream {stream!r}", code)

    # ------------------------------------------------------------------ publishing

    def declare_publisher(self, publisher_id: int, stream: str, reference: str = "") -> None:
        """Declare a publisher; a non-empty ``reference`` names it for deduplication."""
        if len(reference.encode()) > MAX_REFERENCE_BYTES:
            raise StreamClientError(f"publisher reference longer than {MAX_REFERENCE_BYTES} bytes")
        request = c.DeclarePublisherRequest(self._next_corr(), publisher_id, reference, stream)
        self._send(request.encode())
        code = self._expect_response(Command.DECLARE_PUBLISHER).response_code
        if code != ResponseCode.OK:
            raise ResponseError(f"declare publisher {reference!r} on {stream!r}", code)
        self._publishers[publisher_id] = _Publisher()

    def delete_publisher(self, publisher_id: int) -> None:
        self._send(c.DeletePublisherRequest(self._next_corr(), publisher_id).encode())
        code = self._expect_response(Command.DELETE_PUBLISHER).response_code
        self._publishers.pop(publisher_id, None)
        if code != ResponseCode.OK:
            raise ResponseError(f"delete publisher {publisher_id}", code)

    def query_publisher_sequence(self, stream: str, reference: str) -> int:
        """The highest publishing id the stream holds for ``reference`` (0: none)."""
        request = c.QueryPublisherSequenceRequest(self._next_corr(), reference, stream)
        response = self._request(request, f"query sequence of {reference!r}")
        assert isinstance(response, c.QueryPublisherSequenceResponse)
        return response.sequence

    def store_offset(self, stream: str, reference: str, offset: int) -> None:
        """Store ``offset`` under ``reference`` in the stream's tracking data (no reply;
        a ``query_offset`` on the same connection sees it)."""
        self._send(c.StoreOffsetRequest(reference, stream, offset).encode())

    def query_offset(self, stream: str, reference: str) -> int | None:
        """The offset stored under ``reference`` (None: nothing stored)."""
        request = c.QueryOffsetRequest(self._next_corr(), reference, stream)
        self._send(request.encode())
        while True:
            frame = self._next_frame()
            if isinstance(frame, c.QueryOffsetResponse) and frame.correlation_id == (
                request.correlation_id
            ):
                if frame.response_code == ResponseCode.NO_OFFSET:
                    return None
                if frame.response_code != ResponseCode.OK:
                    raise ResponseError(f"query offset of {reference!r}", frame.response_code)
                return frame.offset

    def publish(
        self, publisher_id: int, ids: np.ndarray, offsets: np.ndarray, data: np.ndarray
    ) -> None:
        """Send messages (see ``encode_publish_columns``) in frames that fit ``frame_max``,
        waiting for confirms whenever ``max_in_flight`` messages are unconfirmed.
        Errors reported by the server are raised by ``wait_for_confirms``."""
        state = self._publishers[publisher_id]
        n = len(ids)
        offs = offsets.astype(np.int64, copy=False)
        # End position (within one frame) of each message counted from the first one.
        sizes = np.diff(offs) + PUBLISH_V1_MESSAGE_HEADER_SIZE
        room = self.frame_max - PUBLISH_FRAME_HEADER_SIZE
        if n and int(sizes.max()) > room:
            raise StreamClientError(
                f"a message of {int(sizes.max()) - PUBLISH_V1_MESSAGE_HEADER_SIZE} bytes does "
                f"not fit a frame of {self.frame_max} bytes"
            )
        cum = np.cumsum(sizes)
        lo = 0
        while lo < n:
            base = int(cum[lo - 1]) if lo else 0
            hi = int(np.searchsorted(cum, base + room, side="right"))
            hi = max(lo + 1, min(hi, lo + max(1, self.max_in_flight)))
            while state.outstanding and state.outstanding + (hi - lo) > self.max_in_flight:
                self._pump()
            self._send(encode_publish_columns(publisher_id, ids[lo:hi], offs[lo : hi + 1], data))
            state.outstanding += hi - lo
            lo = hi

    def wait_for_confirms(self, publisher_id: int) -> int:
        """Block until every message sent is confirmed or failed; return how many were
        confirmed so far. Raises PublishFailedError if any message failed."""
        state = self._publishers[publisher_id]
        while state.outstanding:
            self._pump()
        if state.errors:
            raise PublishFailedError(state.errors)
        return state.confirmed

    # ------------------------------------------------------------------ consuming

    def stream_stats(self, stream: str) -> dict[str, int]:
        """The server's ``first_chunk_id`` / ``committed_chunk_id`` of ``stream``."""
        response = self._request(c.StreamStatsRequest(self._next_corr(), stream), "stream stats")
        assert isinstance(response, c.StreamStatsResponse)
        return dict(response.stats)

    def subscribe(self, subscription_id: int, stream: str, offset: int, credit: int) -> None:
        """Subscribe from ``offset`` (the chunk holding it is delivered first)."""
        spec = c.WireOffsetSpec(OffsetType.OFFSET, offset)
        request = c.SubscribeRequest(self._next_corr(), subscription_id, stream, spec, credit)
        self._request(request, f"subscribe to {stream!r} at {offset}")

    def credit(self, subscription_id: int, credit: int) -> None:
        self._send(c.CreditRequest(subscription_id, credit).encode())

    def next_chunk(self, subscription_id: int) -> memoryview:
        """The next delivered chunk (48-byte header + data section, as sent)."""
        while True:
            frame = self._expect(c.Deliver)
            assert isinstance(frame, c.Deliver)
            if frame.subscription_id == subscription_id:
                chunk = frame.chunk
                return chunk if isinstance(chunk, memoryview) else memoryview(chunk)

    # ------------------------------------------------------------------ frames

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise StreamClientError(f"send failed: {exc}") from exc

    def _on_publish_result(self, frame: PublishConfirm | PublishError) -> None:
        state = self._publishers.get(frame.publisher_id)
        if state is None:
            return
        if isinstance(frame, PublishConfirm):
            count = len(frame.publishing_ids)
            state.confirmed += count
        else:
            count = len(frame.errors)
            state.errors.extend(frame.errors)
        state.outstanding -= count

    def _pump(self) -> None:
        """Read from the socket once; confirms and errors update their publisher, other
        frames are queued for ``_next_frame``."""
        try:
            data = self.sock.recv(1 << 16)
        except OSError as exc:
            raise StreamClientError(f"receive failed: {exc}") from exc
        if not data:
            raise StreamClientError("the server closed the connection")
        for raw in self.splitter.feed(data):
            frame = c.decode_server_frame(raw)
            if isinstance(frame, c.CloseRequest):
                raise StreamClientError(f"server closed the connection: {frame.reason}")
            if isinstance(frame, PublishConfirm | PublishError):
                self._on_publish_result(frame)
            elif not isinstance(frame, c.Heartbeat):
                self._frames.append(frame)

    def _next_frame(self) -> object:
        while not self._frames:
            self._pump()
        return self._frames.pop(0)

    def _expect(self, kind: type) -> object:
        while True:
            frame = self._next_frame()
            if isinstance(frame, kind):
                return frame

    def _expect_response(self, command: Command) -> c.SimpleResponse:
        while True:
            frame = self._expect(c.SimpleResponse)
            assert isinstance(frame, c.SimpleResponse)
            if frame.command == command:
                return frame

    def _request(self, request: object, what: str) -> object:
        """Send a request whose response has a ``response_code``; check it is OK."""
        self._send(request.encode())  # type: ignore[attr-defined]
        corr = request.correlation_id  # type: ignore[attr-defined]
        while True:
            frame = self._next_frame()
            if getattr(frame, "correlation_id", None) == corr and hasattr(frame, "response_code"):
                code = frame.response_code
                if code != ResponseCode.OK:
                    raise ResponseError(what, code)
                return frame
