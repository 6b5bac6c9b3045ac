"""Byte layouts of delayed delivery and the delay properties of a message."""

from __future__ import annotations

import pytest

from tierlog.delayed.errors import DelayPropertyError, SystemRecordError
from tierlog.delayed.pointer import decode_pointer, encode_pointer
from tierlog.delayed.properties import MAX_DELAY_MS, due_time_ms, split_entries
from tierlog.delayed.records import (
    Cancel,
    Carry,
    Checkpoint,
    Dispatch,
    Schedule,
    TimerEntry,
    decode_system_record,
    decode_timer_object,
    decode_working,
    encode_cancel,
    encode_carry,
    encode_checkpoint,
    encode_dispatch,
    encode_schedule,
    encode_timer_object,
    encode_working,
    msg_id_of,
)
from tierlog.formats.amqp import encode_message
from tierlog.formats.chunk import simple_entry

NOW = 1_800_000_000_000


def amqp(props: dict[str, object]) -> bytes:
    return encode_message(b"body", application_properties=props)


def test_system_records_round_trip() -> None:
    msg = amqp({"x-delay": 5})
    assert decode_system_record(encode_schedule(NOW, "app", 7, msg)) == Schedule(NOW, "app", 7, msg)
    ids = (msg_id_of("inc", "app", 1), msg_id_of("inc", "app", 2))
    assert decode_system_record(encode_dispatch(10, ids)) == Dispatch(10, ids)
    assert decode_system_record(encode_cancel(ids[0])) == Cancel(ids[0])
    with pytest.raises(SystemRecordError):
        decode_system_record(b"TLDD" + bytes(12) + b"short")
    with pytest.raises(SystemRecordError):
        decode_system_record(msg)  # a message, not a system record
    assert decode_working(encode_working(NOW, 3, b"m")) == (NOW, 3, b"m")


def test_msg_ids_depend_on_incarnation_reference_and_id() -> None:
    ids = {
        msg_id_of("a", "app", 1),
        msg_id_of("b", "app", 1),
        msg_id_of("a", "ap", 1),
        msg_id_of("a", "app", 2),
        msg_id_of("a", "", 1),
    }
    assert len(ids) == 5 and all(len(i) == 16 for i in ids)


def test_timer_object_detects_any_damage() -> None:
    entries = [TimerEntry(msg_id_of("i", "r", k), NOW + k, k, b"x" * k) for k in range(5)]
    data = encode_timer_object(500_000, entries)
    assert decode_timer_object(data) == (500_000, entries)
    for pos in range(0, len(data), 7):
        broken = bytearray(data)
        broken[pos] ^= 0x10
        with pytest.raises(SystemRecordError):
            decode_timer_object(bytes(broken))
    for cut in (0, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(SystemRecordError):
            decode_timer_object(data[:cut])


def test_delay_properties() -> None:
    assert due_time_ms(amqp({}), NOW) is None
    assert due_time_ms(encode_message(b"x-delay in the body only"), NOW) is None
    assert due_time_ms(amqp({"x-delay": 1500}), NOW) == NOW + 1500
    assert due_time_ms(amqp({"x-delay": "250"}), NOW) == NOW + 250
    assert due_time_ms(amqp({"x-delay": -5}), NOW) == NOW
    assert due_time_ms(amqp({"x-deliver-at": NOW + 9}), NOW) == NOW + 9
    assert due_time_ms(amqp({"x-deliver-at": NOW - 9}), NOW) == NOW - 9  # due at once
    both = amqp({"x-delay": 1, "x-deliver-at": NOW + 99})
    assert due_time_ms(both, NOW) == NOW + 99
    assert due_time_ms(b"not amqp x-delay", NOW) is None
    for bad in (
        {"x-delay": "soon"},
        {"x-delay": True},
        {"x-deliver-at": -1},
        {"x-delay": MAX_DELAY_MS + 1},
        {"x-deliver-at": NOW + MAX_DELAY_MS + 1},
    ):
        with pytest.raises(DelayPropertyError):
            due_time_ms(amqp(bad), NOW)


def test_split_entries() -> None:
    entries = [
        simple_entry(amqp({})),
        simple_entry(amqp({"x-delay": 10})),
        simple_entry(amqp({"x-delay": "x"})),
    ]
    split = split_entries(entries, NOW)
    assert split.immediate == [0]
    assert [(i, due) for i, due, _m in split.scheduled] == [(1, NOW + 10)]
    assert [i for i, _r in split.refused] == [2]


def test_checkpoint_records_golden_bytes_and_strict_decoding() -> None:
    msg_id = bytes(range(16))
    carry = encode_carry(0x0102, msg_id, NOW, 7, True, b"msg")
    assert carry == (
        b"TLDR\x01"
        + (0x0102).to_bytes(8, "big")
        + msg_id
        + NOW.to_bytes(8, "big")
        + (7).to_bytes(8, "big")
        + b"\x01"
        + b"msg"
    )
    assert decode_system_record(carry) == Carry(0x0102, msg_id, NOW, 7, True, b"msg")
    plain = encode_carry(5, msg_id, NOW, 0, False, b"")
    assert decode_system_record(plain) == Carry(5, msg_id, NOW, 0, False, b"")
    checkpoint = encode_checkpoint(0x0102, 9, 3)
    assert checkpoint == b"TLDK\x01" + (0x0102).to_bytes(8, "big") + (9).to_bytes(8, "big") + (
        3
    ).to_bytes(4, "big")
    assert decode_system_record(checkpoint) == Checkpoint(0x0102, 9, 3)
    for bad in (
        carry[:20],  # shorter than its header
        carry[:4] + b"\x02" + carry[5:],  # unknown version
        carry[:45] + b"\x03" + carry[46:],  # unknown flag bit
        checkpoint + b"\x00",  # trailing byte
        checkpoint[:-1],
        checkpoint[:4] + b"\x02" + checkpoint[5:],
        encode_checkpoint(1, 0, 0),  # next publishing id 0
    ):
        with pytest.raises(SystemRecordError):
            decode_system_record(bad)
    with pytest.raises(SystemRecordError):
        encode_carry(1, b"short", NOW, 0, False, b"")


def test_checkpoint_pointer_encoding_is_a_checked_hint() -> None:
    value = encode_pointer(10, 25)
    assert value == b"TLDP\x01" + (10).to_bytes(8, "big") + (25).to_bytes(8, "big")
    assert decode_pointer(value) == (10, 25)
    assert decode_pointer(value[:-1]) is None
    assert decode_pointer(b"XXXX" + value[4:]) is None
    assert (
        decode_pointer(encode_pointer(30, 25)) is None
    )  # a checkpoint lies at or after its through
