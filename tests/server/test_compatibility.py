"""What the handshake tells clients is true: the announced RabbitMQ version, the
ExchangeCommandVersions answer (golden bytes), and the answers to the commands tierlog
does not serve yet (docs/compatibility.md)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.tierlog_server import (  # noqa: F401
    RawClient,
    TierlogServerProcess,
    running_server,
    session_tierlog_server,
)
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import Command, OffsetType, ResponseCode
from tierlog.formats.protocol.wire import encode_string
from tierlog.server.handlers.handshake import exchange_versions_answer

HOST = "127.0.0.1"

# Key Version CorrelationId ResponseCode [Command Key MinVersion MaxVersion] (PROTOCOL.adoc),
# by hand: the keys RabbitMQ lists, less ResolveOffsetSpec; Publish up to version 2
# (filtering), as RabbitMQ's.
GOLDEN_EXCHANGE_VERSIONS_7 = bytes.fromhex(
    "00000080801b0001000000070001"  # size 128, key 0x801b, v1, correlation 7, OK
    "00000013"  # 19 commands
    "000100010001000200010002000500010001"
    "000600010001000700010001000900010001"
    "000a00010001000b00010001000c00010001"
    "000d00010001000e00010001000f00010001"
    "001600010001001700010001"
    "001800010001001900010001001c00010001"  # Route, Partitions, StreamStats
    "001d00010001001e00010001"  # CreateSuperStream, DeleteSuperStream
)
"""The answer with correlation id 7, byte by byte: (1,1,1) (2,1,2) (5..7) (9..15) (22,1,1)
(23,1,1) (24,1,1) (25,1,1) (28,1,1) (29,1,1) (30,1,1)."""


def _golden_exchange_versions(correlation_id: int) -> bytes:
    entries = [(1, 1, 1), (2, 1, 2), (5, 1, 1), (6, 1, 1), (7, 1, 1), (9, 1, 1)]
    entries += [(10, 1, 1), (11, 1, 1), (12, 1, 1), (13, 1, 1), (14, 1, 1), (15, 1, 1)]
    entries += [(0x16, 1, 1), (0x17, 1, 1), (0x18, 1, 1), (0x19, 1, 1), (0x1C, 1, 1)]
    entries += [(0x1D, 1, 1), (0x1E, 1, 1)]
    body = struct.pack(">HHIHi", 0x801B, 1, correlation_id, 1, len(entries))
    body += b"".join(struct.pack(">HHH", *entry) for entry in entries)
    return struct.pack(">I", len(body)) + body


def test_exchange_command_versions_answer_golden_bytes() -> None:
    assert _golden_exchange_versions(7) == GOLDEN_EXCHANGE_VERSIONS_7
    assert exchange_versions_answer(7) == GOLDEN_EXCHANGE_VERSIONS_7


@pytest.fixture
def open_client(session_tierlog_server: TierlogServerProcess) -> Iterator[RawClient]:  # noqa: F811
    client = RawClient(HOST, session_tierlog_server.stream_port)
    assert client.handshake() == ResponseCode.OK
    client.sock.settimeout(5)
    try:
        yield client
    finally:
        client.close()


def test_peer_properties_announce_a_rabbitmq_version(
    session_tierlog_server: TierlogServerProcess,  # noqa: F811
) -> None:
    client = RawClient(HOST, session_tierlog_server.stream_port)
    try:
        client.send(c.PeerPropertiesRequest(1, {"product": "raw"}).encode())
        answer = client.expect(c.PeerPropertiesResponse)
        assert isinstance(answer, c.PeerPropertiesResponse)
        # below 3.11.0: no single active consumer / super streams; below 3.13.0: no
        # filtering and no CreateSuperStream (clients gate those on this number)
        assert answer.properties["version"] == "3.10.0"
        assert answer.properties["product"] == "tierlog"
        assert answer.properties["tierlog_version"]
    finally:
        client.close()


def test_exchange_command_versions_served_as_advertised(open_client: RawClient) -> None:
    publish_up_to_2 = [c.CommandVersion(Command.PUBLISH, 1, 2)]  # what rstream sends
    open_client.send(c.ExchangeCommandVersionsRequest(9, publish_up_to_2).encode())
    answer = open_client.expect(c.ExchangeCommandVersionsResponse)
    assert isinstance(answer, c.ExchangeCommandVersionsResponse)
    assert answer.encode() == _golden_exchange_versions(9)
    publish = answer.versions[Command.PUBLISH - 1]  # how rstream reads it
    assert (publish.key, publish.min_version, publish.max_version) == (Command.PUBLISH, 1, 2)


def _bare(key: int, correlation_id: int, body: bytes) -> bytes:
    payload = struct.pack(">HHI", key, 1, correlation_id) + body
    return struct.pack(">I", len(payload)) + payload


def _no_map() -> bytes:
    return struct.pack(">i", 0)


UNSUPPORTED = {
    "resolve_offset_spec": _bare(
        Command.RESOLVE_OFFSET_SPEC, 15, encode_string("s") + struct.pack(">H", 1) + _no_map()
    ),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_command_answers_unknown_frame(open_client: RawClient, name: str) -> None:
    frame = UNSUPPORTED[name]
    key, correlation_id = struct.unpack_from(">H2xI", frame, 4)
    open_client.send(frame)
    assert not open_client.frames
    # Key|0x8000 Version CorrelationId ResponseCode, read raw: the client-side codec
    # does not know every one of these responses.
    expected = struct.pack(">IHHIH", 10, key | 0x8000, 1, correlation_id, 0x0D)
    raw = b""
    while len(raw) < len(expected):
        chunk = open_client.sock.recv(len(expected) - len(raw))
        assert chunk, "connection closed"
        raw += chunk
    assert raw == expected
    # the connection stays usable
    open_client.send(c.MetadataRequest(open_client.next_corr(), ["x"]).encode())
    assert isinstance(open_client.expect(c.MetadataResponse), c.MetadataResponse)


def test_stream_stats_error_carries_the_empty_map(open_client: RawClient) -> None:
    """As RabbitMQ's: the Node.js client reads the statistics map of an error answer too."""
    open_client.send(c.StreamStatsRequest(21, "no-such-stream").encode())
    expected = struct.pack(">IHHIHi", 14, 0x801C, 1, 21, ResponseCode.STREAM_DOES_NOT_EXIST, 0)
    raw = b""
    while len(raw) < len(expected):
        chunk = open_client.sock.recv(len(expected) - len(raw))
        assert chunk, "connection closed"
        raw += chunk
    assert raw == expected


