"""AMQP 1.0 message codec: golden bytes, round trips, rstream cross-checks, malformed input."""

from __future__ import annotations

import contextlib
import math
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.amqp import (
    EMPTY,
    Described,
    Symbol,
    Timestamp,
    decode_message,
    decode_value,
    encode_message,
    encode_value,
    looks_like_message,
)
from tierlog.formats.errors import AmqpError, AmqpTruncatedError, FormatError, TruncatedError

# What rstream's AMQPMessage(body=b"hello", properties=Properties(message_id=1, subject="s",
# content_type="text/plain", creation_time=1700000000000), application_properties={"k": "v",
# "n": 5, "f": 1.5, "b": True}, header=Header(durable=True)) serialises to.
RSTREAM_RICH = bytes.fromhex(
    "005370c00705560140404040"
    "005373c0240d53014040a101734040a30a746578742f706c61696e4040830000018bcfe56800404040"
    "005374c11d08a1016ba10176a1016e5405a10166823ff8000000000000a101625601"
    "005375a00568656c6c6f"
)


def test_golden_data_only_message() -> None:
    wire = bytes.fromhex("005375a003") + b"abc"
    message = decode_message(wire)
    assert message.body == b"abc" and message.body_kind == "data"
    assert message.properties is EMPTY and message.application_properties == {}
    assert encode_message(b"abc") == wire
    big = b"x" * 300
    assert decode_message(b"\x00\x53\x75\xb0" + struct.pack(">I", 300) + big).body == big


def test_golden_rich_message_from_rstream() -> None:
    message = decode_message(RSTREAM_RICH)
    assert message.body == b"hello"
    assert message.header == {"durable": True}
    assert message.properties == {
        "message_id": 1,
        "subject": "s",
        "content_type": "text/plain",
        "creation_time": 1_700_000_000_000,
    }
    assert isinstance(message.properties["creation_time"], Timestamp)
    assert isinstance(message.properties["content_type"], Symbol)
    assert message.application_properties == {"k": "v", "n": 5, "f": 1.5, "b": True}


def test_amqp_value_and_sequence_bodies() -> None:
    text = decode_message(encode_message(value="héllo"))
    assert text.body_kind == "value" and text.value == "héllo" and text.body == "héllo".encode()
    binary = decode_message(encode_message(value=b"\x00\x01"))
    assert binary.body == b"\x00\x01"
    mapped = decode_message(encode_message(value={"a": 1}))
    assert mapped.value == {"a": 1} and decode_value(mapped.body) == {"a": 1}
    seq = b"\x00\x53\x76" + encode_value([1, 2]) + b"\x00\x53\x76" + encode_value(["x"])
    message = decode_message(seq)
    assert message.body_kind == "sequence" and message.value == [[1, 2], ["x"]]
    multi = decode_message(encode_message([b"ab", b"cd"]))
    assert multi.body == b"abcd"


def test_symbolic_section_descriptors() -> None:
    wire = b"\x00" + encode_value(Symbol("amqp:data:binary")) + encode_value(b"zz")
    assert decode_message(wire).body == b"zz"


def test_every_primitive_type_decodes() -> None:
    cases: list[tuple[str, object]] = [
        ("40", None),
        ("41", True),
        ("42", False),
        ("5600", False),
        ("50ff", 255),
        ("60ffff", 65535),
        ("70ffffffff", 2**32 - 1),
        ("52ff", 255),
        ("43", 0),
        ("80ffffffffffffffff", 2**64 - 1),
        ("5307", 7),
        ("44", 0),
        ("51ff", -1),
        ("61fffe", -2),
        ("71fffffffd", -3),
        ("54fc", -4),
        ("81fffffffffffffffb", -5),
        ("55fa", -6),
        ("723fc00000", 1.5),
        ("823ff8000000000000", 1.5),
        ("7400000001", b"\x00\x00\x00\x01"),
        ("730001f600", "\U0001f600"),
        ("830000000000000010", 16),
        ("a1026869", "hi"),
        ("a3026869", "hi"),
        ("a0026869", b"hi"),
        ("b1000000026869", "hi"),
        ("45", []),
        ("c0050253015401", [1, 1]),
        ("c1050253015401", {1: 1}),
        ("005307a10178", Described(7, "x")),
    ]
    for hex_value, expected in cases:
        assert decode_value(bytes.fromhex(hex_value)) == expected, hex_value
    u = uuid.uuid4()
    assert decode_value(b"\x98" + u.bytes) == u
    described_array = bytes.fromhex("e007020053075401ff")
    assert decode_value(described_array) == [Described(7, 1), Described(7, -1)]


