"""The delay properties of a published message, and splitting a Publish frame of a delayed
stream into what is scheduled, what is appended at once and what is refused.

A message is scheduled when its AMQP 1.0 application properties hold ``x-delay``
(milliseconds from acceptance, RabbitMQ's delayed-message convention) or ``x-deliver-at``
(Unix epoch milliseconds). The check is whole-message work: one ``bytes.find`` for the
property names (C speed) and an AMQP decode only of messages that contain one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tierlog.delayed.errors import DelayPropertyError, ScheduledInSubBatchError
from tierlog.errors import TierlogError
from tierlog.formats.amqp import decode_message
from tierlog.formats.chunk import SIMPLE_ENTRY_HEADER_SIZE, SUB_BATCH_HEADER, SUB_BATCH_HEADER_SIZE
from tierlog.formats.compression import decompress

DELAY = "x-delay"
DELIVER_AT = "x-deliver-at"
DELAY_MARKER = b"x-de"  # common prefix of both names: one find() rules most messages out
MAX_DELAY_MS = 366 * 86400 * 1000
"""The longest delay accepted (a year and a day): a longer one is refused, not truncated."""


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise DelayPropertyError(f"{name} must be an integer number of milliseconds")
    if isinstance(value, int):
        return value
    if isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        try:
            return int(text.strip())
        except ValueError:
            pass
    raise DelayPropertyError(f"{name} must be an integer number of milliseconds, got {value!r}")


def due_time_ms(message: bytes, now_ms: int) -> int | None:
    """The due time of a message accepted at ``now_ms``, or None when it is not scheduled.

    ``x-delay`` below 0 counts as 0 (as RabbitMQ's plugin does); ``x-deliver-at`` in the past
    is due at once (it keeps its time); both present: ``x-deliver-at`` wins."""
    if message.find(DELAY_MARKER) < 0:
        return None
    try:
        props = decode_message(message).application_properties
    except TierlogError:
        return None  # not an AMQP message: never scheduled, appended as published
    if DELIVER_AT in props:
        at = _as_int(props[DELIVER_AT], DELIVER_AT)
        if at < 0:
            raise DelayPropertyError(f"{DELIVER_AT} must not be negative, got {at}")
        if at - now_ms > MAX_DELAY_MS:
            raise DelayPropertyError(f"{DELIVER_AT} is more than {MAX_DELAY_MS} ms ahead")
        return at
    if DELAY in props:
        delay = _as_int(props[DELAY], DELAY)
        if delay > MAX_DELAY_MS:
            raise DelayPropertyError(f"{DELAY} {delay} is above the maximum {MAX_DELAY_MS} ms")
        return now_ms + max(0, delay)
    return None


def check_sub_batch(entry: bytes | memoryview) -> None:
    """Refuse a sub-batch entry holding a message with a delay property (its data is
    decompressed to look; one that cannot be decompressed is appended as published)."""
    type_byte, _records, uncompressed, length = SUB_BATCH_HEADER.unpack_from(entry, 0)
    data = entry[SUB_BATCH_HEADER_SIZE : SUB_BATCH_HEADER_SIZE + length]
    try:
        plain = bytes(decompress((type_byte >> 4) & 0x07, data, uncompressed))
    except TierlogError:
        return
    if plain.find(DELAY.encode()) >= 0 or plain.find(DELIVER_AT.encode()) >= 0:
        raise ScheduledInSubBatchError(
            "a message with x-delay / x-deliver-at inside a sub-batch entry cannot be scheduled"
        )


@dataclass(slots=True)
class SplitFrame:
    """One Publish frame of a delayed stream: indexes into the frame's messages."""

    immediate: list[int] = field(default_factory=list)
    scheduled: list[tuple[int, int, bytes]] = field(default_factory=list)  # (index, due, msg)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)


def split_entries(entries: Sequence[bytes | memoryview], now_ms: int) -> SplitFrame:
    """Sort a frame's entries (Osiris entries as published) into immediate, scheduled and
    refused."""
    out = SplitFrame()
    for i, entry in enumerate(entries):
        if entry[0] & 0x80:  # sub-batch entry
            try:
                check_sub_batch(entry)
            except ScheduledInSubBatchError as exc:
                out.refused.append((i, str(exc)))
                continue
            out.immediate.append(i)
            continue
        message = bytes(entry[SIMPLE_ENTRY_HEADER_SIZE:])
        try:
            due = due_time_ms(message, now_ms)
        except DelayPropertyError as exc:
            out.refused.append((i, str(exc)))
            continue
        if due is None:
            out.immediate.append(i)
        else:
            out.scheduled.append((i, due, message))
    return out