def test_unsolicited_consumer_update_answer_is_ignored(open_client: RawClient) -> None:
    """A ConsumerUpdate answer with no ConsumerUpdate asked (no such correlation id):
    ignored like any unexpected response, as RabbitMQ does; the connection goes on."""
    answer = c.ConsumerUpdateResponse(
        77, ResponseCode.OK, c.WireOffsetSpec(OffsetType.NONE, 0)
    ).encode()
    open_client.send(answer)
    corr = open_client.next_corr()
    open_client.send(c.MetadataRequest(corr, ["x"]).encode())
    metadata = open_client.expect(c.MetadataResponse)
    assert isinstance(metadata, c.MetadataResponse) and metadata.correlation_id == corr


def test_handshake_deadline_closes_without_a_close_frame(tmp_path: Path) -> None:
    """RabbitMQ closes a connection that does not finish its handshake in time without a
    Close frame; a client mid-handshake cannot answer one (the Node.js client reported it
    as 'Unknown response 22')."""
    config = "[tier]\nenabled = false\n[limits]\nhandshake_timeout_seconds = 1\n"
    with running_server(tmp_path / "data", config_text=config) as server:
        client = RawClient(HOST, server.stream_port, timeout=10)
        try:
            client.send(c.PeerPropertiesRequest(1, {"product": "raw"}).encode())
            assert isinstance(client.expect(c.PeerPropertiesResponse), c.PeerPropertiesResponse)
            received = []
            while (frame := client.recv_frame()) is not None:
                received.append(frame)
            assert received == []
        finally:
            client.close()
