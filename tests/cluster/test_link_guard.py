"""The replication listener is as guarded as the client port: before a peer has proven
the cluster secret it may send only small frames (the length header is checked before
any body is read), it must finish its handshake within a deadline, only so many
incoming connections are open at once, and every refusal is counted by reason. Links
can run under mutual TLS, with certificates of the cluster's own CA."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from tests.cluster.hub_helpers import (
    STREAM,
    Recorder,
    caught_up,
    leader_log,
    member_log,
    until,
)
from tests.log.acceptor_helpers import write_leader_chunks
from tests.server.certificates import make_node_certificates
from tierlog.cluster.link import handshake_dialer, read_frame
from tierlog.errors import ConfigError
from tierlog.formats import replication as wire
from tierlog.server.config import ClusterSection
from tierlog.server.tls import replication_contexts

SECRET = b"cluster secret for tests"


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """Seconds until the server closed the connection (EOF or reset); fails past
    ``seconds``."""
    started = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(4096), seconds):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return time.monotonic() - started


async def test_an_oversized_frame_before_authentication_is_refused_at_its_length(hubs):
    """A length header of 64 MiB is refused before its body: the connection closes at
    once, not after the handshake deadline, and nothing of the body is waited for."""
    n1 = await hubs.add("n1", SECRET, handshake_timeout=30.0)
    host, port = hubs.addresses["n1"]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(struct.pack(">I", wire.MAX_FRAME_BYTES) + b"\x01" * 1024)
    await writer.drain()
    took = await _closed_within(reader, 5.0)
    assert took < 5.0
    assert n1.refusals["oversized"] == 1
    assert n1.incoming == 0
    writer.close()


async def test_a_frame_just_over_the_handshake_cap_is_refused(hubs):
    n1 = await hubs.add("n1", SECRET, handshake_timeout=30.0)
    host, port = hubs.addresses["n1"]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(struct.pack(">I", wire.MAX_HANDSHAKE_FRAME_BYTES + 1))
    await writer.drain()
    await _closed_within(reader, 5.0)
    assert n1.refusals["oversized"] == 1
    writer.close()


async def test_a_silent_connection_is_closed_at_the_handshake_deadline(hubs):
    n1 = await hubs.add("n1", SECRET, handshake_timeout=0.5)
    host, port = hubs.addresses["n1"]
    reader, writer = await asyncio.open_connection(host, port)
    took = await _closed_within(reader, 5.0)
    assert 0.3 < took < 3.0
    assert n1.refusals["timeout"] == 1
    writer.close()


async def test_connections_past_the_cap_are_refused_and_peers_still_link(hubs, tmp_path):
    n1 = await hubs.add("n1", SECRET, max_incoming=3, handshake_timeout=1.0)
    host, port = hubs.addresses["n1"]
    idle = [await asyncio.open_connection(host, port) for _ in range(3)]
    await until(lambda: n1.incoming == 3, what="three idle connections accepted")
    reader, writer = await asyncio.open_connection(host, port)
    took = await _closed_within(reader, 5.0)
    assert took < 0.5  # refused at accept, not at the deadline
    assert n1.refusals["connection_cap"] == 1
    writer.close()
    # the idle ones reach their deadline and free their places
    await until(lambda: n1.incoming == 0, timeout=10, what="idle connections timed out")
    assert n1.refusals["timeout"] == 3
    for _r, w in idle:
        w.close()
    # a real peer links and replicates afterwards
    n2 = await hubs.add("n2", SECRET)
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 5)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    follower = member_log(tmp_path, "n2")
    n2.follow(STREAM, follower, "n1", 1)
    await until(caught_up(follower, leader), what="n2 catching up after the refusals")
    assert n1.incoming == 1
    n2.unfollow(STREAM)
    follower.close()


async def test_a_wrong_secret_is_counted_as_an_auth_refusal(hubs):
    n1 = await hubs.add("n1", SECRET)
    host, port = hubs.addresses["n1"]
    reader, writer = await asyncio.open_connection(host, port)
    # a dialer that does not hold the secret answers the challenge with a made-up proof
    writer.write(wire.encode(wire.Hello("n9")) + wire.encode(wire.Challenge(b"\1" * 32)))
    for _ in range(3):  # the acceptor's HELLO, CHALLENGE and PROOF
        await read_frame(reader)
    writer.write(wire.encode(wire.Proof(b"\2" * 32)))
    await writer.drain()
    await _closed_within(reader, 5.0)
    await until(lambda: n1.refusals["auth"] == 1, what="auth refusal counted")
    assert n1.auth_failures == 1
    writer.close()


def _section(certs, node: str, **overrides: object) -> ClusterSection:
    cert, key = certs.nodes.get(node, certs.stranger)
    settings: dict[str, object] = {
        "node": node,
        "secret": SECRET.decode(),
        "tls_certfile": str(cert),
        "tls_keyfile": str(key),
        "tls_cafile": str(certs.ca),
    }
    settings.update(overrides)
    return ClusterSection(**settings)  # type: ignore[arg-type]


async def test_mutual_tls_links_replicate_and_refuse_strangers_and_plaintext(hubs, tmp_path):
    certs = make_node_certificates(tmp_path / "certs", ("n1", "n2"))
    contexts = {n: replication_contexts(_section(certs, n)) for n in ("n1", "n2")}
    n1 = await hubs.add("n1", SECRET, server_ssl=contexts["n1"][0], client_ssl=contexts["n1"][1])
    n2 = await hubs.add("n2", SECRET, server_ssl=contexts["n2"][0], client_ssl=contexts["n2"][1])
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 8)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    follower = member_log(tmp_path, "n2")
    n2.follow(STREAM, follower, "n1", 1)
    await until(caught_up(follower, leader), what="n2 catching up over mutual TLS")
    # a node whose certificate is of another CA (same secret) cannot link
    stranger_ssl = replication_contexts(_section(certs, "n9"))
    host, port = hubs.addresses["n1"]
    # (TLS 1.3: the refusal of our certificate arrives after our side's handshake)
    with pytest.raises((OSError, asyncio.IncompleteReadError)):
        reader, writer = await asyncio.open_connection(host, port, ssl=stranger_ssl[1])
        await handshake_dialer(reader, writer, "n9", SECRET, None)
    # plaintext on the TLS port is refused too
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(wire.encode(wire.Hello("n9")))
    await writer.drain()
    await _closed_within(reader, 5.0)
    writer.close()
    # neither became a connection: no link, nothing under the cap
    assert n1.incoming == 1 and n1.refusals["auth"] == 0
    assert "n9" not in n1.links
    n2.unfollow(STREAM)
    follower.close()


def test_cluster_tls_settings_go_together_and_need_the_secret(tmp_path):
    with pytest.raises(ConfigError, match="go together"):
        ClusterSection(node="n1", secret=SECRET.decode(), tls_certfile="a.pem").validate()
    with pytest.raises(ConfigError, match=r"needs cluster\.secret"):
        ClusterSection(node="n1", tls_certfile="a", tls_keyfile="b", tls_cafile="c").validate()
    with pytest.raises(ConfigError, match="max_incoming_links"):
        ClusterSection(node="n1", secret=SECRET.decode(), max_incoming_links=0).validate()
    with pytest.raises(ConfigError, match="handshake_timeout_seconds"):
        ClusterSection(node="n1", secret=SECRET.decode(), handshake_timeout_seconds=0).validate()
    missing = ClusterSection(
        node="n1",
        secret=SECRET.decode(),
        tls_certfile=str(tmp_path / "nope.pem"),
        tls_keyfile=str(tmp_path / "nope.key"),
        tls_cafile=str(tmp_path / "ca.pem"),
    )
    missing.validate()
    with pytest.raises(ConfigError, match="cluster TLS"):
        replication_contexts(missing)
