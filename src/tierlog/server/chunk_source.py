"""Where subscriptions get their chunks: a small protocol plus its local-log implementation.

A subscription attaches a ``ChunkSource`` at an offset spec and gets a ``ChunkCursor``.
The cursor hands out ``DeliverableChunk``s: the bytes a Deliver frame carries after its
prefix (the 48-byte chunk header and the data section; bloom filter and trailer are
skipped, as RabbitMQ does), either as buffers or as byte ranges of an open file for
``sendfile``. The cross-tier reader (``server.tiered_source``) implements the same protocol, so
connection code never changes when chunks come from the remote tier.

Only user chunks are handed out. A cursor whose position was removed by retention
raises ``OffsetOvertakenError`` (with the first offset still available) instead of skipping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from tierlog.formats.bloom import ChunkFilter
from tierlog.formats.chunk import HEADER_SIZE, ChunkHeader
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader, LogSource
from tierlog.remote.errors import OffsetOvertakenError
from tierlog.server.errors import SourceClosedError


@dataclass(frozen=True, slots=True)
class DeliverableChunk:
    """One user chunk ready for a Deliver frame.

    ``wire_size`` is 48 + the data length. Either ``parts`` holds the header and the data
    section (sent with one ``writelines``), or ``file`` is an open file and ``ranges`` the
    (position, length) pieces to send from it, in order.
    """

    chunk_id: int
    num_records: int
    next_offset: int
    wire_size: int
    parts: tuple[bytes | memoryview, ...] | None = None
    file: BinaryIO | None = None
    ranges: tuple[tuple[int, int], ...] = ()


def deliverable_from_raw(header: ChunkHeader, raw: bytes | memoryview) -> DeliverableChunk:
    """The Deliver payload of a chunk held in memory (``raw`` starts at its header):
    header and data section, without the bloom filter and trailer."""
    wire = HEADER_SIZE + header.data_length
    if header.bloom_size == 0:
        parts: tuple[bytes | memoryview, ...] = (raw[:wire],)
    else:
        start = header.data_start
        parts = (raw[:HEADER_SIZE], raw[start : start + header.data_length])
    return DeliverableChunk(header.chunk_id, header.num_records, header.next_offset, wire, parts)


def deliverable_from_file(header: ChunkHeader, file: BinaryIO, start: int) -> DeliverableChunk:
    """The Deliver payload of a chunk at ``start`` in an open segment file, as the byte
    ranges ``sendfile`` sends (header and data section, bloom filter skipped)."""
    wire = HEADER_SIZE + header.data_length
    ranges: tuple[tuple[int, int], ...]
    if header.bloom_size:
        ranges = ((start, HEADER_SIZE), (start + header.data_start, header.data_length))
    else:
        ranges = ((start, wire),)
    return DeliverableChunk(
        header.chunk_id, header.num_records, header.next_offset, wire, None, file, ranges
    )


class ChunkCursor(Protocol):
    """A position in a stream that moves forward one chunk at a time."""

    @property
    def next_offset(self) -> int:
        """The chunk id expected next."""
        ...

    async def read(self) -> DeliverableChunk | None:
        """The next chunk, or None when nothing more is committed yet."""
        ...

    async def wait(self, timeout: float | None = None) -> None:
        """Return when more data may be available (or after ``timeout`` seconds)."""
        ...

    def close(self) -> None: ...


class ChunkSource(Protocol):
    """Anything a subscription can read chunks from."""

    def attach(
        self, spec: OffsetSpec, *, want_file: bool = False, chunk_filter: ChunkFilter | None = None
    ) -> ChunkCursor:
        """A cursor at ``spec``; ``want_file`` asks for file ranges (sendfile) when possible;
        ``chunk_filter`` passes over user chunks whose bloom filter rules them out."""
        ...


class CommitNotifier:
    """Wakes every waiter when a stream's commit point advances (event-loop side)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.closed = False

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def close(self) -> None:
        self.closed = True
        self.notify()

    async def wait(self, timeout: float | None = None) -> None:
        if self.closed:
            return
        event = self._event
        if timeout is None:
            await event.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


class LocalChunkSource:
    """Chunks of a local stream log (segment files, committed chunks only)."""

    def __init__(
        self,
        log: LogSource,
        notifier: CommitNotifier,
        *,
        verify_crc: bool = True,
        sendfile_min_bytes: int = 64 * 1024,
    ) -> None:
        self._log = log
        self._notifier = notifier
        self._verify = verify_crc
        self._sendfile_min = sendfile_min_bytes

    def first_offset(self) -> int:
        return self._log.segment_refs()[0].first_offset

    def attach(
        self, spec: OffsetSpec, *, want_file: bool = False, chunk_filter: ChunkFilter | None = None
    ) -> LocalChunkCursor:
        for _ in range(8):  # a segment may be deleted between listing and opening it
            try:
                reader = LogReader(
                    self._log, spec, verify_crc=self._verify, chunk_filter=chunk_filter
                )
            except FileNotFoundError:
                continue
            return LocalChunkCursor(
                reader,
                self._log,
                self._notifier,
                self.first_offset,
                want_file=want_file,
                sendfile_min_bytes=self._sendfile_min,
            )
        raise SourceClosedError("stream segments keep disappearing while attaching")


class LocalChunkCursor:
    """A LogReader wrapped as a ChunkCursor (reads are preads from the page cache)."""

    def __init__(
        self,
        reader: LogReader,
        log: LogSource,
        notifier: CommitNotifier,
        first_offset: Callable[[], int],
        *,
        want_file: bool,
        sendfile_min_bytes: int,
    ) -> None:
        self._reader = reader
        self._log = log
        self._notifier = notifier
        self._first_offset = first_offset
        self._want_file = want_file
        self._sendfile_min = sendfile_min_bytes
        self._file: BinaryIO | None = None
        self._file_path = ""

    @property
    def next_offset(self) -> int:
        return self._reader.next_offset

    def _check_overtaken(self) -> None:
        position = self._reader.next_offset
        first = self._first_offset()
        if position < first:
            raise OffsetOvertakenError(position, first)

    async def read(self) -> DeliverableChunk | None:
        if self._notifier.closed:
            raise SourceClosedError("stream closed")
        self._check_overtaken()
        if self._want_file:
            chunk = self._reader.read_chunk(load=False)
            if chunk is None:
                return None
            header = chunk.header
            wire = HEADER_SIZE + header.data_length
            if wire >= self._sendfile_min:
                return deliverable_from_file(header, self._open(chunk.segment_path), chunk.position)
            fd = self._open(chunk.segment_path).fileno()
            raw = memoryview(os.pread(fd, header.total_size, chunk.position))
        else:
            loaded = self._reader.read_chunk(load=True)
            if loaded is None:
                return None
            header = loaded.header
            assert loaded.raw is not None
            raw = loaded.raw
        return deliverable_from_raw(header, raw)

    def _open(self, path: str) -> BinaryIO:
        if self._file is None or self._file_path != path:
            if self._file is not None:
                self._file.close()
            self._file = open(path, "rb")  # noqa: SIM115 - kept open across reads
            self._file_path = path
        return self._file

    async def wait(self, timeout: float | None = None) -> None:
        if self._reader.next_offset <= self._log.commit_point().chunk_id:
            return
        await self._notifier.wait(timeout)

    def close(self) -> None:
        self._reader.close()
        if self._file is not None:
            self._file.close()
            self._file = None