def test_array_encoding_from_the_spec() -> None:
    # array8: size 4 (count + constructor + 2 elements), count 2, smallint elements.
    assert decode_value(bytes.fromhex("e00402540a0b")) == [10, 11]
    assert decode_value(bytes.fromhex("e0020040")) == []


# ---------------------------------------------------------------- round trips

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.binary(max_size=30),
    st.uuids(),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=10).map(Symbol),
    st.integers(-(2**63), 2**63 - 1).map(Timestamp),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=12,
)
properties = st.fixed_dictionaries(
    {},
    optional={
        "message_id": st.one_of(st.integers(0, 2**64 - 1), st.text(max_size=10), st.uuids()),
        "user_id": st.binary(max_size=10),
        "to": st.text(max_size=10),
        "subject": st.text(max_size=10),
        "reply_to": st.text(max_size=10),
        "correlation_id": st.one_of(st.integers(0, 2**64 - 1), st.binary(max_size=8)),
        "content_type": st.text(alphabet=st.characters(max_codepoint=127), max_size=10),
        "content_encoding": st.sampled_from(["gzip", "utf-8"]),
        "absolute_expiry_time": st.integers(-(2**63), 2**63 - 1),
        "creation_time": st.integers(0, 2**62),
        "group_id": st.text(max_size=10),
        "group_sequence": st.integers(0, 2**32 - 1),
        "reply_to_group_id": st.text(max_size=10),
    },
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "durable": st.booleans(),
        "priority": st.integers(0, 255),
        "ttl": st.integers(0, 2**32 - 1),
        "first_acquirer": st.booleans(),
        "delivery_count": st.integers(0, 2**32 - 1),
    },
)
app_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
annotations = st.dictionaries(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=10).map(Symbol),
    app_values,
    max_size=3,
)


@given(values)
def test_values_round_trip(value: object) -> None:
    assert decode_value(encode_value(value)) == value


@given(
    st.binary(max_size=600),
    properties,
    st.dictionaries(st.text(max_size=10), app_values, max_size=5),
    headers,
    annotations,
    annotations,
)
def test_messages_round_trip(
    body: bytes,
    props: dict[str, object],
    app: dict[str, object],
    header: dict[str, object],
    message_annotations: dict[object, object],
    footer: dict[object, object],
) -> None:
    wire = encode_message(
        body,
        properties=props,
        application_properties=app,
        header=header,
        message_annotations=message_annotations,
        footer=footer,
    )
    assert looks_like_message(wire)
    message = decode_message(wire)
    assert message.body == body
    assert message.properties == props
    assert message.application_properties == app
    assert message.header == header
    assert message.message_annotations == message_annotations
    assert message.footer == footer
    assert decode_message(memoryview(wire)) == message


# ---------------------------------------------------------------- rstream cross-checks

import rstream._pyamqp.message as pyamqp_message  # noqa: E402 - dev dependency, never skipped
import rstream.amqp as rstream_amqp  # noqa: E402


def test_rstream_encoded_messages_decode_with_ours() -> None:
    Properties = pyamqp_message.Properties
    Header = pyamqp_message.Header
    message = rstream_amqp.AMQPMessage(
        body=b"hello",
        properties=Properties(
            message_id=1,
            subject="s",
            content_type="text/plain",
            creation_time=1_700_000_000_000,
        ),
        application_properties={"k": "v", "n": 5, "f": 1.5, "b": True},
        header=Header(durable=True),
    )
    assert bytes(message) == RSTREAM_RICH
    plain = rstream_amqp.AMQPMessage(body=b"x" * 100)
    assert decode_message(bytes(plain)).body == b"x" * 100


@given(
    st.binary(max_size=300),
    properties,
    st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=10), max_size=4),
)
def test_our_messages_decode_with_rstream(
    body: bytes, props: dict[str, object], app: dict[str, str]
) -> None:
    theirs = rstream_amqp.amqp_decoder(
        encode_message(body, properties=props, application_properties=app)
    )
    assert theirs.body == body
    assert {k.decode(): v.decode() for k, v in (theirs.application_properties or {}).items()} == app
    if props:
        for name, value in props.items():
            got = getattr(theirs.properties, name)
            if isinstance(value, str) and isinstance(got, bytes):
                got = got.decode()
            assert got == value, name


