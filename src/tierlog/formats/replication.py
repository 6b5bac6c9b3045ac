"""The node-to-node replication protocol: frames on one connection per pair of nodes,
multiplexed by stream.

Every frame (all integers big-endian)::

    length u32          bytes after this field
    kind u8             FrameKind
    flags u8            0, except SEGMENT_START on CHUNKS (other bits reserved)
    stream length u16   bytes of the stream id (0 for connection-level frames)
    epoch u64           the sender's epoch for that stream (0 for connection-level)
    stream id           UTF-8 (the stream incarnation)
    body                kind-specific, below

Bodies:

* ``HELLO``: protocol version u16, node name (u16 length + UTF-8). First frame on
  each side, followed by ``CHALLENGE``.
* ``CHALLENGE``: a 32-byte random nonce. ``PROOF``: a 32-byte HMAC-SHA256, keyed
  with the cluster secret, over the role, the peer's nonce and both node names
  (``cluster.link`` computes it): each side proves it holds the secret, without
  sending it, before any other frame (mutual authentication; TLS may wrap the
  connection as well).
* ``ADOPT`` (leader → member): empty; "persist this epoch and report your tail".
* ``ADOPTED`` (member → leader): accepted u8, highest seen epoch u64, tail epoch u64,
  tail chunk id i64 (-1: empty log).
* ``FETCH`` (member → leader): from chunk id u64 (the member's next offset), tail epoch
  u64, tail chunk id i64, max bytes u32. The leader answers ``CHUNKS`` if the tail is on
  its log, else ``HISTORY``.
* ``HISTORY`` (leader → member): commit chunk id i64, range count u32, then per epoch
  range: epoch u64, first chunk id u64, last chunk id u64. The member cuts its
  divergent suffix (``cluster.log_history.common_prefix_end``) and fetches again.
* ``CHUNKS`` (leader → member): first chunk id u64, next offset u64, commit chunk id i64,
  chunk count u32, data length u32, then ``data length`` bytes of Osiris chunks exactly
  as they are in the leader's segment file (the member appends them verbatim). The
  header is encoded apart (``encode_chunks_header``) so the data can follow by
  ``sendfile`` without passing through Python. Flag ``SEGMENT_START`` (0x01): the
  first chunk starts a segment of the leader's log, where an empty member may begin
  (a late joiner: tracking starts empty or with that chunk's snapshot there).
* ``WRITTEN`` (member → leader): written (fsynced) chunk id i64.
* ``COMMIT`` (leader → member): commit chunk id i64 (also a heartbeat).
* ``REFUSED``: code u16 (RefusalCode), highest seen epoch u64, message (u16 length +
  UTF-8).
* ``TAIL_QUERY`` (any node → the stream's leader): request id u32, producer reference
  (u16 length + UTF-8, may be empty). Epoch 0: the asker need not know it.
* ``TAIL`` (leader → asker): request id u32, leads u8 (0: the receiver does not lead
  the stream, the rest is zero), commit chunk id i64 (the last chunk consumers may
  read), next offset u64 (after it), last user chunk id i64 (-1: none), producer
  sequence i64 (-1: unknown reference). Epoch: the leader's.
* ``OFFSET_STORE`` (any node → the stream's leader): request id u32, consumer offset u64,
  consumer reference (u16 length + UTF-8). A StoreOffset a consumer sent to that node.
* ``OFFSET_QUERY`` (any node → the stream's leader): request id u32, consumer reference.
* ``OFFSET`` (leader → asker, the answer to both): request id u32, leads u8 (0: the
  receiver does not lead the stream, nothing was stored), offset i64 (the stored offset,
  or the consumer's offset; -1: none stored). Epoch: the leader's.

Decoders reject anything malformed with a typed ``FormatError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from enum import IntEnum

from tierlog.formats.errors import (
    BadMagicError,
    FormatError,
    InvalidSizeError,
    TruncatedError,
    UnsupportedError,
)

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 << 20  # a fetch answer is capped well below this by max bytes
# Before a peer has proven the cluster secret it may send only HELLO, CHALLENGE and PROOF,
# each well under this: a longer length header is refused before its body is read, so an
# unauthenticated connection never makes the node allocate more than this.
MAX_HANDSHAKE_FRAME_BYTES = 4096
MAX_STREAM_ID_BYTES = 1024
MAX_EPOCH = (1 << 64) - 1
NO_CHUNK = -1

_LENGTH = struct.Struct(">I")
_HEADER = struct.Struct(">BBHQ")  # kind, flags, stream length, epoch (after the length)
SEGMENT_START = 0x01  # CHUNKS flag: the first chunk starts a segment of the leader's log
FRAME_HEADER_SIZE = _LENGTH.size + _HEADER.size  # 16
_ADOPTED = struct.Struct(">BQQq")
_FETCH = struct.Struct(">QQqI")
_HISTORY = struct.Struct(">qI")
_RANGE = struct.Struct(">QQQ")
_CHUNKS = struct.Struct(">QQqII")
_CHUNK_ID = struct.Struct(">q")
_REFUSED = struct.Struct(">HQ")
_U16 = struct.Struct(">H")
_TAIL_QUERY = struct.Struct(">I")
_TAIL = struct.Struct(">IBqQqq")
_OFFSET_STORE = struct.Struct(">IQ")
_OFFSET = struct.Struct(">IBq")


class FrameKind(IntEnum):
    HELLO = 1
    ADOPT = 2
    ADOPTED = 3
    FETCH = 4
    HISTORY = 5
    CHUNKS = 6
    WRITTEN = 7
    COMMIT = 8
    REFUSED = 9
    CHALLENGE = 10
    PROOF = 11
    TAIL_QUERY = 12
    TAIL = 13
    OFFSET_STORE = 14
    OFFSET_QUERY = 15
    OFFSET = 16


class RefusalCode(IntEnum):
    STALE_EPOCH = 1  # the sender's epoch is below the receiver's highest seen epoch
    NOT_LEADER = 2  # a fetch reached a node that does not lead the stream
    UNKNOWN_STREAM = 3
    OUT_OF_RANGE = 4  # the fetch position is not on the leader's local log
    NOT_A_MEMBER = 5
    BELOW_LOCAL_LOG = 6  # the fetch position was deleted by the leader's local retention


@dataclass(frozen=True, slots=True)
class Hello:
    node: str
    version: int = PROTOCOL_VERSION


AUTH_BYTES = 32  # nonce and HMAC-SHA256 sizes


@dataclass(frozen=True, slots=True)
class Challenge:
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Proof:
    mac: bytes


@dataclass(frozen=True, slots=True)
class Adopt:
    stream: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Adopted:
    stream: str
    epoch: int
    accepted: bool
    highest_epoch: int
    tail_epoch: int
    tail_chunk_id: int


@dataclass(frozen=True, slots=True)
class Fetch:
    stream: str
    epoch: int
    from_chunk_id: int
    tail_epoch: int
    tail_chunk_id: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class History:
    stream: str
    epoch: int
    commit_chunk_id: int
    ranges: tuple[tuple[int, int, int], ...]  # (epoch, first chunk id, last chunk id)


@dataclass(frozen=True, slots=True)
class Chunks:
    stream: str
    epoch: int
    first_chunk_id: int
    next_offset: int
    commit_chunk_id: int
    chunk_count: int
    data: bytes
    segment_start: bool = False


@dataclass(frozen=True, slots=True)
class Written:
    stream: str
    epoch: int
    chunk_id: int


@dataclass(frozen=True, slots=True)
class Commit:
    stream: str
    epoch: int
    chunk_id: int


@dataclass(frozen=True, slots=True)
class Refused:
    stream: str
    epoch: int
    code: RefusalCode
    highest_epoch: int
    message: str


@dataclass(frozen=True, slots=True)
class TailQuery:
    stream: str
    epoch: int
    request_id: int
    reference: str


@dataclass(frozen=True, slots=True)
class Tail:
    stream: str
    epoch: int
    request_id: int
    leads: bool
    commit_chunk_id: int = NO_CHUNK
    next_offset: int = 0
    last_user_chunk_id: int = NO_CHUNK
    sequence: int = -1


@dataclass(frozen=True, slots=True)
class OffsetStore:
    stream: str
    epoch: int
    request_id: int
    reference: str
    offset: int


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    stream: str
    epoch: int
    request_id: int
    reference: str


@dataclass(frozen=True, slots=True)
class Offset:
    stream: str
    epoch: int
    request_id: int
    leads: bool
    offset: int = NO_CHUNK  # -1: no offset stored for the reference


OffsetFrame = OffsetStore | OffsetQuery | Offset

Frame = (
    Hello
    | Challenge
    | Proof
    | Adopt
    | Adopted
    | Fetch
    | History
    | Chunks
    | Written
    | Commit
    | Refused
    | TailQuery
    | Tail
    | OffsetStore
    | OffsetQuery
    | Offset
)


# --- encoding ---------------------------------------------------------------------------


def _u64(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EPOCH:
        raise InvalidSizeError(f"{what} {value!r} is not a u64")
    return value


def _chunk_id(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 1 << 63:
        raise InvalidSizeError(f"{what} {value!r} is not a chunk id (or -1)")
    return value


def _text(value: str, what: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise InvalidSizeError(f"{what} of {len(raw)} bytes is too long")
    return _U16.pack(len(raw)) + raw


def _frame(
    kind: FrameKind, stream: str, epoch: int, body: bytes, extra: int = 0, flags: int = 0
) -> bytes:
    """Header (with room for ``extra`` bytes sent after it) + body."""
    sid = stream.encode()
    if len(sid) > MAX_STREAM_ID_BYTES:
        raise InvalidSizeError(f"stream id of {len(sid)} bytes > {MAX_STREAM_ID_BYTES}")
    length = _HEADER.size + len(sid) + len(body) + extra
    if length > MAX_FRAME_BYTES:
        raise InvalidSizeError(f"frame of {length} bytes > {MAX_FRAME_BYTES}")
    header = _HEADER.pack(kind, flags, len(sid), _u64(epoch, "epoch"))
    return _LENGTH.pack(length) + header + sid + body


def encode_chunks_header(
    stream: str,
    epoch: int,
    first_chunk_id: int,
    next_offset: int,
    commit_chunk_id: int,
    chunk_count: int,
    data_length: int,
    segment_start: bool = False,
) -> bytes:
    """Everything of a ``CHUNKS`` frame but its data, which follows it on the wire."""
    if chunk_count < 0 or data_length < 0 or (chunk_count == 0) != (data_length == 0):
        raise InvalidSizeError(f"{chunk_count} chunks in {data_length} bytes")
    if not 0 <= first_chunk_id <= next_offset:
        raise InvalidSizeError(f"chunk range {first_chunk_id}..{next_offset} is inverted")
    body = _CHUNKS.pack(
        _u64(first_chunk_id, "first chunk id"),
        _u64(next_offset, "next offset"),
        _chunk_id(commit_chunk_id, "commit chunk id"),
        chunk_count,
        data_length,
    )
    flags = SEGMENT_START if segment_start and chunk_count else 0
    return _frame(FrameKind.CHUNKS, stream, epoch, body, extra=data_length, flags=flags)


def encode(frame: Frame) -> bytes:
    """The bytes of one frame."""
    if isinstance(frame, Hello):
        body = _U16.pack(frame.version) + _text(frame.node, "node name")
        return _frame(FrameKind.HELLO, "", 0, body)
    if isinstance(frame, Challenge | Proof):
        raw = frame.nonce if isinstance(frame, Challenge) else frame.mac
        if len(raw) != AUTH_BYTES:
            raise InvalidSizeError(f"authentication value of {len(raw)} bytes")
        kind = FrameKind.CHALLENGE if isinstance(frame, Challenge) else FrameKind.PROOF
        return _frame(kind, "", 0, bytes(raw))
    if isinstance(frame, Adopt):
        return _frame(FrameKind.ADOPT, frame.stream, frame.epoch, b"")
    if isinstance(frame, Adopted):
        body = _ADOPTED.pack(
            int(frame.accepted),
            _u64(frame.highest_epoch, "highest epoch"),
            _u64(frame.tail_epoch, "tail epoch"),
            _chunk_id(frame.tail_chunk_id, "tail chunk id"),
        )
        return _frame(FrameKind.ADOPTED, frame.stream, frame.epoch, body)
    if isinstance(frame, Fetch):
        if not 0 <= frame.max_bytes <= MAX_FRAME_BYTES:
            raise InvalidSizeError(f"fetch max bytes {frame.max_bytes} out of range")
        body = _FETCH.pack(
            _u64(frame.from_chunk_id, "from chunk id"),
            _u64(frame.tail_epoch, "tail epoch"),
            _chunk_id(frame.tail_chunk_id, "tail chunk id"),
            frame.max_bytes,
        )
        return _frame(FrameKind.FETCH, frame.stream, frame.epoch, body)
    if isinstance(frame, History):
        parts = [_HISTORY.pack(_chunk_id(frame.commit_chunk_id, "commit"), len(frame.ranges))]
        previous = -1
        for epoch, first, last in frame.ranges:
            if not previous < first <= last:
                raise InvalidSizeError(f"epoch range {epoch}: {first}..{last} out of order")
            parts.append(_RANGE.pack(_u64(epoch, "epoch"), first, last))
            previous = last
        return _frame(FrameKind.HISTORY, frame.stream, frame.epoch, b"".join(parts))
    if isinstance(frame, Chunks):
        header = encode_chunks_header(
            frame.stream,
            frame.epoch,
            frame.first_chunk_id,
            frame.next_offset,
            frame.commit_chunk_id,
            frame.chunk_count,
            len(frame.data),
            frame.segment_start,
        )
        return header + frame.data
    if isinstance(frame, Written):
        body = _CHUNK_ID.pack(_chunk_id(frame.chunk_id, "written chunk id"))
        return _frame(FrameKind.WRITTEN, frame.stream, frame.epoch, body)
    if isinstance(frame, Commit):
        body = _CHUNK_ID.pack(_chunk_id(frame.chunk_id, "commit chunk id"))
        return _frame(FrameKind.COMMIT, frame.stream, frame.epoch, body)
    if isinstance(frame, Refused):
        body = _REFUSED.pack(int(frame.code), _u64(frame.highest_epoch, "highest epoch"))
        return _frame(
            FrameKind.REFUSED, frame.stream, frame.epoch, body + _text(frame.message, "message")
        )
    if isinstance(frame, TailQuery):
        if not 0 <= frame.request_id <= 0xFFFFFFFF:
            raise InvalidSizeError(f"request id {frame.request_id} is not a u32")
        body = _TAIL_QUERY.pack(frame.request_id) + _text(frame.reference, "reference")
        return _frame(FrameKind.TAIL_QUERY, frame.stream, frame.epoch, body)
    if isinstance(frame, Tail):
        if not 0 <= frame.request_id <= 0xFFFFFFFF:
            raise InvalidSizeError(f"request id {frame.request_id} is not a u32")
        body = _TAIL.pack(
            frame.request_id,
            int(frame.leads),
            _chunk_id(frame.commit_chunk_id, "commit chunk id"),
            _u64(frame.next_offset, "next offset"),
            _chunk_id(frame.last_user_chunk_id, "last user chunk id"),
            _chunk_id(frame.sequence, "producer sequence"),
        )
        return _frame(FrameKind.TAIL, frame.stream, frame.epoch, body)
    if isinstance(frame, OffsetStore | OffsetQuery | Offset):
        return _encode_offset_frame(frame)
    raise TypeError(f"not a replication frame: {frame!r}")


def _request_id(value: int) -> int:
    if not 0 <= value <= 0xFFFFFFFF:
        raise InvalidSizeError(f"request id {value} is not a u32")
    return value


def _encode_offset_frame(frame: OffsetFrame) -> bytes:
    request_id = _request_id(frame.request_id)
    if isinstance(frame, OffsetStore):
        body = _OFFSET_STORE.pack(request_id, _u64(frame.offset, "consumer offset"))
        body += _text(frame.reference, "reference")
        return _frame(FrameKind.OFFSET_STORE, frame.stream, frame.epoch, body)
    if isinstance(frame, OffsetQuery):
        body = _TAIL_QUERY.pack(request_id) + _text(frame.reference, "reference")
        return _frame(FrameKind.OFFSET_QUERY, frame.stream, frame.epoch, body)
    body = _OFFSET.pack(request_id, int(frame.leads), _chunk_id(frame.offset, "consumer offset"))
    return _frame(FrameKind.OFFSET, frame.stream, frame.epoch, body)


# --- decoding ---------------------------------------------------------------------------


def frame_size(buf: bytes | memoryview, limit: int = MAX_FRAME_BYTES) -> int | None:
    """Total bytes of the frame starting at ``buf[0]`` (None until 4 bytes are there);
    lets a reader know how much to wait for. Rejects impossible lengths, and lengths
    above ``limit`` (``MAX_HANDSHAKE_FRAME_BYTES`` before authentication), at once."""
    if len(buf) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(buf)
    if length < _HEADER.size or length > min(limit, MAX_FRAME_BYTES):
        raise InvalidSizeError(f"frame length {length} out of range (limit {limit})")
    return _LENGTH.size + length


class _Reader:
    def __init__(self, buf: memoryview, start: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, start, end

    def take(self, size: int, what: str) -> memoryview:
        if self.pos + size > self.end:
            raise TruncatedError(f"frame ends inside its {what}")
        view = self.buf[self.pos : self.pos + size]
        self.pos += size
        return view

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size, what))

    def text(self, what: str) -> str:
        (size,) = self.unpack(_U16, what)
        try:
            return bytes(self.take(size, what)).decode()
        except UnicodeDecodeError as exc:
            raise FormatError(f"{what} is not UTF-8") from exc

    def done(self, kind: FrameKind) -> None:
        if self.pos != self.end:
            raise InvalidSizeError(f"{self.end - self.pos} trailing bytes in a {kind.name} frame")


def _check_chunk_id(value: int, what: str) -> int:
    if value < NO_CHUNK:
        raise InvalidSizeError(f"{what} {value} is negative")
    return value


def decode(data: bytes | memoryview) -> Frame:
    """Decode exactly one whole frame."""
    buf = memoryview(data)
    size = frame_size(buf)
    if size is None or len(buf) < size:
        raise TruncatedError(f"frame of {size} bytes, only {len(buf)} given")
    if len(buf) > size:
        raise InvalidSizeError(f"{len(buf) - size} bytes after the frame")
    reader = _Reader(buf, _LENGTH.size, size)
    raw_kind, flags, sid_size, epoch = reader.unpack(_HEADER, "header")
    try:
        kind = FrameKind(raw_kind)
    except ValueError as exc:
        raise UnsupportedError(f"unknown replication frame kind {raw_kind}") from exc
    allowed = SEGMENT_START if kind is FrameKind.CHUNKS else 0
    if flags & ~allowed:
        raise UnsupportedError(f"replication frame flags {flags:#x} are reserved")
    if sid_size > MAX_STREAM_ID_BYTES:
        raise InvalidSizeError(f"stream id of {sid_size} bytes > {MAX_STREAM_ID_BYTES}")
    try:
        stream = bytes(reader.take(sid_size, "stream id")).decode()
    except UnicodeDecodeError as exc:
        raise FormatError("stream id is not UTF-8") from exc
    frame = _decode_body(kind, stream, epoch, reader)
    reader.done(kind)
    if flags & SEGMENT_START:
        assert isinstance(frame, Chunks)
        if not frame.chunk_count:
            raise FormatError("SEGMENT_START on a CHUNKS frame without chunks")
        frame = replace(frame, segment_start=True)
    return frame


def _decode_body(kind: FrameKind, stream: str, epoch: int, reader: _Reader) -> Frame:
    if kind is FrameKind.HELLO:
        if stream or epoch:
            raise FormatError("HELLO carries no stream or epoch")
        (version,) = reader.unpack(_U16, "version")
        if version != PROTOCOL_VERSION:
            raise BadMagicError(f"replication protocol version {version}, expected 1")
        return Hello(reader.text("node name"), version)
    if kind is FrameKind.CHALLENGE or kind is FrameKind.PROOF:
        if stream or epoch:
            raise FormatError(f"{kind.name} carries no stream or epoch")
        raw = bytes(reader.take(AUTH_BYTES, kind.name))
        return Challenge(raw) if kind is FrameKind.CHALLENGE else Proof(raw)
    if not stream:
        raise FormatError(f"{kind.name} frame without a stream id")
    if kind is FrameKind.ADOPT:
        return Adopt(stream, epoch)
    if kind is FrameKind.ADOPTED:
        accepted, highest, tail_epoch, tail_id = reader.unpack(_ADOPTED, "ADOPTED body")
        if accepted not in (0, 1):
            raise FormatError(f"ADOPTED accepted flag {accepted}")
        tail_id = _check_chunk_id(tail_id, "tail chunk id")
        return Adopted(stream, epoch, bool(accepted), highest, tail_epoch, tail_id)
    if kind is FrameKind.FETCH:
        start, tail_epoch, tail_id, max_bytes = reader.unpack(_FETCH, "FETCH body")
        tail_id = _check_chunk_id(tail_id, "tail chunk id")
        return Fetch(stream, epoch, start, tail_epoch, tail_id, max_bytes)
    if kind is FrameKind.HISTORY:
        commit, count = reader.unpack(_HISTORY, "HISTORY body")
        if count * _RANGE.size > reader.end - reader.pos:
            raise TruncatedError(f"HISTORY claims {count} ranges")
        ranges = []
        previous = -1
        for _ in range(count):
            range_epoch, first, last = reader.unpack(_RANGE, "epoch range")
            if not previous < first <= last:
                raise FormatError(f"epoch range {range_epoch}: {first}..{last} out of order")
            ranges.append((range_epoch, first, last))
            previous = last
        return History(stream, epoch, _check_chunk_id(commit, "commit"), tuple(ranges))
    if kind is FrameKind.CHUNKS:
        first, next_offset, commit, count, data_size = reader.unpack(_CHUNKS, "CHUNKS body")
        if first > next_offset or (count == 0) != (data_size == 0):
            raise FormatError(f"CHUNKS {first}..{next_offset}: {count} chunks, {data_size} B")
        data = bytes(reader.take(data_size, "chunk data"))
        return Chunks(
            stream, epoch, first, next_offset, _check_chunk_id(commit, "commit"), count, data
        )
    if kind is FrameKind.WRITTEN:
        (written,) = reader.unpack(_CHUNK_ID, "WRITTEN body")
        return Written(stream, epoch, _check_chunk_id(written, "written chunk id"))
    if kind is FrameKind.COMMIT:
        (commit,) = reader.unpack(_CHUNK_ID, "COMMIT body")
        return Commit(stream, epoch, _check_chunk_id(commit, "commit chunk id"))
    if kind is FrameKind.TAIL_QUERY:
        (request_id,) = reader.unpack(_TAIL_QUERY, "TAIL_QUERY body")
        return TailQuery(stream, epoch, request_id, reader.text("reference"))
    if kind is FrameKind.TAIL:
        request_id, leads, commit, next_offset, last, sequence = reader.unpack(_TAIL, "TAIL body")
        if leads not in (0, 1):
            raise FormatError(f"TAIL leads flag {leads}")
        return Tail(
            stream,
            epoch,
            request_id,
            bool(leads),
            _check_chunk_id(commit, "commit chunk id"),
            next_offset,
            _check_chunk_id(last, "last user chunk id"),
            _check_chunk_id(sequence, "producer sequence"),
        )
    if kind is FrameKind.OFFSET_STORE:
        request_id, offset = reader.unpack(_OFFSET_STORE, "OFFSET_STORE body")
        return OffsetStore(stream, epoch, request_id, reader.text("reference"), offset)
    if kind is FrameKind.OFFSET_QUERY:
        (request_id,) = reader.unpack(_TAIL_QUERY, "OFFSET_QUERY body")
        return OffsetQuery(stream, epoch, request_id, reader.text("reference"))
    if kind is FrameKind.OFFSET:
        request_id, leads, offset = reader.unpack(_OFFSET, "OFFSET body")
        if leads not in (0, 1):
            raise FormatError(f"OFFSET leads flag {leads}")
        return Offset(stream, epoch, request_id, bool(leads), _check_chunk_id(offset, "offset"))
    code, highest = reader.unpack(_REFUSED, "REFUSED body")
    try:
        refusal = RefusalCode(code)
    except ValueError as exc:
        raise UnsupportedError(f"unknown refusal code {code}") from exc
    return Refused(stream, epoch, refusal, highest, reader.text("message"))
