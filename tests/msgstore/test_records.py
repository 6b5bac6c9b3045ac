"""Golden bytes and properties of every message-store record type, the hole rule and the
Erlang term / ets:tab2file decoders."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats import msgstore as fmt
from tierlog.formats.erlang_term import Atom, Opaque, decode
from tierlog.formats.errors import (
    CleanFileError,
    ErlangTermError,
    EtsFileError,
    MsgIdMismatchError,
    MsgStoreRecordSizeError,
    NotAMessageError,
    RecordChecksumError,
    SegmentHeaderError,
    TornRecordError,
    TruncatedTermError,
    UnknownRecordTypeError,
    V1RecordError,
    ZeroFilledRegionError,
)
from tierlog.formats.ets_file import read_msg_locations
from tierlog.formats.msgstore_clean import CleanEntry, decode_clean, encode_clean

MSG_ID = bytes(range(16))


def test_header_golden() -> None:
    header = fmt.encode_header()
    assert header == b"TLMS\x02" + bytes(59)
    assert len(header) == fmt.HEADER_SIZE
    fmt.check_header(header)
    assert fmt.MAGIC not in (b"RCQS", b"RCQI")
    with pytest.raises(SegmentHeaderError):
        fmt.check_header(b"RCQS\x02" + bytes(59))
    with pytest.raises(SegmentHeaderError):
        fmt.check_header(b"TLMS\x01" + bytes(59))
    with pytest.raises(TornRecordError):
        fmt.check_header(header[:10])


def test_small_hole_golden() -> None:
    assert fmt.hole_marker(1) == b"\x01"
    assert fmt.hole_marker(4) == b"\x01\x01\x01\x01"
    assert fmt.hole_marker(0) == b""


def test_hole_golden() -> None:
    assert fmt.hole_marker(5) == b"\x02\x00\x00\x00\x05"
    assert fmt.hole_marker(70000) == b"\x02\x00\x01\x11\x70"
    assert fmt.encode_hole(7) == b"\x02\x00\x00\x00\x07\x00\x00"
    assert fmt.encode_hole(6, b"\xff") == b"\x02\x00\x00\x00\x06\xff"


def test_message_golden() -> None:
    record = fmt.encode_message(MSG_ID, b"hi", checksum=False)
    assert record == b"\x03\x00\x00\x00\x17" + MSG_ID + b"hi"
    assert fmt.decode_message(record) == (MSG_ID, memoryview(b"hi"))
    empty = fmt.encode_message(MSG_ID, b"", checksum=False)
    assert len(empty) == fmt.MESSAGE_MIN == 21


def test_message_with_checksum_golden() -> None:
    record = fmt.encode_message(MSG_ID, b"hi")
    crc = zlib.crc32(MSG_ID + b"hi")
    assert record == b"\x04\x00\x00\x00\x1b" + MSG_ID + struct.pack(">I", crc) + b"hi"
    msg_id, body = fmt.decode_message(record, expected_id=MSG_ID)
    assert (msg_id, bytes(body)) == (MSG_ID, b"hi")


def test_v1_record_golden() -> None:
    record = fmt.encode_v1_record(MSG_ID, b"body")
    assert record == struct.pack(">Q", 20) + MSG_ID + b"body" + b"\xff"
    assert len(fmt.encode_v1_record(MSG_ID, b"")) == 25  # the seed's overhead table
    assert bytes(fmt.decode_v1_record(record)[1]) == b"body"
    with pytest.raises(V1RecordError):
        fmt.decode_v1_record(record[:-1] + b"\x00")
    with pytest.raises(V1RecordError):
        fmt.decode_v1_record(record[:-2])


@pytest.mark.parametrize("body_len", [0, 64, 1024, 4 * 1024 * 1024])
def test_overhead_vs_v1(body_len: int) -> None:
    """The seed's table: a plain MESSAGE is 4 bytes smaller than a v1 record."""
    assert fmt.message_size(body_len, checksum=False) == body_len + 25 - 4


@given(st.binary(min_size=16, max_size=16), st.binary(max_size=5000), st.booleans())
def test_message_roundtrip(msg_id: bytes, body: bytes, checksum: bool) -> None:
    record = fmt.encode_message(msg_id, body, checksum=checksum)
    assert len(record) == fmt.message_size(len(body), checksum=checksum)
    got_id, got_body = fmt.decode_message(record, expected_id=msg_id)
    assert got_id == msg_id and bytes(got_body) == body