# ---------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"\x00",
        b"\x00\x53",
        b"\x00\x53\x75",
        b"\x00\x53\x75\xa0\x05abc",  # truncated binary
        b"\x00\x53\x75\xb0\x00\x00\x00",  # truncated length
        b"\x00\x53\x75\xa1\x02\xff\xfe",  # data section holding invalid UTF-8 string
        b"\x00\x53\x75\xa1\x02ok",  # data section that is not binary
        b"\x00\x53\x79\x40",  # not a section descriptor
        b"\x00\x53\x75\x40\x00\x53\x73\x45",  # properties after body
        b"\x00\x53\x73\x45\x00\x53\x73\x45\x00\x53\x75\xa0\x00",  # properties twice
        b"\x00\x53\x75\xa0\x00\x00\x53\x77\x40",  # data body then value body
        b"\x00\x53\x74\xc1\x03\x01\xa1\x00",  # map with odd count
        b"\x00\x53\x74\xc1\x05\x02\x54\x01\x54\x02",  # non-string app-property key
        b"\x00\x53\x73\xc0\x10\x0e" + b"\x40" * 14,  # 14 property fields (13 allowed)
        b"\x00\x53\x70\xa0\x00",  # header that is not a list
        b"\x00\x53\x77\xff",  # unknown constructor
        b"\x00\x53\x77\x56\x02",  # boolean 2
        b"\x00\x53\x77\x73\x00\x11\x00\x00",  # char beyond Unicode
        b"\x00\x53\x77\xc0\x02\x05\x40",  # list count larger than its size
        b"\x00\x53\x77\xc0\x03\x01\x40\x40",  # list size larger than its items
        b"\x00\x53\x77\xe0\x03\x01\xff\x00",  # array of unknown constructor
        b"\x00\x53\x77\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40",  # huge null array
        b"\x00\x53\x77\xc1\x05\x02\x45\x40\x40",  # unhashable map key (list)
        b"\x41",  # not a described section
        b"\x00\x53\x77" + b"\xc0\x01\x01" * 40,  # nested too deeply / truncated
    ],
)
def test_malformed_messages_raise_typed_errors(wire: bytes) -> None:
    with pytest.raises(AmqpError):
        decode_message(wire)


def test_deep_nesting_is_rejected_not_a_recursion_error() -> None:
    value = b"\x40"
    for _ in range(200):
        value = b"\xd0" + struct.pack(">II", len(value) + 4, 1) + value
    with pytest.raises(AmqpError, match="deeply"):
        decode_message(b"\x00\x53\x77" + value)


def test_truncation_is_a_truncated_error() -> None:
    with pytest.raises(AmqpTruncatedError) as info:
        decode_message(encode_message(b"abcdef")[:-1])
    assert isinstance(info.value, TruncatedError) and isinstance(info.value, FormatError)


def test_encoder_rejects_bad_input() -> None:
    with pytest.raises(AmqpError):
        encode_message(properties={"nope": 1})
    with pytest.raises(AmqpError):
        encode_message(b"x", value=1)
    with pytest.raises(AmqpError):
        encode_value(object())
    with pytest.raises(AmqpError):
        encode_message(header={"priority": 300})
    assert not looks_like_message(b"plain bytes")
    assert math.isnan(decode_value(encode_value(float("nan"))))  # type: ignore[arg-type]


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_amqp_errors(data: bytes) -> None:
    for wire in (data, b"\x00\x53\x77" + data, b"\x00\x53\x73" + data):
        with contextlib.suppress(AmqpError):
            decode_message(wire)


@given(
    st.binary(max_size=50),
    properties,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_mutated_messages_raise_only_amqp_errors(
    body: bytes, props: dict[str, object], edits: list[tuple[int, int]]
) -> None:
    wire = bytearray(encode_message(body, properties=props, application_properties={"a": 1}))
    for pos, byte in edits:
        wire[pos % len(wire)] = byte
    with contextlib.suppress(AmqpError):
        decode_message(bytes(wire))
