"""Helpers for the security tests: RSS of a server process, a healthy client round trip."""

from __future__ import annotations

import itertools

from tests.plugins.tierlog_server import RawClient
from tierlog.formats.protocol import commands as c
from tierlog.formats.protocol.constants import OffsetType, ResponseCode
from tierlog.formats.protocol.deliver import Deliver
from tierlog.formats.protocol.publish import PublishConfirm, encode_publish

_round = itertools.count(1)


def rss_bytes(pid: int) -> int:
    """VmRSS of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def healthy_round_trip(host: str, port: int, timeout: float = 10.0) -> None:
    """Open, create a stream, publish with confirm, consume it back: the server serves us."""
    client = RawClient(host, port, timeout=timeout)
    try:
        assert client.handshake() == ResponseCode.OK
        stream = f"healthy-{next(_round)}"
        client.send(c.CreateRequest(client.next_corr(), stream, {}).encode())
        created = client.expect(c.SimpleResponse)
        assert isinstance(created, c.SimpleResponse)
        assert created.response_code == ResponseCode.OK
        client.send(c.DeclarePublisherRequest(client.next_corr(), 1, "", stream).encode())
        declared = client.expect(c.SimpleResponse)
        assert isinstance(declared, c.SimpleResponse)
        assert declared.response_code == ResponseCode.OK
        client.send(encode_publish(1, [(i, b"healthy-%d" % i) for i in range(1, 11)]))
        confirm = client.expect(PublishConfirm)
        assert isinstance(confirm, PublishConfirm)
        assert list(confirm.publishing_ids)[-1] == 10
        spec = c.WireOffsetSpec(OffsetType.FIRST)
        client.send(c.SubscribeRequest(client.next_corr(), 0, stream, spec, 10).encode())
        client.expect(Deliver)
    finally:
        client.close()