@given(st.binary(min_size=1, max_size=300), st.data())
def test_checksum_catches_every_bit_flip(body: bytes, data: st.DataObject) -> None:
    record = bytearray(fmt.encode_message(MSG_ID, body))
    bit = data.draw(st.integers(5 * 8, len(record) * 8 - 1))
    record[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises((RecordChecksumError, MsgIdMismatchError)):
        fmt.decode_message(bytes(record), expected_id=MSG_ID)


def test_decode_message_typed_errors() -> None:
    record = fmt.encode_message(MSG_ID, b"abc")
    with pytest.raises(TornRecordError):
        fmt.decode_message(record[:10])
    with pytest.raises(MsgStoreRecordSizeError):
        fmt.decode_message(record + b"x")
    with pytest.raises(MsgIdMismatchError):
        fmt.decode_message(record, expected_id=bytes(16))
    with pytest.raises(NotAMessageError):
        fmt.decode_message(fmt.encode_hole(30))
    with pytest.raises(ZeroFilledRegionError):
        fmt.decode_message(bytes(30))
    with pytest.raises(UnknownRecordTypeError):
        fmt.decode_message(b"\x05" + record[1:])
    with pytest.raises(ValueError):
        fmt.encode_message(b"short", b"")


@pytest.mark.parametrize("gap", range(0, 600))
def test_hole_rule_every_small_gap(gap: int) -> None:
    """Every gap is representable and scans as exactly its size in holes."""
    hole = fmt.encode_hole(gap)
    assert len(hole) == gap
    if 0 < gap < 5:
        assert hole == b"\x01" * gap
    records: list[fmt.Record] = []
    stop = fmt.scan_block(hole, 0, 0, gap, records)
    assert stop.position == gap and not stop.torn
    assert sum(r.size for r in records) == gap
    assert all(r.msg_id is None for r in records)
    assert len(records) == (gap if gap < 5 else 1)


@given(st.integers(5, fmt.MAX_RECORD_SIZE))
def test_hole_rule_any_gap(gap: int) -> None:
    marker = fmt.hole_marker(gap)
    assert marker[0] == fmt.HOLE and struct.unpack(">I", marker[1:])[0] == gap
    records: list[fmt.Record] = []
    stop = fmt.scan_block(marker, 0, 0, gap, records)  # inner bytes never needed
    assert records == [fmt.Record(0, fmt.HOLE, gap, None)]
    assert stop.position == gap and stop.need == 0


def test_hole_rule_rejects_impossible_gaps() -> None:
    with pytest.raises(MsgStoreRecordSizeError):
        fmt.hole_marker(-1)
    with pytest.raises(MsgStoreRecordSizeError):
        fmt.hole_marker(fmt.MAX_RECORD_SIZE + 1)


# ---------------------------------------------------------------- Erlang terms (golden bytes
# from term_to_binary on Erlang/OTP 25)

MSG_LOCATION = bytes.fromhex(
    "83680664000c6d73675f6c6f636174696f6e6d0000000301020361006107620000012c6e0500141a99be1c"
)
MIXED_LIST = bytes.fromhex(
    "836c00000006640001616b00026162463ff800000000000062fffffffb6200011170740000000164"
    "00016b640001766a"
)
PID = bytes.fromhex("835864000d6e6f6e6f6465406e6f686f7374000000090000000000000000")
REF = bytes.fromhex("835a000364000d6e6f6e6f6465406e6f686f7374000000000002b5fa20880002d1431286")


def test_erlang_terms_golden() -> None:
    assert decode(MSG_LOCATION) == (Atom("msg_location"), b"\x01\x02\x03", 0, 7, 300, 123456789012)
    assert decode(MIXED_LIST) == [Atom("a"), [97, 98], 1.5, -5, 70000, {Atom("k"): Atom("v")}]
    assert isinstance(decode(PID), Opaque) and decode(PID).tag == 88
    assert isinstance(decode(REF), Opaque) and decode(REF).raw == REF[1:]


def test_erlang_term_typed_errors() -> None:
    with pytest.raises(TruncatedTermError):
        decode(MSG_LOCATION[:-3])
    with pytest.raises(ErlangTermError):
        decode(b"\x82" + MSG_LOCATION[1:])
    with pytest.raises(ErlangTermError):
        decode(MSG_LOCATION + b"\x00")
    with pytest.raises(ErlangTermError):
        decode(b"\x83\xff")


def _ets_item(term: bytes) -> bytes:
    return struct.pack(">I", len(term)) + b"bWLA" + term


def _ets_dump(objects: list[bytes], count: int) -> bytes:
    info = bytes([131, 104, 1, 104, 2, 100, 0, 4]) + b"size" + bytes([97, len(objects)])
    end = (
        bytes([131, 108, 0, 0, 0, 2, 100, 0, 13])
        + b"$end_of_table"
        + bytes([108, 0, 0, 0, 1, 104, 2, 100, 0, 5])
        + b"count"
        + bytes([97, count, 106, 106])
    )
    items = [_ets_item(info), *(_ets_item(o) for o in objects), _ets_item(end)]
    return b"\x01\x02\x03\x04\x63\x58\x4d\x0b" + b"".join(items)


def test_ets_dump_golden() -> None:
    locations = read_msg_locations(_ets_dump([MSG_LOCATION], 1))
    loc = locations[b"\x01\x02\x03"]
    assert (loc.ref_count, loc.file, loc.offset, loc.total_size) == (0, 7, 300, 123456789012)


def test_ets_dump_typed_errors() -> None:
    good = _ets_dump([MSG_LOCATION], 1)
    with pytest.raises(EtsFileError):
        read_msg_locations(_ets_dump([MSG_LOCATION], 2))  # count mismatch
    with pytest.raises(EtsFileError):
        read_msg_locations(good[:-5])
    with pytest.raises(EtsFileError):
        read_msg_locations(good[:4] + b"\x06\x07\x08\x09" + good[8:])  # never closed
    with pytest.raises(EtsFileError):
        read_msg_locations(b"junk" + good[4:])


@given(
    st.lists(
        st.tuples(
            st.binary(min_size=16, max_size=16),
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**32 - 1),
        ),
        max_size=20,
    ),
    st.one_of(st.none(), st.integers(0, 2**40)),
)
def test_clean_file_roundtrip(
    raw: list[tuple[bytes, int, int, int, int]], last: int | None
) -> None:
    entries = [CleanEntry(*e) for e in raw]
    data = encode_clean(last, entries)
    state = decode_clean(data)
    assert state.last_v1_file == last and state.entries == entries
    with pytest.raises(CleanFileError):
        decode_clean(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CleanFileError):
        decode_clean(data[:-5])
