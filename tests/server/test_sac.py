"""Single active consumer against a real ``tierlog serve``, frame by frame (raw clients):
ConsumerUpdate and its answer (golden bytes from PROTOCOL.adoc), the first consumer active
and the others silent, the next one activated when the active one's connection ends,
starting where its answer says, and a client that never answers disconnected."""

from __future__ import annotations

import struct
import time
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
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.publish import encode_publish

HOST = "127.0.0.1"
NONE = c.WireOffsetSpec(OffsetType.NONE)
FIRST = c.WireOffsetSpec(OffsetType.FIRST)

# ConsumerUpdateQuery => Key Version CorrelationId SubscriptionId Active (PROTOCOL.adoc)
GOLDEN_UPDATE_ACTIVE = bytes.fromhex("0000000a001a0001000000050301")
GOLDEN_UPDATE_INACTIVE = bytes.fromhex("0000000a001a0001000000060300")
# ConsumerUpdateResponse => Key Version CorrelationId ResponseCode OffsetSpecification
ANSWER_NEXT_NODE = bytes.fromhex("0000000c801a00010000000500010003")
ANSWER_NEXT_RSTREAM = bytes.fromhex("00000014801a00010000000500010003" + "00" * 8)
ANSWER_NONE = bytes.fromhex("0000000c801a00010000000700010000")
ANSWER_OFFSET = bytes.fromhex("00000014801a00010000000800010004000000000000002a")
ANSWER_TIMESTAMP = bytes.fromhex("00000014801a000100000009000100050000018bcfe56800")


def test_consumer_update_golden_bytes() -> None:
    assert c.ConsumerUpdateRequest(5, 3, True).encode() == GOLDEN_UPDATE_ACTIVE
    assert c.ConsumerUpdateRequest(6, 3, False).encode() == GOLDEN_UPDATE_INACTIVE
    assert c.decode_server_frame(GOLDEN_UPDATE_ACTIVE[4:]) == c.ConsumerUpdateRequest(5, 3, True)


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (ANSWER_NEXT_NODE, c.WireOffsetSpec(OffsetType.NEXT)),  # Node.js: the type alone
        (ANSWER_NEXT_RSTREAM, c.WireOffsetSpec(OffsetType.NEXT)),  # rstream: + 8 bytes
        (ANSWER_NONE, NONE),  # 0: keep the Subscribe's spec
        (ANSWER_OFFSET, c.WireOffsetSpec(OffsetType.OFFSET, 42)),
        (ANSWER_TIMESTAMP, c.WireOffsetSpec(OffsetType.TIMESTAMP, 1700000000000)),
    ],
)
def test_consumer_update_answer_both_encodings(frame: bytes, expected: c.WireOffsetSpec) -> None:
    answer = c.decode_client_frame(frame[4:])
    assert isinstance(answer, c.ConsumerUpdateResponse)
    assert (answer.response_code, answer.offset_spec) == (ResponseCode.OK, expected)


def _client(server: TierlogServerProcess) -> RawClient:
    client = RawClient(HOST, server.stream_port)
    assert client.handshake() == ResponseCode.OK
    client.sock.settimeout(5)
    return client


@pytest.fixture
def clients(session_tierlog_server: TierlogServerProcess) -> Iterator[list[RawClient]]:  # noqa: F811
    opened = [_client(session_tierlog_server) for _ in range(3)]
    try:
        yield opened
    finally:
        for client in opened:
            client.close()


def _ok(client: RawClient, request: object) -> None:
    client.send(request.encode())  # type: ignore[attr-defined]
    answer = client.expect(c.SimpleResponse)
    assert isinstance(answer, c.SimpleResponse)
    assert answer.response_code == ResponseCode.OK, answer


def _subscribe_sac(client: RawClient, stream: str, sid: int, name: str = "grp") -> None:
    props = {"single-active-consumer": "true", "name": name}
    _ok(client, c.SubscribeRequest(client.next_corr(), sid, stream, FIRST, 10, props))


def _publish(client: RawClient, stream: str, count: int, first_id: int = 1) -> None:
    if first_id == 1:
        _ok(client, c.DeclarePublisherRequest(client.next_corr(), 9, None, stream))
    client.send(encode_publish(9, [(first_id + i, b"m%d" % i) for i in range(count)]))
    client.expect(c.PublishConfirm)


def _offsets(client: RawClient, count: int) -> list[int]:
    """Record offsets of Deliver frames until ``count`` were seen."""
    seen: list[int] = []
    while len(seen) < count:
        frame = client.expect(c.Deliver)
        assert isinstance(frame, c.Deliver)
        chunk = bytes(frame.chunk)
        records = struct.unpack_from(">I", chunk, 4)[0]
        first = struct.unpack_from(">Q", chunk, 24)[0]
        seen.extend(range(first, first + records))
    return seen


