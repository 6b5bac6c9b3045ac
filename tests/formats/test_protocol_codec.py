"""Stream protocol codec: golden bytes from PROTOCOL.adoc, round trips, rstream cross-checks."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.formats.errors import FormatError, TruncatedError
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import (
    SUPPORTED_VERSIONS,
    Command,
    OffsetType,
    ResponseCode,
)
from tierlog.formats.protocol.deliver import (
    Deliver,
    decode_deliver,
    deliver_prefix,
)
from tierlog.formats.protocol.errors import FrameTooLargeError, ProtocolError, TruncatedFrameError
from tierlog.formats.protocol.frames import FrameSplitter, frame_key_version
from tierlog.formats.protocol.publish import (
    PublishBatch,
    PublishConfirm,
    PublishError,
    _decode_general,
    decode_publish,
    encode_publish,
    encode_publish_confirm,
    encode_publish_entries,
    simple_entry,
    subbatch_entry,
    subbatch_records,
)


def body_of(frame: bytes) -> memoryview:
    """Split one whole encoded frame and return its body (checks the size prefix too)."""
    frames = FrameSplitter().feed(frame)
    assert len(frames) == 1
    return frames[0]


def s(text: str) -> bytes:
    """A protocol string: uint16 length + UTF-8."""
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def whole(key: int, version: int, *parts: bytes) -> bytes:
    body = struct.pack(">HH", key, version) + b"".join(parts)
    return struct.pack(">I", len(body)) + body


# ---------------------------------------------------------------- golden bytes


def test_golden_declare_publisher() -> None:
    wire = whole(0x0001, 1, struct.pack(">I", 7), b"\x03", s("ref"), s("stream"))
    decoded = c.decode_client_frame(body_of(wire))
    assert decoded == c.DeclarePublisherRequest(7, 3, "ref", "stream")
    assert decoded.encode() == wire


def test_golden_peer_properties_and_response() -> None:
    wire = whole(0x0011, 1, struct.pack(">II", 1, 1), s("product"), s("rstream"))
    assert c.decode_client_frame(body_of(wire)) == c.PeerPropertiesRequest(
        1, {"product": "rstream"}
    )
    response = c.PeerPropertiesResponse(1, ResponseCode.OK, {"product": "tierlog"})
    assert response.encode() == whole(
        0x8011, 1, struct.pack(">IHI", 1, 1, 1), s("product"), s("tierlog")
    )


@pytest.mark.parametrize(
    ("spec_bytes", "spec"),
    [
        (struct.pack(">H", 1), c.WireOffsetSpec(OffsetType.FIRST)),
        (struct.pack(">H", 2), c.WireOffsetSpec(OffsetType.LAST)),
        (struct.pack(">H", 3), c.WireOffsetSpec(OffsetType.NEXT)),
        (struct.pack(">HQ", 4, 2**64 - 1), c.WireOffsetSpec(OffsetType.OFFSET, 2**64 - 1)),
        (struct.pack(">Hq", 5, -1_000), c.WireOffsetSpec(OffsetType.TIMESTAMP, -1_000)),
    ],
)
def test_golden_subscribe_every_offset_spec(spec_bytes: bytes, spec: c.WireOffsetSpec) -> None:
    props = struct.pack(">I", 2) + s("name") + s("c1") + s("x-tierlog-overtaken") + s("skip")
    wire = whole(0x0007, 1, struct.pack(">IB", 9, 4), s("orders"), spec_bytes, b"\x00\x0a", props)
    expected = c.SubscribeRequest(
        9, 4, "orders", spec, 10, {"name": "c1", "x-tierlog-overtaken": "skip"}
    )
    assert c.decode_client_frame(body_of(wire)) == expected
    assert expected.encode() == wire


def test_subscribe_without_properties_as_rabbitmq_encodes_it() -> None:
    wire = whole(0x0007, 1, struct.pack(">IB", 1, 0), s("s"), struct.pack(">HH", 1, 5))
    decoded = c.decode_client_frame(body_of(wire))
    assert decoded == c.SubscribeRequest(1, 0, "s", c.WireOffsetSpec(OffsetType.FIRST), 5, {})


def test_subscribe_unknown_offset_type_is_rejected() -> None:
    wire = whole(0x0007, 1, struct.pack(">IB", 1, 0), s("s"), struct.pack(">HH", 9, 5))
    with pytest.raises(ProtocolError, match="offset type"):
        c.decode_client_frame(body_of(wire))


def test_golden_publish_v1_simple_and_subbatch() -> None:
    sub_payload = struct.pack(">I", 1) + b"a" + struct.pack(">I", 2) + b"bc"
    sub = bytes([0x80 | (0 << 4)]) + struct.pack(">HII", 2, len(sub_payload), len(sub_payload))
    wire = whole(
        0x0002,
        1,
        b"\x05",
        struct.pack(">I", 3),
        struct.pack(">QI", 10, 5) + b"hello",
        struct.pack(">QI", 11, 0),
        struct.pack(">Q", 13) + sub + sub_payload,
    )
    batch = c.decode_client_frame(body_of(wire))
    assert isinstance(batch, PublishBatch)
    assert batch.publisher_id == 5 and batch.version == 1
    assert list(batch.publishing_ids) == [10, 11, 13]
    assert [bytes(e) for e in batch.entries] == [
        struct.pack(">I", 5) + b"hello",
        struct.pack(">I", 0),
        sub + sub_payload,
    ]
    assert batch.num_records == 4
    assert batch.record_counts == [1, 1, 2]
    assert batch.entry_data() == b"".join(bytes(e) for e in batch.entries)
    assert batch.encode() == wire


def test_golden_publish_v2_filter_values() -> None:
    wire = whole(
        0x0002,
        2,
        b"\x01",
        struct.pack(">I", 2),
        struct.pack(">Q", 1) + s("eu") + struct.pack(">I", 1) + b"x",
        struct.pack(">Q", 2) + b"\xff\xff" + struct.pack(">I", 1) + b"y",
    )
    batch = decode_publish(body_of(wire))
    assert batch.filter_values == ["eu", None]
    assert list(batch.publishing_ids) == [1, 2]
    assert batch.entry_data() == struct.pack(">I", 1) + b"x" + struct.pack(">I", 1) + b"y"
    assert batch.encode() == wire


def test_publish_uniform_fast_path_matches_general_path() -> None:
    messages = [(i, bytes([i % 251]) * 100) for i in range(1000)]
    body = body_of(encode_publish(7, messages))
    fast = decode_publish(body)
    general = _decode_general(body, 7, 1, len(messages))
    assert isinstance(fast.publishing_ids, tuple)  # the one-unpack path was taken
    assert list(fast.publishing_ids) == general.publishing_ids
    assert [bytes(e) for e in fast.entries] == [bytes(e) for e in general.entries]
    assert fast.entry_data() == general.entry_data()
    assert fast.num_records == general.num_records == 1000


def test_publish_uniform_lengths_but_one_subbatch_falls_back() -> None:
    # Same stride as 12-byte simple entries, but the second message is a sub-batch entry.
    sub = subbatch_entry(b"", 1, 0)  # 11 bytes
    first = struct.pack(">QI", 1, 7) + b"1234567"  # simple entry of 11 bytes
    second = struct.pack(">Q", 2) + sub
    wire = whole(0x0002, 1, b"\x00", struct.pack(">I", 2), first, second)
    batch = decode_publish(body_of(wire))
    assert batch.record_counts == [1, 1]
    assert bytes(batch.entries[1]) == sub


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (struct.pack(">I", 1) + struct.pack(">QI", 1, 10) + b"short", TruncatedError),
        (struct.pack(">I", 5) + struct.pack(">QI", 1, 0), TruncatedError),
        (struct.pack(">I", 1) + struct.pack(">QI", 1, 1) + b"ab", ProtocolError),
        (struct.pack(">I", 1) + struct.pack(">QBHII", 1, 0x81, 1, 0, 0), ProtocolError),
        (struct.pack(">I", 1) + struct.pack(">QBHII", 1, 0xF0, 1, 0, 0), ProtocolError),
        (struct.pack(">I", 1) + struct.pack(">QBHII", 1, 0x80, 0, 0, 0), ProtocolError),
    ],
)
def test_bad_publish_frames_raise_typed_errors(payload: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_publish(body_of(whole(0x0002, 1, b"\x01", payload)))


def test_golden_publish_confirm_one_pack_and_array_paths() -> None:
    small = encode_publish_confirm(2, [1, 2**64 - 1])
    assert small == whole(0x0003, 1, b"\x02", struct.pack(">IQQ", 2, 1, 2**64 - 1))
    many = list(range(5000))
    big = encode_publish_confirm(2, many)
    assert big == whole(0x0003, 1, b"\x02", struct.pack(f">I{len(many)}Q", len(many), *many))
    decoded = c.decode_server_frame(body_of(big))
    assert decoded == PublishConfirm(2, tuple(many))


def test_golden_publish_error() -> None:
    error = PublishError(4, [(10, ResponseCode.PUBLISHER_DOES_NOT_EXIST), (11, 6)])
    wire = whole(0x0004, 1, b"\x04", struct.pack(">IQHQH", 2, 10, 0x12, 11, 6))
    assert error.encode() == wire
    assert c.decode_server_frame(body_of(wire)) == error


def fake_chunk(data: bytes, bloom: int = 0, trailer: int = 0) -> bytes:
    """A 48-byte Osiris chunk header (as formats/chunk.py lays it out) followed by ``data``."""
    header = struct.pack(
        ">BBHIqQQIIIB3x",
        0x50,
        0,
        1,
        1,
        1_700_000_000_000,
        1,
        0,
        zlib.crc32(data),
        len(data),
        trailer,
        bloom,
    )
    assert len(header) == 48
    return header + data


def test_golden_deliver_prefix_v1_and_v2() -> None:
    chunk = fake_chunk(simple_entry(b"payload"), bloom=16, trailer=29)
    assert deliver_prefix(3, len(chunk)) == struct.pack(">IHHB", 5 + len(chunk), 8, 1, 3)
    assert deliver_prefix(3, len(chunk), 77) == struct.pack(">IHHBQ", 13 + len(chunk), 8, 2, 3, 77)
    for committed in (None, 77):
        wire = deliver_prefix(3, len(chunk), committed) + chunk
        decoded = c.decode_server_frame(body_of(wire))
        assert isinstance(decoded, Deliver)
        assert bytes(decoded.chunk) == chunk
        assert decoded.committed_chunk_id == committed
        assert decoded.encode() == wire


def test_deliver_with_bloom_or_trailer_bytes_on_the_wire_is_rejected() -> None:
    chunk = fake_chunk(b"\x00\x00\x00\x01x") + b"trailer!"
    with pytest.raises(ProtocolError):
        decode_deliver(body_of(deliver_prefix(1, len(chunk)) + chunk))
    with pytest.raises(TruncatedFrameError):
        decode_deliver(body_of(deliver_prefix(1, 10) + b"0123456789"))


def test_golden_credit_and_its_error_response() -> None:
    wire = whole(0x0009, 1, b"\x02", struct.pack(">H", 1))
    assert c.decode_client_frame(body_of(wire)) == c.CreditRequest(2, 1)
    response = c.CreditResponse(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST, 2)
    assert response.encode() == whole(0x8009, 1, struct.pack(">HB", 4, 2))
    assert c.decode_server_frame(body_of(response.encode())) == response


def test_golden_sasl_and_plain_credentials() -> None:
    wire = whole(0x0012, 1, struct.pack(">I", 2))
    assert c.decode_client_frame(body_of(wire)) == c.SaslHandshakeRequest(2)
    response = c.SaslHandshakeResponse(2, 1, ["PLAIN"])
    assert response.encode() == whole(0x8012, 1, struct.pack(">IHI", 2, 1, 1), s("PLAIN"))
    data = c.plain_data("guest", "guest")
    auth = whole(0x0013, 1, struct.pack(">I", 3), s("PLAIN"), struct.pack(">I", len(data)), data)
    decoded = c.decode_client_frame(body_of(auth))
    assert decoded == c.SaslAuthenticateRequest(3, "PLAIN", data)
    assert c.plain_credentials(data) == ("guest", "guest")
    null_data = whole(0x0013, 1, struct.pack(">I", 3), s("PLAIN"), struct.pack(">i", -1))
    assert c.decode_client_frame(body_of(null_data)) == c.SaslAuthenticateRequest(3, "PLAIN", b"")
    # No challenge → no SaslOpaqueData field at all (rstream rejects trailing bytes).
    assert c.SaslAuthenticateResponse(3, 1).encode() == whole(0x8013, 1, struct.pack(">IH", 3, 1))
    with pytest.raises(ProtocolError):
        c.plain_credentials(b"no-separators")


def test_golden_tune_both_directions() -> None:
    tune = c.Tune(1_048_576, 60)
    wire = whole(0x0014, 1, struct.pack(">II", 1_048_576, 60))
    assert tune.encode() == wire
    assert c.decode_client_frame(body_of(wire)) == tune
    assert c.decode_server_frame(body_of(wire)) == tune
    as_response = whole(0x8014, 1, struct.pack(">II", 1_048_576, 60))
    assert c.decode_client_frame(body_of(as_response)) == tune


def test_golden_metadata_response_and_update() -> None:
    response = c.MetadataResponse(
        5,
        [c.BrokerAddress(0, "localhost", 5552)],
        [
            c.StreamMetadata("s", ResponseCode.OK, 0, ()),
            c.StreamMetadata("gone", ResponseCode.STREAM_DOES_NOT_EXIST, 0xFFFF, ()),
        ],
    )
    wire = whole(
        0x800F,
        1,
        struct.pack(">II", 5, 1),
        struct.pack(">H", 0) + s("localhost") + struct.pack(">I", 5552),
        struct.pack(">I", 2),
        s("s") + struct.pack(">HHI", 1, 0, 0),
        s("gone") + struct.pack(">HHI", 2, 0xFFFF, 0),
    )
    assert response.encode() == wire
    assert c.decode_server_frame(body_of(wire)) == response
    update = c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "s")
    assert update.encode() == whole(0x0010, 1, struct.pack(">H", 6), s("s"))


def test_open_response_without_properties_as_rabbitmq_sends_it() -> None:
    wire = whole(0x8015, 1, struct.pack(">IH", 4, ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE))
    assert c.decode_server_frame(body_of(wire)) == c.OpenResponse(4, 0x0C, {})


def test_bare_error_answer_to_a_rich_request_decodes_as_simple_response() -> None:
    wire = c.encode_error_response(Command.QUERY_OFFSET, 8, ResponseCode.NO_OFFSET)
    assert wire == whole(0x800B, 1, struct.pack(">IH", 8, 0x13))
    assert c.decode_server_frame(body_of(wire)) == c.SimpleResponse(
        Command.QUERY_OFFSET, 8, ResponseCode.NO_OFFSET
    )


# ---------------------------------------------------------------- unknown / malformed


def test_unknown_key_yields_key_version_and_correlation_id() -> None:
    wire = whole(0x0063, 1, struct.pack(">I", 42), b"whatever")
    decoded = c.decode_client_frame(body_of(wire))
    assert decoded == c.UnknownCommand(0x0063, 1, 42)
    assert decoded.error_response() == whole(0x8063, 1, struct.pack(">IH", 42, 0x0D))


def test_unsupported_version_and_server_only_commands_are_unknown_to_the_server() -> None:
    wire = whole(0x0007, 3, struct.pack(">I", 5))
    assert c.decode_client_frame(body_of(wire)) == c.UnknownCommand(0x0007, 3, 5)
    confirm = encode_publish_confirm(1, [1])
    assert isinstance(c.decode_client_frame(body_of(confirm)), c.UnknownCommand)
    heartbeat_v2 = whole(0x0017, 2)
    assert c.decode_client_frame(body_of(heartbeat_v2)) == c.UnknownCommand(0x0017, 2, None)
    assert c.UnknownCommand(0x0017, 2, None).error_response() == b""


def test_trailing_bytes_and_truncation_are_typed_errors() -> None:
    good = c.DeletePublisherRequest(1, 2).encode()
    with pytest.raises(ProtocolError, match="unexpected bytes"):
        c.decode_client_frame(body_of(whole(0x0006, 1, struct.pack(">IB", 1, 2), b"x")))
    with pytest.raises(TruncatedFrameError):
        c.decode_client_frame(body_of(good)[:-1])
    with pytest.raises(ProtocolError):
        c.decode_client_frame(b"\x00")
    bad_utf8 = whole(0x000E, 1, struct.pack(">I", 1), b"\x00\x02\xff\xfe")
    with pytest.raises(ProtocolError, match="UTF-8"):
        c.decode_client_frame(body_of(bad_utf8))
    huge_array = whole(0x000F, 1, struct.pack(">Ii", 1, 2**31 - 1))
    with pytest.raises(TruncatedError):
        c.decode_client_frame(body_of(huge_array))


def test_exchange_command_versions_lists_keys_from_one_in_order() -> None:
    versions = [
        c.CommandVersion(k, *SUPPORTED_VERSIONS[Command(k)]) for k in sorted(SUPPORTED_VERSIONS)
    ]
    assert [v.key for v in versions[:3]] == [1, 2, 3]
    publish = versions[Command.PUBLISH - 1]  # how rstream looks it up
    assert (publish.key, publish.max_version) == (2, 2)
    response = c.ExchangeCommandVersionsResponse(1, 1, versions)
    assert c.decode_server_frame(body_of(response.encode())) == response


# ---------------------------------------------------------------- frame splitter


def test_splitter_returns_views_into_the_fed_bytes() -> None:
    data = c.Heartbeat().encode() + c.CreditRequest(1, 5).encode()
    frames = FrameSplitter().feed(data)
    assert [bytes(f) for f in frames] == [data[4:8], data[12:]]
    assert all(f.obj is data for f in frames)  # no copy


def test_splitter_byte_by_byte_equals_all_at_once() -> None:
    data = b"".join(
        [
            c.Heartbeat().encode(),
            encode_publish(1, [(i, b"x" * i) for i in range(50)]),
            c.OpenRequest(3, "/").encode(),
        ]
    )
    splitter = FrameSplitter()
    pieces = [bytes(f) for b in range(len(data)) for f in splitter.feed(data[b : b + 1])]
    assert pieces == [bytes(f) for f in FrameSplitter().feed(data)]
    assert splitter.buffered == 0


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=20))
def test_splitter_any_cut_points(cuts: list[int]) -> None:
    data = b"".join(c.MetadataRequest(i, ["s" * i]).encode() for i in range(12))
    expected = [bytes(f) for f in FrameSplitter().feed(data)]
    splitter = FrameSplitter()
    got: list[bytes] = []
    pos = 0
    for cut in cuts:
        got += [bytes(f) for f in splitter.feed(data[pos : pos + cut])]
        pos += cut
    got += [bytes(f) for f in splitter.feed(data[pos:])]
    assert got == expected


def test_splitter_rejects_oversized_frame_at_its_size_prefix() -> None:
    splitter = FrameSplitter(max_frame_size=64)
    assert splitter.feed(whole(0x17, 1, b"x" * 52))  # exactly 64 bytes with the prefix
    with pytest.raises(FrameTooLargeError) as info:
        splitter.feed(struct.pack(">I", 61))  # body not sent yet
    assert info.value.size == 65 and info.value.max_size == 64
    assert isinstance(info.value, FormatError)


def test_splitter_limit_applies_to_a_size_split_across_feeds() -> None:
    splitter = FrameSplitter()
    splitter.max_frame_size = 16
    splitter.feed(b"\x00\x00")
    with pytest.raises(FrameTooLargeError):
        splitter.feed(b"\x10\x00")


def test_splitter_rejects_frames_too_small_for_key_and_version() -> None:
    with pytest.raises(ProtocolError):
        FrameSplitter().feed(struct.pack(">I", 3) + b"abc")
    with pytest.raises(ProtocolError):
        frame_key_version(b"\x00")


# ---------------------------------------------------------------- round trips


names = st.text(max_size=20)
small_maps = st.dictionaries(names, names, max_size=4)
u8 = st.integers(0, 255)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
offset_specs = st.one_of(
    st.sampled_from([OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT]).map(c.WireOffsetSpec),
    u64.map(lambda v: c.WireOffsetSpec(OffsetType.OFFSET, v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: c.WireOffsetSpec(OffsetType.TIMESTAMP, v)),
)
versions = st.builds(c.CommandVersion, u16, u16, u16)

client_commands = st.one_of(
    st.builds(c.PeerPropertiesRequest, u32, small_maps),
    st.builds(c.SaslHandshakeRequest, u32),
    st.builds(c.SaslAuthenticateRequest, u32, names, st.binary(max_size=30)),
    st.builds(c.Tune, u32, u32),
    st.builds(c.OpenRequest, u32, names),
    st.just(c.Heartbeat()),
    st.builds(c.CloseRequest, u32, u16, names),
    st.builds(c.SimpleResponse, st.just(Command.CLOSE), u32, u16),
    st.builds(c.CreateRequest, u32, names, small_maps),
    st.builds(c.DeleteRequest, u32, names),
    st.builds(c.MetadataRequest, u32, st.lists(names, max_size=4)),
    st.builds(c.StreamStatsRequest, u32, names),
    st.builds(c.RouteRequest, u32, names, names),
    st.builds(c.PartitionsRequest, u32, names),
    st.builds(c.ExchangeCommandVersionsRequest, u32, st.lists(versions, max_size=4)),
    st.builds(c.DeclarePublisherRequest, u32, u8, names, names),
    st.builds(c.QueryPublisherSequenceRequest, u32, names, names),
    st.builds(c.DeletePublisherRequest, u32, u8),
    st.builds(c.SubscribeRequest, u32, u8, names, offset_specs, u16, small_maps),
    st.builds(c.CreditRequest, u8, u16),
    st.builds(c.StoreOffsetRequest, names, names, u64),
    st.builds(c.QueryOffsetRequest, u32, names, names),
    st.builds(c.UnsubscribeRequest, u32, u8),
    st.builds(
        c.ConsumerUpdateResponse,
        u32,
        u16,
        st.one_of(offset_specs, st.just(c.WireOffsetSpec(OffsetType.NONE))),
    ),
)

publish_messages = st.lists(st.tuples(u64, st.binary(max_size=40)), max_size=12)


def _publish_frame(data: st.DataObject) -> bytes:
    messages = data.draw(publish_messages)
    if data.draw(st.booleans()):
        fvs = data.draw(st.lists(st.none() | names, min_size=len(messages), max_size=len(messages)))
        return encode_publish(data.draw(u8), messages, filter_values=fvs)
    return encode_publish(data.draw(u8), messages)


server_commands = st.one_of(
    st.builds(c.PeerPropertiesResponse, u32, st.just(1), small_maps),
    st.builds(c.SaslHandshakeResponse, u32, st.just(1), st.lists(names, max_size=3)),
    st.builds(c.SaslAuthenticateResponse, u32, u16, st.binary(max_size=10)),
    st.builds(c.Tune, u32, u32),
    st.builds(c.OpenResponse, u32, st.just(1), small_maps),
    st.just(c.Heartbeat()),
    st.builds(c.CloseRequest, u32, u16, names),
    st.builds(
        c.SimpleResponse,
        st.sampled_from([Command.DECLARE_PUBLISHER, Command.SUBSCRIBE, Command.CREATE]),
        u32,
        u16,
    ),
    st.builds(
        c.MetadataResponse,
        u32,
        st.lists(st.builds(c.BrokerAddress, u16, names, u32), max_size=3),
        st.lists(
            st.builds(c.StreamMetadata, names, u16, u16, st.lists(u16, max_size=3).map(tuple)),
            max_size=3,
        ),
    ),
    st.builds(c.MetadataUpdate, u16, names),
    st.builds(
        c.StreamStatsResponse,
        u32,
        st.just(1),
        st.dictionaries(names, st.integers(-(2**63), 2**63 - 1), max_size=3),
    ),
    st.builds(c.RouteResponse, u32, st.just(1), st.lists(names, max_size=3)),
    st.builds(c.PartitionsResponse, u32, st.just(1), st.lists(names, max_size=3)),
    st.builds(c.ExchangeCommandVersionsResponse, u32, st.just(1), st.lists(versions, max_size=4)),
    st.builds(c.QueryPublisherSequenceResponse, u32, st.just(1), u64),
    st.builds(PublishConfirm, u8, st.lists(u64, max_size=20).map(tuple)),
    st.builds(PublishError, u8, st.lists(st.tuples(u64, u16), max_size=5)),
    st.builds(c.CreditResponse, u16, u8),
    st.builds(c.QueryOffsetResponse, u32, st.just(1), u64),
    st.builds(c.ConsumerUpdateRequest, u32, u8, st.booleans()),
)


@given(client_commands)
def test_client_commands_round_trip(command: object) -> None:
    wire = command.encode()  # type: ignore[attr-defined]
    assert c.decode_client_frame(body_of(wire)) == command


@given(server_commands)
def test_server_commands_round_trip(command: object) -> None:
    wire = command.encode()  # type: ignore[attr-defined]
    assert c.decode_server_frame(body_of(wire)) == command


@given(st.data())
def test_publish_round_trip(data: st.DataObject) -> None:
    wire = _publish_frame(data)
    batch = decode_publish(body_of(wire))
    assert batch.encode() == wire
    assert batch.num_records == len(batch.entries)


@given(st.lists(st.lists(st.binary(max_size=20), min_size=1, max_size=5), max_size=5))
def test_subbatch_publish_round_trip(batches: list[list[bytes]]) -> None:
    entries = [
        subbatch_entry(subbatch_records(b), len(b), len(subbatch_records(b))) for b in batches
    ]
    ids = list(range(len(entries)))
    wire = encode_publish_entries(9, ids, entries)
    batch = decode_publish(body_of(wire))
    assert batch.num_records == sum(len(b) for b in batches)
    assert [bytes(e) for e in batch.entries] == entries


# ---------------------------------------------------------------- rstream cross-checks


import rstream.compression as rstream_compression  # noqa: E402 - dev dependency, never skipped
import rstream.encoding as rstream_encoding  # noqa: E402
import rstream.schema as rstream_schema  # noqa: E402


def test_rstream_connect_frames_decode_with_ours() -> None:
    sc = rstream_schema
    enc = rstream_encoding.encode_frame
    pairs = [
        (
            sc.PeerProperties(1, [sc.Property("product", "RabbitMQ Stream")]),
            c.PeerPropertiesRequest(1, {"product": "RabbitMQ Stream"}),
        ),
        (sc.SaslHandshake(2), c.SaslHandshakeRequest(2)),
        (
            sc.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"),
            c.SaslAuthenticateRequest(3, "PLAIN", b"\0guest\0guest"),
        ),
        (sc.Tune(frame_max=1_048_576, heartbeat=60), c.Tune(1_048_576, 60)),
        (sc.Open(4, "/"), c.OpenRequest(4, "/")),
        (sc.Heartbeat(), c.Heartbeat()),
        (sc.Close(5, 1, "bye"), c.CloseRequest(5, 1, "bye")),
        (
            sc.Create(6, "s", [sc.Property("max-length-bytes", "1000")]),
            c.CreateRequest(6, "s", {"max-length-bytes": "1000"}),
        ),
        (sc.Delete(7, "s"), c.DeleteRequest(7, "s")),
        (sc.Metadata(8, ["s", "t"]), c.MetadataRequest(8, ["s", "t"])),
        (sc.DeclarePublisher(9, 1, "p", "s"), c.DeclarePublisherRequest(9, 1, "p", "s")),
        (sc.QueryPublisherSequence(10, "p", "s"), c.QueryPublisherSequenceRequest(10, "p", "s")),
        (sc.DeletePublisher(11, 1), c.DeletePublisherRequest(11, 1)),
        (sc.Credit(2, 1), c.CreditRequest(2, 1)),
        (sc.StoreOffset("c", "s", 99), c.StoreOffsetRequest("c", "s", 99)),
        (sc.QueryOffset(12, "c", "s"), c.QueryOffsetRequest(12, "c", "s")),
        (sc.Unsubscribe(13, 2), c.UnsubscribeRequest(13, 2)),
        (sc.SuperStreamRoute(14, "k", "ss"), c.RouteRequest(14, "k", "ss")),
        (sc.SuperStreamPartitions(15, "ss"), c.PartitionsRequest(15, "ss")),
        (
            sc.ExchangeCommandVersionRequest(16, [sc.FrameHandlerInfo(2, 1, 2)]),
            c.ExchangeCommandVersionsRequest(16, [c.CommandVersion(2, 1, 2)]),
        ),
        (
            sc.ConsumerUpdateServerResponse(17, 1, sc.OffsetSpecification(4, 12)),
            c.ConsumerUpdateResponse(17, 1, c.WireOffsetSpec(OffsetType.OFFSET, 12)),
        ),
    ]
    for theirs, ours in pairs:
        wire = enc(theirs)
        assert c.decode_client_frame(body_of(wire)) == ours, theirs
        assert ours.encode() == wire, theirs  # byte-identical both ways


@pytest.mark.parametrize(
    ("offset_type", "value"),
    [(1, None), (2, None), (3, None), (4, 123), (5, 1_700_000_000_000)],
)
def test_rstream_subscribe_every_offset_spec(offset_type: int, value: int | None) -> None:
    sc = rstream_schema
    frame = sc.Subscribe(
        correlation_id=3,
        subscription_id=1,
        stream="s",
        offset_spec=sc.OffsetSpec.from_params(sc.OffsetType(offset_type), value),
        credit=10,
        properties=[sc.Property("single-active-consumer", "true"), sc.Property("name", "n")],
    )
    decoded = c.decode_client_frame(body_of(rstream_encoding.encode_frame(frame)))
    assert decoded == c.SubscribeRequest(
        3,
        1,
        "s",
        c.WireOffsetSpec(OffsetType(offset_type), value or 0),
        10,
        {"single-active-consumer": "true", "name": "n"},
    )


def test_rstream_publish_v1_v2_and_compressed_subbatch() -> None:
    sc = rstream_schema
    messages = [sc.Message(i, None, b"m" * (i % 7)) for i in range(30)]
    v1 = decode_publish(body_of(rstream_encoding.encode_publish(sc.Publish(4, messages))))
    assert list(v1.publishing_ids) == list(range(30))
    assert [bytes(e)[4:] for e in v1.entries] == [m.data for m in messages]
    filtered = [sc.Message(i, f"f{i}", b"x") for i in range(5)]
    v2 = decode_publish(
        body_of(rstream_encoding.encode_publish(sc.Publish(4, filtered), version_to_encode=2))
    )
    assert v2.filter_values == [f"f{i}" for i in range(5)]

    codec = rstream_compression.CompressionHelper.compress(
        [b"one", b"two", b"three"], rstream_compression.CompressionType.Gzip
    )
    frame = sc.PublishSubBatching(
        publisher_id=4,
        number_of_root_messages=1,
        publishing_id=77,
        compress_type=0x80 | codec.compression_type() << 4,
        subbatching_message_count=codec.messages_count(),
        uncompressed_data_size=codec.uncompressed_size(),
        compressed_data_size=codec.compressed_size(),
        messages=codec.data(),
    )
    batch = c.decode_client_frame(body_of(rstream_encoding.encode_frame(frame)))
    assert isinstance(batch, PublishBatch)
    assert list(batch.publishing_ids) == [77] and batch.record_counts == [3]
    entry = bytes(batch.entries[0])
    assert entry[0] == 0x90  # sub-batch, gzip
    assert gzip.decompress(entry[11:]) == subbatch_records([b"one", b"two", b"three"])


def test_our_server_frames_decode_with_rstream() -> None:
    sc = rstream_schema
    dec = rstream_encoding.decode_frame
    chunk = fake_chunk(simple_entry(b"a") + simple_entry(b"bc"))
    chunk = chunk[:2] + struct.pack(">H", 2) + struct.pack(">I", 2) + chunk[8:]
    cases = [
        (
            c.PeerPropertiesResponse(1, 1, {"product": "tierlog"}),
            sc.PeerPropertiesResponse(1, 1, [sc.Property("product", "tierlog")]),
        ),
        (c.SaslHandshakeResponse(2, 1, ["PLAIN"]), sc.SaslHandshakeResponse(2, 1, ["PLAIN"])),
        (c.SaslAuthenticateResponse(3, 1), sc.SaslAuthenticateResponse(3, 1)),
        (c.Tune(1_048_576, 60), sc.Tune(1_048_576, 60)),
        (c.OpenResponse(4, 1, {}), sc.OpenResponse(4, 1, [])),
        (c.Heartbeat(), sc.Heartbeat()),
        (c.CloseRequest(5, 1, "bye"), sc.Close(5, 1, "bye")),
        (c.SimpleResponse(Command.CLOSE, 5, 1), sc.CloseResponse(5, 1)),
        (c.SimpleResponse(Command.CREATE, 6, 1), sc.CreateResponse(6, 1)),
        (c.SimpleResponse(Command.DELETE, 6, 2), sc.DeleteResponse(6, 2)),
        (c.SimpleResponse(Command.DECLARE_PUBLISHER, 7, 1), sc.DeclarePublisherResponse(7, 1)),
        (c.SimpleResponse(Command.DELETE_PUBLISHER, 7, 1), sc.DeletePublisherResponse(7, 1)),
        (c.SimpleResponse(Command.SUBSCRIBE, 8, 1), sc.SubscribeResponse(8, 1)),
        (c.SimpleResponse(Command.UNSUBSCRIBE, 8, 1), sc.UnsubscribeResponse(8, 1)),
        (
            c.QueryPublisherSequenceResponse(9, 1, 42),
            sc.QueryPublisherSequenceResponse(9, 1, 42),
        ),
        (c.QueryOffsetResponse(10, 1, 7), sc.QueryOffsetResponse(10, 1, 7)),
        (c.CreditResponse(4, 3), sc.CreditResponse(4, 3)),
        (
            c.MetadataResponse(
                11, [c.BrokerAddress(0, "h", 5552)], [c.StreamMetadata("s", 1, 0, (0,))]
            ),
            sc.MetadataResponse(11, [sc.Broker(0, "h", 5552)], [sc.StreamMetadata("s", 1, 0, [0])]),
        ),
        (c.MetadataUpdate(6, "s"), sc.MetadataUpdate(sc.MetadataInfo(6, "s"))),
        (PublishConfirm(1, (1, 2, 3)), sc.PublishConfirm(1, [1, 2, 3])),
        (
            PublishError(1, [(4, 18)]),
            sc.PublishError(1, [sc.PublishingError(4, 18)]),
        ),
        (c.RouteResponse(12, 1, ["p0"]), sc.SuperStreamRouteResponse(12, 1, ["p0"])),
        (
            c.PartitionsResponse(13, 1, ["p0", "p1"]),
            sc.SuperStreamPartitionsResponse(13, 1, ["p0", "p1"]),
        ),
        (
            c.ExchangeCommandVersionsResponse(14, 1, [c.CommandVersion(1, 1, 1)]),
            sc.ExchangeCommandVersionResponse(14, 1, [sc.FrameHandlerInfo(1, 1, 1)]),
        ),
        (c.ConsumerUpdateRequest(15, 2, True), sc.ConsumerUpdateResponse(15, 2, 1)),
    ]
    for ours, theirs in cases:
        wire = ours.encode()  # type: ignore[attr-defined]
        assert dec(bytes(body_of(wire))) == theirs, ours

    deliver = dec(bytes(body_of(deliver_prefix(2, len(chunk)) + chunk)))
    assert deliver.subscription_id == 2 and deliver.get_messages() == [b"a", b"bc"]
