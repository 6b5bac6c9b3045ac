"""``x-tierlog-ack=remote`` in a server: confirms and consumers wait for the remote tier's
manifest commit; the mode is validated at creation and fixed afterwards."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.server.test_inprocess import AsyncRawClient
from tests.server.test_tiering import config, status
from tierlog.errors import ConfigError
from tierlog.formats.chunk import decode_header
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish
from tierlog.remote.errors import AckModeError
from tierlog.remote.settings import StreamSettings, check_tier_mode_unchanged
from tierlog.server.app import Server
from tierlog.server.arguments import settings_from_arguments
from tierlog.server.config import load_config

REMOTE_ACK = {"x-tierlog-ack": "remote", "x-tierlog-fragment-bytes": str(1 << 20)}


def test_ack_mode_is_validated_and_fixed_at_creation() -> None:
    assert settings_from_arguments({"x-tierlog-ack": "remote"}).ack == "remote"
    assert StreamSettings().ack == "replicas"
    with pytest.raises(ConfigError, match="ack must be one of"):
        settings_from_arguments({"x-tierlog-ack": "disk"})
    with pytest.raises(AckModeError, match="tier_mode 'fragments'"):
        settings_from_arguments({"x-tierlog-ack": "remote", "x-tierlog-tier-mode": "segments"})
    with pytest.raises(ConfigError, match="ack is fixed at creation"):
        check_tier_mode_unchanged(StreamSettings(), {"ack": "remote"})


def test_remote_ack_interval_is_validated(tmp_path: Path) -> None:
    assert load_config(environ={}).tier.remote_ack_interval_seconds == 0.2
    env = {"TIERLOG_TIER_REMOTE_ACK_INTERVAL_SECONDS": "0.5"}
    assert load_config(environ=env).tier.remote_ack_interval_seconds == 0.5
    for bad in ("0", "-1", "600"):
        with pytest.raises(ConfigError, match="remote_ack_interval_seconds"):
            load_config(environ={"TIERLOG_TIER_REMOTE_ACK_INTERVAL_SECONDS": bad})


async def test_create_refused_without_tiering(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    server = Server(replace(cfg, tier=replace(cfg.tier, enabled=False)))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        response = await client.request(c.CreateRequest(client.next_corr(), "ra", REMOTE_ACK))
        assert response.response_code == ResponseCode.PRECONDITION_FAILED
        args = {**REMOTE_ACK, "x-tierlog-tier-mode": "segments"}
        response = await client.request(c.CreateRequest(client.next_corr(), "rs", args))
        assert response.response_code == ResponseCode.PRECONDITION_FAILED
        client.close()
    finally:
        await server.stop()


async def test_every_confirm_is_in_a_committed_manifest(tmp_path: Path) -> None:
    """Each confirm arrives only once the remote tier's committed next offset covers the
    message (checked by reading the manifest as the confirm arrives); a stream without
    ack=remote confirms long before its first fragment is even cut."""
    cfg = config(tmp_path)
    server = Server(replace(cfg, tier=replace(cfg.tier, remote_ack_interval_seconds=0.1)))
    await server.start()
    try:
        assert server.broker is not None and server.tiering is not None
        client = await AsyncRawClient.connect(server.stream_port)
        for name, args in (("ra", REMOTE_ACK), ("plain", {"x-tierlog-max-fragment-age": "1h"})):
            response = await client.request(c.CreateRequest(client.next_corr(), name, args))
            assert response.response_code == ResponseCode.OK
        handle = server.broker.get("/", "ra")
        assert handle is not None and handle.remote_ack is not None
        tierer = server.tiering.tierer_of(handle.record)
        assert tierer is not None
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "ra"))
        latencies = []
        for k in range(20):
            sent = time.monotonic()
            client.send(encode_publish(1, [(k * 5 + i, b"m%d" % (k * 5 + i)) for i in range(5)]))
            confirm = await client.expect(PublishConfirm)
            latencies.append(time.monotonic() - sent)
            assert sorted(confirm.publishing_ids) == list(range(k * 5, k * 5 + 5))
            # offsets 0..k*5+4 hold the messages confirmed so far
            assert tierer.durable_next >= k * 5 + 5
        assert max(latencies) < 5.0
        # the plain stream confirms at the local fsync: nothing tiered (1 h fragment age)
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 2, "", "plain"))
        client.send(encode_publish(2, [(1, b"x")]))
        await client.expect(PublishConfirm)
        plain = server.broker.get("/", "plain")
        assert plain is not None and plain.remote_ack is None
        s = await status(server, "plain")
        assert s["remote"]["tiered_offset"] == 0 and s["local"]["next_offset"] >= 1
        client.close()
    finally:
        await server.stop()


async def test_confirms_and_consumers_wait_for_the_commit(tmp_path: Path) -> None:
    """With a long interval the window is visible: a message is written locally, but
    neither confirmed nor delivered to a consumer until its fragment is committed."""
    cfg = config(tmp_path)
    server = Server(replace(cfg, tier=replace(cfg.tier, remote_ack_interval_seconds=2.0)))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        await client.request(c.CreateRequest(client.next_corr(), "slow", REMOTE_ACK))
        consumer = await AsyncRawClient.connect(server.stream_port)
        spec = c.WireOffsetSpec(OffsetType.FIRST)
        sub = c.SubscribeRequest(consumer.next_corr(), 1, "slow", spec, 10)
        assert (await consumer.request(sub)).response_code == ResponseCode.OK
        await client.request(c.DeclarePublisherRequest(client.next_corr(), 1, "", "slow"))
        sent = time.monotonic()
        client.send(encode_publish(1, [(1, b"hello")]))
        s = await status(server, "slow")
        with pytest.raises(asyncio.TimeoutError):
            await client.expect(PublishConfirm, timeout=1.0)
        with pytest.raises(asyncio.TimeoutError):
            await consumer.expect(Deliver, timeout=0.2)
        s = await status(server, "slow")
        assert s["local"]["next_offset"] >= 1 and s["remote"]["tiered_offset"] == 0
        assert s["remote"]["confirms_held"] == 1 and s["remote"]["readable_next_offset"] == 0
        await client.expect(PublishConfirm, timeout=10.0)
        assert time.monotonic() - sent >= 1.5
        deliver = await consumer.expect(Deliver, timeout=5.0)
        assert decode_header(bytes(deliver.chunk)).chunk_id == 0
        s = await status(server, "slow")
        assert s["remote"]["tiered_offset"] >= 1 and s["remote"]["confirms_held"] == 0
        assert s["remote"]["readable_next_offset"] == s["remote"]["tiered_offset"]
        client.close()
        consumer.close()
    finally:
        await server.stop()


async def test_consumers_read_across_rolls_and_freed_segments(tmp_path: Path) -> None:
    """Small segments, local retention freeing what is tiered: consumers from the first
    offset and from ``next`` get every message once, in order, with confirms held for
    the remote tier all along."""
    from tests.server.test_tiering import publish

    cfg = config(tmp_path)
    server = Server(replace(cfg, tier=replace(cfg.tier, remote_ack_interval_seconds=0.05)))
    await server.start()
    try:
        client = await AsyncRawClient.connect(server.stream_port)
        args = {
            **REMOTE_ACK,
            "stream-max-segment-size-bytes": "65536",
            "x-tierlog-local-max-bytes": "1",
        }
        await client.request(c.CreateRequest(client.next_corr(), "rolls", args))
        consumer = await AsyncRawClient.connect(server.stream_port)
        for sid, kind in ((1, OffsetType.FIRST), (2, OffsetType.NEXT)):
            sub = c.SubscribeRequest(
                consumer.next_corr(), sid, "rolls", c.WireOffsetSpec(kind), 1000
            )
            assert (await consumer.request(sub)).response_code == ResponseCode.OK
        await publish(client, "rolls", 30)  # 600 messages of 1000 bytes, ~10 segments
        seen: dict[int, list[int]] = {1: [], 2: []}
        while min(len(v) for v in seen.values()) < 600:
            frame = await consumer.expect(Deliver, timeout=10.0)
            header = decode_header(bytes(frame.chunk))
            seen[frame.subscription_id].extend(
                range(header.chunk_id, header.chunk_id + header.num_records)
            )
        assert seen[1] == list(range(600)) and seen[2] == list(range(600))
        s = await status(server, "rolls")
        assert s["remote"]["tiered_offset"] >= 600
        assert s["local"]["first_offset"] > 0  # local retention freed tiered segments
        client.close()
        consumer.close()
    finally:
        await server.stop()
