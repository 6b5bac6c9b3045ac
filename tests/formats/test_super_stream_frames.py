"""Golden bytes of the super-stream frames, written by hand from PROTOCOL.adoc
(``deps/rabbitmq_stream/docs/PROTOCOL.adoc`` in rabbitmq-server): CreateSuperStream
(0x001d), DeleteSuperStream (0x001e), Route (0x0018), Partitions (0x0019) and their
responses. Each frame: uint32 size, then Key Version CorrelationId and the fields."""

from __future__ import annotations

import pytest

from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command, ResponseCode

# CreateSuperStream => Key Version CorrelationId Name [Partition] [BindingKey] Arguments
CREATE_SUPER_STREAM = bytes.fromhex(
    "0000004b"  # size 75
    "001d" "0001" "00000007"  # key 0x001d, version 1, correlation 7
    "0008" "696e766f69636573"  # Name "invoices"
    "00000002" "000a" "696e766f696365732d30" "000a" "696e766f696365732d31"  # partitions
    "00000002" "0002" "6575" "0002" "7573"  # binding keys "eu", "us"
    "00000001" "0007" "6d61782d616765" "0002" "3768"  # arguments {"max-age": "7h"}
)  # fmt: skip

# Delete => Key Version CorrelationId Name (key 0x001e)
DELETE_SUPER_STREAM = bytes.fromhex(
    "00000012" "001e" "0001" "00000008" "0008" "696e766f69636573"
)  # fmt: skip

# RouteQuery => Key Version CorrelationId RoutingKey SuperStream
ROUTE = bytes.fromhex(
    "00000016" "0018" "0001" "00000009" "0002" "6575" "0008" "696e766f69636573"
)  # fmt: skip

# PartitionsQuery => Key Version CorrelationId SuperStream
PARTITIONS = bytes.fromhex(
    "00000012" "0019" "0001" "0000000a" "0008" "696e766f69636573"
)  # fmt: skip

# RouteResponse => Key Version CorrelationId ResponseCode [Stream]
ROUTE_RESPONSE = bytes.fromhex(
    "0000001a" "8018" "0001" "00000009" "0001" "00000001" "000a" "696e766f696365732d30"
)  # fmt: skip
ROUTE_NO_MATCH = bytes.fromhex("0000000e" "8018" "0001" "00000009" "0001" "00000000")  # fmt: skip

# PartitionsResponse => Key Version CorrelationId ResponseCode [Stream]
PARTITIONS_RESPONSE = bytes.fromhex(
    "00000026" "8019" "0001" "0000000a" "0001" "00000002"
    "000a" "696e766f696365732d30" "000a" "696e766f696365732d31"
)  # fmt: skip
PARTITIONS_MISSING = bytes.fromhex(
    "0000000e" "8019" "0001" "0000000a" "0002" "00000000"
)  # fmt: skip

# Both super-stream management responses: Key Version CorrelationId ResponseCode
CREATE_SUPER_STREAM_EXISTS = bytes.fromhex("0000000a" "801d" "0001" "00000007" "0005")  # fmt: skip
DELETE_SUPER_STREAM_OK = bytes.fromhex("0000000a" "801e" "0001" "00000008" "0001")  # fmt: skip


CLIENT_FRAMES = [
    (
        CREATE_SUPER_STREAM,
        c.CreateSuperStreamRequest(
            7, "invoices", ("invoices-0", "invoices-1"), ("eu", "us"), {"max-age": "7h"}
        ),
    ),
    (DELETE_SUPER_STREAM, c.DeleteSuperStreamRequest(8, "invoices")),
    (ROUTE, c.RouteRequest(9, "eu", "invoices")),
    (PARTITIONS, c.PartitionsRequest(10, "invoices")),
]

SERVER_FRAMES = [
    (ROUTE_RESPONSE, c.RouteResponse(9, ResponseCode.OK, ["invoices-0"])),
    (ROUTE_NO_MATCH, c.RouteResponse(9, ResponseCode.OK, [])),
    (PARTITIONS_RESPONSE, c.PartitionsResponse(10, ResponseCode.OK, ["invoices-0", "invoices-1"])),
    (PARTITIONS_MISSING, c.PartitionsResponse(10, ResponseCode.STREAM_DOES_NOT_EXIST, [])),
    (
        CREATE_SUPER_STREAM_EXISTS,
        c.SimpleResponse(Command.CREATE_SUPER_STREAM, 7, ResponseCode.STREAM_ALREADY_EXISTS),
    ),
    (DELETE_SUPER_STREAM_OK, c.SimpleResponse(Command.DELETE_SUPER_STREAM, 8, ResponseCode.OK)),
]


def test_golden_sizes_are_the_bodies() -> None:
    for golden, _ in CLIENT_FRAMES + SERVER_FRAMES:
        assert int.from_bytes(golden[:4], "big") == len(golden) - 4


@pytest.mark.parametrize(("golden", "message"), CLIENT_FRAMES)
def test_client_frames_decode_and_encode_byte_for_byte(golden: bytes, message: object) -> None:
    assert c.decode_client_frame(golden[4:]) == message
    assert message.encode() == golden  # type: ignore[attr-defined]


@pytest.mark.parametrize(("golden", "message"), SERVER_FRAMES)
def test_server_frames_encode_byte_for_byte(golden: bytes, message: object) -> None:
    assert message.encode() == golden  # type: ignore[attr-defined]
    assert c.decode_server_frame(golden[4:]) == message