def _silent(client: RawClient, seconds: float = 0.5) -> bool:
    """True when the server sends this client nothing for ``seconds``."""
    client.sock.settimeout(seconds)
    try:
        frame = client.recv_frame()
    except TimeoutError:
        return True
    finally:
        client.sock.settimeout(5)
    return frame is None


def test_first_active_next_takes_over_at_the_answered_offset(clients: list[RawClient]) -> None:
    a, b, producer = clients
    stream = "sac-raw-handover"
    _ok(producer, c.CreateRequest(producer.next_corr(), stream, {}))
    _publish(producer, stream, 5)
    _subscribe_sac(a, stream, 1)
    update = a.expect(c.ConsumerUpdateRequest)
    assert isinstance(update, c.ConsumerUpdateRequest)
    assert (update.subscription_id, update.active) == (1, True)
    assert _silent(a, 0.3)  # nothing delivered before the answer
    a.send(c.ConsumerUpdateResponse(update.correlation_id, ResponseCode.OK, NONE).encode())
    assert _offsets(a, 5) == [0, 1, 2, 3, 4]  # type 0: the Subscribe's FIRST
    _subscribe_sac(b, stream, 4)
    _publish(producer, stream, 3, first_id=6)
    assert _offsets(a, 3) == [5, 6, 7]
    assert _silent(b)  # waiting: no ConsumerUpdate, no Deliver
    a.close()  # the active consumer's connection ends
    update = b.expect(c.ConsumerUpdateRequest)
    assert isinstance(update, c.ConsumerUpdateRequest)
    assert (update.subscription_id, update.active) == (4, True)
    at_six = c.WireOffsetSpec(OffsetType.OFFSET, 6)  # "my stored offset + 1"
    b.send(c.ConsumerUpdateResponse(update.correlation_id, ResponseCode.OK, at_six).encode())
    got = _offsets(b, 2)
    assert got[got.index(6) :] == [6, 7]  # from the answered offset on (its chunk is sent whole)


def test_unsubscribe_of_the_active_activates_the_next_and_no_name_is_refused(
    clients: list[RawClient],
) -> None:
    a, b, producer = clients
    stream = "sac-raw-unsubscribe"
    _ok(producer, c.CreateRequest(producer.next_corr(), stream, {}))
    sac_no_name = {"single-active-consumer": "true"}
    a.send(c.SubscribeRequest(a.next_corr(), 2, stream, FIRST, 10, sac_no_name).encode())
    refused = a.expect(c.SimpleResponse)
    assert isinstance(refused, c.SimpleResponse)
    assert refused.response_code == ResponseCode.PRECONDITION_FAILED
    _subscribe_sac(a, stream, 1)
    first = a.expect(c.ConsumerUpdateRequest)
    assert isinstance(first, c.ConsumerUpdateRequest) and first.active
    a.send(c.ConsumerUpdateResponse(first.correlation_id, ResponseCode.OK, NONE).encode())
    _subscribe_sac(b, stream, 1)
    _subscribe_sac(b, stream, 2, name="other")  # another group: active at once
    other = b.expect(c.ConsumerUpdateRequest)
    assert isinstance(other, c.ConsumerUpdateRequest) and other.subscription_id == 2
    _ok(a, c.UnsubscribeRequest(a.next_corr(), 1))
    update = b.expect(c.ConsumerUpdateRequest)
    assert isinstance(update, c.ConsumerUpdateRequest)
    assert (update.subscription_id, update.active) == (1, True)


def test_a_client_that_never_answers_is_disconnected(tmp_path: Path) -> None:
    config = "[limits]\nrequest_timeout_seconds = 1.0\n"
    with running_server(tmp_path / "data", config_text=config) as server:
        silent, patient, producer = (_client(server) for _ in range(3))
        stream = "sac-raw-timeout"
        _ok(producer, c.CreateRequest(producer.next_corr(), stream, {}))
        _subscribe_sac(silent, stream, 1)
        asked = time.monotonic()  # the ConsumerUpdate is sent before the answer to this
        assert isinstance(silent.expect(c.ConsumerUpdateRequest), c.ConsumerUpdateRequest)
        _subscribe_sac(patient, stream, 1)
        assert silent.closed_by_server()  # never answered: disconnected, as RabbitMQ does
        assert 0.9 < time.monotonic() - asked < 4.0
        update = patient.expect(c.ConsumerUpdateRequest)  # the group moved on
        assert isinstance(update, c.ConsumerUpdateRequest) and update.active
        for client in (silent, patient, producer):
            client.close()
