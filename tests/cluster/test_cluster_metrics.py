"""The cluster's metrics as a scrape shows them: two real hubs on loopback replicating a
real log (link bytes and frames move on both sides and agree, a paused leader makes the
member's fetches time out, counters survive a link cut and the stream being unfollowed,
refused links are counted),
and the leader-side values (worst member lag, streams without a majority) from a real
``LeaderState`` driven through an election."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.hub_helpers import STREAM, Cluster, CuttingProxy, Recorder, caught_up, until
from tests.log.acceptor_helpers import SMALL, write_leader_chunks
from tierlog.cluster.hub import ReplicationHub
from tierlog.cluster.link import read_frame
from tierlog.cluster.log_history import Tail
from tierlog.cluster.members import Membership
from tierlog.cluster.membership import Leadership
from tierlog.cluster.node import ClusterNode
from tierlog.cluster.state import EpochAdopted, LeaseTiming, LocalWritten, MemberAcked, Phase
from tierlog.formats import replication as wire
from tierlog.log.writer import StreamLog
from tierlog.metrics import Metrics
from tierlog.server.cluster_metrics import member_lag, watch_hub, without_majority


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a real exposition, parsed back: (name, labels) -> value."""
    body, _ = metrics.exposition()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def watched(hub: ReplicationHub) -> Metrics:
    metrics = Metrics()
    watch_hub(metrics, lambda: hub)
    return metrics


