"""Byte layouts of delayed delivery (all integers big-endian).

System stream records (one simple entry each):

* ``SCHEDULE``: ``b"TLDS" Due:i64(ms) RefLen:u16 Ref PublishingId:u64 Message`` — a scheduled
  message as accepted; ``Message`` is the published AMQP 1.0 message byte for byte (what is
  appended to the stream when due).
* ``DISPATCH``: ``b"TLDD" FirstPid:u64 Count:u32 MsgId:16*Count`` — the dispatcher's intent:
  message ``k`` will be appended with the internal producer's publishing id ``FirstPid + k``.
  Written (and committed) before that append.
* ``CANCEL``: ``b"TLDC" MsgId:16``.
* ``CARRY``: ``b"TLDR" Version:u8=1 Through:u64 MsgId:16 Due:i64 Intent:u64 Flags:u8 Message``
  — a message still pending when a checkpoint was taken, copied forward so that nothing
  below the checkpoint is needed any more. ``Through`` names the checkpoint (its scan
  position), ``Intent`` the message's latest dispatch intent (0: none), ``Flags`` bit 0:
  the message is in a committed timer object (parked). Other flag bits must be 0.
* ``CHECKPOINT``: ``b"TLDK" Version:u8=1 Through:u64 NextPid:u64 Count:u32`` — written after
  its ``Count`` carries (all committed): every record below offset ``Through`` is summarized
  by them; ``NextPid`` is the dispatcher's next publishing id at the checkpoint.

Working-set body (the value stored under the msg id in the message store):
``Due:i64 Offset:u64 Message`` (``Offset``: the SCHEDULE record's offset in the system stream).

Timer object: ``b"TLTO" Version:u8=1 Hour:u64 Count:u32`` then ``Count`` times
``MsgId:16 Due:i64 Offset:u64 Len:u32 Message``, then ``CRC32:u32`` of everything before it.

The msg id is ``blake2b-128(incarnation, producer reference, publishing id)``; a message from
a producer without a reference gets ``blake2b-128(incarnation, "", system stream offset)``.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from tierlog.delayed.errors import ForeignRecordError, SystemRecordError

SCHEDULE_MAGIC = b"TLDS"
DISPATCH_MAGIC = b"TLDD"
CANCEL_MAGIC = b"TLDC"
CARRY_MAGIC = b"TLDR"
CHECKPOINT_MAGIC = b"TLDK"
CHECKPOINT_VERSION = 1
CARRY_PARKED = 0x01
TIMER_MAGIC = b"TLTO"
TIMER_VERSION = 1
MSG_ID_SIZE = 16

_SCHEDULE_HEAD = struct.Struct(">4sqH")
_U64 = struct.Struct(">Q")
_DISPATCH_HEAD = struct.Struct(">4sQI")
_WORKING_HEAD = struct.Struct(">qQ")
_TIMER_HEAD = struct.Struct(">4sBQI")
_TIMER_ENTRY = struct.Struct(">16sqQI")
_CRC = struct.Struct(">I")
_CARRY_HEAD = struct.Struct(">4sBQ16sqQB")
_CHECKPOINT = struct.Struct(">4sBQQI")


def msg_id_of(incarnation: str, reference: str, sequence: int) -> bytes:
    """The msg id of a scheduled message (``sequence``: the publishing id, or the system
    stream offset when the producer has no reference)."""
    h = hashlib.blake2b(digest_size=MSG_ID_SIZE)
    for part in (incarnation.encode(), reference.encode()):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    h.update(sequence.to_bytes(8, "big"))
    return h.digest()


@dataclass(frozen=True, slots=True)
class Schedule:
    due_ms: int
    reference: str
    publishing_id: int
    message: bytes


@dataclass(frozen=True, slots=True)
class Dispatch:
    first_pid: int
    msg_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Cancel:
    msg_id: bytes


class Carry(NamedTuple):
    """A pending message copied forward by the checkpoint ``through`` (a named tuple: a
    rebuild decodes one per pending message)."""

    through: int
    msg_id: bytes
    due_ms: int
    intent: int  # its latest dispatch intent's publishing id (0: none)
    parked: bool
    message: bytes


class Checkpoint(NamedTuple):
    """Every record below ``through`` is summarized by the ``carried`` carries before it."""

    through: int
    next_pid: int
    carried: int


SystemRecord = Schedule | Dispatch | Cancel | Carry | Checkpoint


def encode_schedule(
    due_ms: int, reference: str, publishing_id: int, message: bytes | memoryview
) -> bytes:
    ref = reference.encode()
    return b"".join(
        (
            _SCHEDULE_HEAD.pack(SCHEDULE_MAGIC, due_ms, len(ref)),
            ref,
            _U64.pack(publishing_id),
            message,
        )
    )


def encode_dispatch(first_pid: int, msg_ids: list[bytes] | tuple[bytes, ...]) -> bytes:
    return _DISPATCH_HEAD.pack(DISPATCH_MAGIC, first_pid, len(msg_ids)) + b"".join(msg_ids)


def encode_cancel(msg_id: bytes) -> bytes:
    return CANCEL_MAGIC + msg_id


def encode_carry(
    through: int,
    msg_id: bytes,
    due_ms: int,
    intent: int,
    parked: bool,
    message: bytes | memoryview,
) -> bytes:
    if len(msg_id) != MSG_ID_SIZE:
        raise SystemRecordError(f"a msg id has {MSG_ID_SIZE} bytes, not {len(msg_id)}")
    flags = CARRY_PARKED if parked else 0
    head = _CARRY_HEAD.pack(CARRY_MAGIC, CHECKPOINT_VERSION, through, msg_id, due_ms, intent, flags)
    return head + bytes(message)


def encode_checkpoint(through: int, next_pid: int, count: int) -> bytes:
    return _CHECKPOINT.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, through, next_pid, count)


def _decode_carry(buf: bytes | memoryview) -> Carry:
    if len(buf) < _CARRY_HEAD.size:
        raise SystemRecordError("carry record shorter than its header")
    _, version, through, msg_id, due, intent, flags = _CARRY_HEAD.unpack_from(buf, 0)
    if version != CHECKPOINT_VERSION:
        raise SystemRecordError(f"carry record of unknown version {version}")
    if flags & ~CARRY_PARKED:
        raise SystemRecordError(f"carry record with unknown flags {flags:#x}")
    message = bytes(buf[_CARRY_HEAD.size :])
    return Carry(through, msg_id, due, intent, bool(flags & CARRY_PARKED), message)


def _decode_checkpoint(buf: bytes | memoryview) -> Checkpoint:
    if len(buf) != _CHECKPOINT.size:
        raise SystemRecordError(f"checkpoint record of {len(buf)} bytes, not {_CHECKPOINT.size}")
    _, version, through, next_pid, count = _CHECKPOINT.unpack(buf)
    if version != CHECKPOINT_VERSION:
        raise SystemRecordError(f"checkpoint record of unknown version {version}")
    if next_pid < 1:
        raise SystemRecordError("checkpoint record with next publishing id 0")
    return Checkpoint(through, next_pid, count)


def decode_system_record(data: bytes | memoryview) -> SystemRecord:
    """The record; ``ForeignRecordError`` when it is not one a system stream holds."""
    checkpointing = _decode_checkpointing(data)
    if checkpointing is not None:
        return checkpointing
    buf = bytes(data)
    magic = buf[:4]
    try:
        if magic == SCHEDULE_MAGIC:
            _, due, ref_len = _SCHEDULE_HEAD.unpack_from(buf, 0)
            pos = _SCHEDULE_HEAD.size
            ref = buf[pos : pos + ref_len].decode()
            pos += ref_len
            (pid,) = _U64.unpack_from(buf, pos)
            return Schedule(due, ref, pid, buf[pos + 8 :])
        if magic == DISPATCH_MAGIC:
            _, first, count = _DISPATCH_HEAD.unpack_from(buf, 0)
            pos = _DISPATCH_HEAD.size
            if len(buf) != pos + count * MSG_ID_SIZE:
                raise ForeignRecordError("dispatch record length does not match its count")
            ids = tuple(buf[pos + k * 16 : pos + k * 16 + 16] for k in range(count))
            return Dispatch(first, ids)
        if magic == CANCEL_MAGIC and len(buf) == 4 + MSG_ID_SIZE:
            return Cancel(buf[4:])
    except (struct.error, UnicodeDecodeError) as exc:
        raise ForeignRecordError(f"system record does not decode: {exc}") from exc
    raise ForeignRecordError(f"not a system record (starts with {buf[:4]!r})")


def _decode_checkpointing(data: bytes | memoryview) -> Carry | Checkpoint | None:
    """A CARRY or CHECKPOINT record (None: neither magic); a malformed one is a
    ``ForeignRecordError`` like any record a system stream cannot hold."""
    head = bytes(data[:4])
    if head not in (CARRY_MAGIC, CHECKPOINT_MAGIC):
        return None
    try:
        return _decode_carry(data) if head == CARRY_MAGIC else _decode_checkpoint(data)
    except (SystemRecordError, struct.error) as exc:
        raise ForeignRecordError(f"checkpointing record does not decode: {exc}") from exc


def check_system_record(data: bytes | memoryview) -> None:
    """Raise ``ForeignRecordError`` unless ``data`` is a whole SCHEDULE, DISPATCH, CANCEL,
    CARRY or CHECKPOINT record: the gate of a system stream's intake (it copies no message
    bytes but a CARRY's, which only the scheduler's checkpoints write)."""
    view = memoryview(data)
    magic = bytes(view[:4])
    if _decode_checkpointing(view) is not None:
        return
    try:
        if magic == SCHEDULE_MAGIC:
            _, _due, ref_len = _SCHEDULE_HEAD.unpack_from(view, 0)
            pos = _SCHEDULE_HEAD.size
            if len(view) < pos + ref_len + _U64.size:
                raise ForeignRecordError("schedule record shorter than its header")
            bytes(view[pos : pos + ref_len]).decode()
            return
        if magic == DISPATCH_MAGIC:
            _, _first, count = _DISPATCH_HEAD.unpack_from(view, 0)
            if len(view) == _DISPATCH_HEAD.size + count * MSG_ID_SIZE:
                return
            raise ForeignRecordError("dispatch record length does not match its count")
        if magic == CANCEL_MAGIC and len(view) == 4 + MSG_ID_SIZE:
            return
    except (struct.error, UnicodeDecodeError) as exc:
        raise ForeignRecordError(f"system record does not decode: {exc}") from exc
    raise ForeignRecordError(f"not a system record (starts with {magic!r})")


def encode_working(due_ms: int, offset: int, message: bytes | memoryview) -> bytes:
    return _WORKING_HEAD.pack(due_ms, offset) + bytes(message)


def decode_working(body: bytes) -> tuple[int, int, bytes]:
    if len(body) < _WORKING_HEAD.size:
        raise SystemRecordError("working-set record shorter than its header")
    due, offset = _WORKING_HEAD.unpack_from(body, 0)
    return due, offset, body[_WORKING_HEAD.size :]


@dataclass(frozen=True, slots=True)
class TimerEntry:
    msg_id: bytes
    due_ms: int
    offset: int
    message: bytes


def encode_timer_object(hour: int, entries: list[TimerEntry]) -> bytes:
    parts = [_TIMER_HEAD.pack(TIMER_MAGIC, TIMER_VERSION, hour, len(entries))]
    for e in entries:
        parts.append(_TIMER_ENTRY.pack(e.msg_id, e.due_ms, e.offset, len(e.message)))
        parts.append(e.message)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode_timer_object(data: bytes) -> tuple[int, list[TimerEntry]]:
    """(hour, entries); SystemRecordError when the object is damaged in any way."""
    if len(data) < _TIMER_HEAD.size + _CRC.size:
        raise SystemRecordError("timer object shorter than its header")
    body, (crc,) = data[:-4], _CRC.unpack_from(data, len(data) - 4)
    if zlib.crc32(body) != crc:
        raise SystemRecordError("timer object CRC mismatch")
    magic, version, hour, count = _TIMER_HEAD.unpack_from(body, 0)
    if magic != TIMER_MAGIC or version != TIMER_VERSION:
        raise SystemRecordError(f"not a timer object (magic {magic!r}, version {version})")
    pos = _TIMER_HEAD.size
    entries = []
    for _ in range(count):
        if pos + _TIMER_ENTRY.size > len(body):
            raise SystemRecordError("timer object ends inside an entry")
        msg_id, due, offset, length = _TIMER_ENTRY.unpack_from(body, pos)
        pos += _TIMER_ENTRY.size
        if pos + length > len(body):
            raise SystemRecordError("timer object ends inside a message")
        entries.append(TimerEntry(msg_id, due, offset, body[pos : pos + length]))
        pos += length
    if pos != len(body):
        raise SystemRecordError("bytes after the last timer entry")
    return hour, entries