class PausingProxy:
    """A TCP proxy to ``target`` whose leader-to-member direction can be held: bytes
    wait in the proxy (the connection stays up) until it is resumed."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return ("127.0.0.1", self._server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, gate: asyncio.Event | None
        ) -> None:
            try:
                while data := await src.read(65536):
                    if gate is not None:
                        await gate.wait()
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, None), pipe(up_reader, writer, self.flowing))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def cluster():
    c = Cluster()
    yield c
    await c.stop()


def leader_log(tmp_path: Path) -> StreamLog:
    return StreamLog.create(str(tmp_path / "n1"), "v", "s", SMALL, created_ns=1)


def member_log(tmp_path: Path) -> StreamLog:
    return StreamLog.create_follower(str(tmp_path / "n2" / STREAM), SMALL)


async def test_link_traffic_and_fetch_timeouts_show_in_the_scrape(cluster, tmp_path):
    n1 = await cluster.add("n1")
    proxy = PausingProxy(cluster.addresses["n1"])
    proxied = await proxy.start()
    n2 = await cluster.add("n2")
    real = dict(cluster.addresses)
    n2._peers = lambda node: proxied if node == "n1" else real[node]
    m1, m2 = watched(n1), watched(n2)
    before = scrape(m2)
    assert value(before, "tierlog_cluster_streams_followed") == 0
    assert value(before, "tierlog_cluster_fetch_timeouts_total") == 0
    assert value(before, "tierlog_cluster_replica_buffer_limit_bytes") == n2.budget.limit

    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 30)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    member = member_log(tmp_path)
    n2.follow(STREAM, member, "n1", 1)
    await until(caught_up(member, leader), what="catch-up")
    leader_bytes = sum(s.stat().st_size for s in Path(leader.stream_dir).glob("*.segment"))
    on_leader, on_member = scrape(m1), scrape(m2)
    assert value(on_member, "tierlog_cluster_streams_followed") == 1
    assert value(on_member, "tierlog_cluster_link_up", peer="n1") == 1
    assert value(on_leader, "tierlog_cluster_link_up", peer="n2") == 1
    sent = value(on_leader, "tierlog_cluster_link_sent_bytes_total", peer="n2")
    received = value(on_member, "tierlog_cluster_link_received_bytes_total", peer="n1")
    assert sent is not None and received is not None
    assert received >= leader_bytes * 0.9  # the chunks (segment headers are not sent)
    assert sent >= received  # heartbeats may be on their way
    assert value(on_leader, "tierlog_cluster_link_received_frames_total", peer="n2") >= 2
    assert value(on_member, "tierlog_cluster_link_sent_frames_total", peer="n1") >= 2
    assert value(on_leader, "tierlog_cluster_open_segment_files") >= 1
    assert value(on_member, "tierlog_cluster_fetch_timeouts_total") == 0

    # the leader's answers stop arriving (link up, nothing through): fetches time out
    proxy.flowing.clear()
    await until(
        lambda: value(scrape(m2), "tierlog_cluster_fetch_timeouts_total") >= 1,
        timeout=10,
        what="a fetch timeout in the scrape",
    )
    proxy.flowing.set()
    write_leader_chunks(leader, 10, start=30)
    n1.wake(STREAM)
    await until(caught_up(member, leader), what="catch-up after the pause")
    timeouts = value(scrape(m2), "tierlog_cluster_fetch_timeouts_total")
    assert value(scrape(m2), "tierlog_cluster_refused_appends_total") == 0

    # unfollowing keeps the counts: counters never go down
    n2.unfollow(STREAM)
    after = scrape(m2)
    assert value(after, "tierlog_cluster_streams_followed") == 0
    assert value(after, "tierlog_cluster_fetch_timeouts_total") == timeouts
    await proxy.stop()
    member.close()
    leader.close()


async def test_link_counters_keep_counting_across_a_cut(cluster, tmp_path):
    n1 = await cluster.add("n1", fetch_bytes=3000)
    proxy = CuttingProxy(cluster.addresses["n1"], cut_after=5000)
    proxied = await proxy.start()
    n2 = await cluster.add("n2")
    real = dict(cluster.addresses)
    n2._peers = lambda node: proxied if node == "n1" else real[node]
    m2 = watched(n2)
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 60)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    member = member_log(tmp_path)
    n2.follow(STREAM, member, "n1", 1)
    await until(caught_up(member, leader), what="resume after the cut")
    assert proxy.cuts == 1 and proxy.connections >= 2
    samples = scrape(m2)
    received = value(samples, "tierlog_cluster_link_received_bytes_total", peer="n1")
    leader_bytes = sum(s.stat().st_size for s in Path(leader.stream_dir).glob("*.segment"))
    # the first link's bytes (about 5000 before the cut) are still counted
    assert received is not None and received >= leader_bytes * 0.9
    assert value(samples, "tierlog_cluster_link_up", peer="n1") == 1
    n2.unfollow(STREAM)
    await proxy.stop()
    member.close()
    leader.close()


async def test_refused_links_are_counted(cluster):
    n1 = await cluster.add("n1")
    metrics = watched(n1)
    host, port = cluster.addresses["n1"]
    # garbage instead of a handshake: a malformed frame
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"\x00\x00\x00\x05garbage-garbage")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    # a dialer that does not hold the secret: an authentication failure
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(wire.encode(wire.Hello("n9")) + wire.encode(wire.Challenge(bytes(32))))
    for _ in range(3):
        await read_frame(reader)  # HELLO, CHALLENGE, PROOF
    writer.write(wire.encode(wire.Proof(bytes(32))))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    await until(
        lambda: value(scrape(metrics), "tierlog_cluster_link_auth_failures_total") == 1,
        what="the bad proof in the scrape",
    )
    samples = scrape(metrics)
    assert value(samples, "tierlog_cluster_link_malformed_frames_total") == 1
    assert value(samples, "tierlog_cluster_link_send_failures_total") == 0
    assert value(samples, "tierlog_cluster_link_up", peer="n9") is None  # never linked


def test_member_lag_and_majority_follow_the_leader_state():
    timing = LeaseTiming(ttl=10.0, drift=1.0)
    node = ClusterNode("a", timing, clock=lambda: 0.0)
    leadership = Leadership("v_s_1", "a", 2, Membership(("a", "b", "c")), 1, 1)
    leader = node.lead(leadership, Tail(1, 100), acquired_at=0.0)
    leader.start(0.0)
    assert leader.state.phase is Phase.ADOPTING
    assert without_majority(leader, 0.0, 2.0)
    leader.handle(EpochAdopted("b", 2, Tail(1, 100)), 0.1)
    assert leader.state.phase is Phase.LEADING
    leader.handle(LocalWritten(150, 2), 0.2)
    assert member_lag(leader) == 151  # neither b nor c acked in epoch 2 yet
    leader.handle(MemberAcked("b", 2, 150), 0.3)
    leader.handle(MemberAcked("c", 2, 120), 0.3)
    assert member_lag(leader) == 30
    assert not without_majority(leader, 0.35, 2.0)
    leader.handle(MemberAcked("c", 2, 150), 0.4)
    assert member_lag(leader) == 0
    # b and c go silent: after two heartbeats the majority is gone
    assert not without_majority(leader, 2.0, 2.0)
    assert without_majority(leader, 2.5, 2.0)
