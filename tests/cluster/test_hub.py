"""Replication between in-process hubs on loopback with real stream logs: verbatim
copies (segment and index files byte-identical, rolls included), truncation of a
divergent suffix, older epochs refused, a late joiner, a link cut mid-CHUNKS, malformed
frames, a wrong secret, and a new leader's catch-up."""

from __future__ import annotations

import asyncio
import os

from tests.cluster.hub_helpers import (
    SECRET,
    STREAM,
    Recorder,
    caught_up,
    hubs_linked_through_a_cut,
    lead_and_follow,
    leader_log,
    member_log,
    replicate_streams,
    until,
)
from tests.log.acceptor_helpers import SMALL, replicate, stream_files, write_leader_chunks
from tierlog.cluster.link import handshake_dialer, read_frame
from tierlog.formats import replication as wire
from tierlog.log.writer import StreamLog


async def test_members_get_byte_identical_files(hubs, tmp_path):
    n1, n2, n3 = [await hubs.add(n) for n in ("n1", "n2", "n3")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 25)
    recorder = Recorder()
    n1.lead(STREAM, leader, 1, ("n2", "n3"), recorder)
    n1.serve(STREAM)
    logs = {n: member_log(tmp_path, n) for n in ("n2", "n3")}
    commits: dict[str, list[int]] = {"n2": [], "n3": []}
    for name, hub in (("n2", n2), ("n3", n3)):
        hub.follow(STREAM, logs[name], "n1", 1, on_commit=commits[name].append)
    for name in logs:
        await until(caught_up(logs[name], leader), what=f"{name} catching up")
    # more chunks while they follow: parked fetches are woken
    write_leader_chunks(leader, 30, start=25)
    n1.wake(STREAM)
    for name in logs:
        await until(caught_up(logs[name], leader), what=f"{name} following")
    assert len(leader.list_segments()) > 5
    await until(lambda: all(recorder.written.get(n) == leader.last_chunk_id for n in logs))
    n1.set_commit(STREAM, leader.last_chunk_id)
    await until(lambda: all(c and c[-1] == leader.last_chunk_id for c in commits.values()))
    leader.sync()
    expected = stream_files(leader.stream_dir)
    for name, log in logs.items():
        assert stream_files(log.stream_dir) == expected, name
        assert log.read_member_epoch() == 1
        assert log.epoch_history() == leader.epoch_history()
    n2.unfollow(STREAM)
    n3.unfollow(STREAM)
    for log in logs.values():
        log.close()
    leader.close()


async def test_divergent_suffix_is_truncated_before_following(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 8)
    old = member_log(tmp_path, "n2")
    replicate(leader, old)
    # n2 led epoch 1 for a while alone: a suffix nobody else has
    old.close()
    deposed = StreamLog.open(old.stream_dir, SMALL, adopt_disk_epoch=True)
    write_leader_chunks(deposed, 9, start=8)
    assert deposed.tail()[0] == 1 and deposed.last_chunk_id > leader.last_chunk_id
    # n1 leads epoch 2
    leader.start_epoch(2)
    write_leader_chunks(leader, 4, start=100)
    n1.lead(STREAM, leader, 2, ("n2",), Recorder())
    n1.serve(STREAM)
    n2.follow(STREAM, deposed, "n1", 2)
    await until(caught_up(deposed, leader), what="truncate and catch up")
    leader.sync()
    assert stream_files(deposed.stream_dir) == stream_files(leader.stream_dir)
    assert deposed.epoch_history() == leader.epoch_history()
    assert deposed.read_member_epoch() == 2
    n2.unfollow(STREAM)
    deposed.close()
    leader.close()


async def test_older_epochs_are_refused(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 3)
    member = member_log(tmp_path, "n2")
    member.persist_member_epoch(3)
    n2.follow(STREAM, member)
    recorder = Recorder()
    n1.lead(STREAM, leader, 2, ("n2",), recorder)
    n1.request_adopt(STREAM, 2, ("n2",))
    await until(lambda: recorder.refused == [("n2", 3)], what="adopt refusal")
    assert member.read_member_epoch() == 3
    n1.serve(STREAM)
    n1.set_commit(STREAM, 0)  # a COMMIT in epoch 2: refused, nothing accepted
    await asyncio.sleep(0.3)
    assert member.next_offset == 0
    # the same node leading epoch 4: adopted, persisted, replicated
    n1.unlead(STREAM)
    leader.start_epoch(4)
    recorder = Recorder()
    n1.lead(STREAM, leader, 4, ("n2",), recorder)
    n1.request_adopt(STREAM, 4, ("n2",))
    await until(lambda: "n2" in recorder.adopted, what="adopted")
    assert recorder.adopted["n2"] == (4, 4, 0, -1)
    assert member.read_member_epoch() == 4
    n1.serve(STREAM)
    await until(caught_up(member, leader), what="follow the adopting leader")
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_late_joiner_starts_at_a_snapshot_segment(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 40)
    leader.sync()
    for segment in leader.list_segments()[:3]:
        leader.delete_segment(segment.first_offset)  # local retention ran
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    joiner = member_log(tmp_path, "n2")
    n2.follow(STREAM, joiner, "n1", 1)
    await until(caught_up(joiner, leader), what="late joiner")
    assert joiner.first_offset == leader.first_offset > 0
    assert stream_files(joiner.stream_dir) == stream_files(leader.stream_dir)
    assert joiner.producer_sequence("prod") == leader.producer_sequence("prod")
    n2.unfollow(STREAM)
    joiner.close()
    leader.close()


async def test_member_behind_the_leaders_local_retention_rejoins_at_its_first_segment(
    hubs, tmp_path
):
    """A member that was away while the leader's local retention deleted every segment
    holding its tail (those chunks are committed and in the remote tier) drops its
    stale local copy and starts again where the leader's log starts: it must not ask
    for the missing range for ever."""
    n1, n2 = [await hubs.add(n, retry_delay=0.05) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 10)
    member = member_log(tmp_path, "n2")
    lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="first catch-up")
    n2.unfollow(STREAM)
    n1.unlead(STREAM)
    write_leader_chunks(leader, 40, start=10)
    leader.sync()
    behind = member.last_chunk_id
    for segment in leader.list_segments()[:-2]:
        leader.delete_segment(segment.first_offset)  # local retention ran
    assert leader.first_offset > behind + 1
    lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="rejoin after retention")
    assert member.first_offset == leader.first_offset
    assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    assert n2.followed[STREAM].rejoins == 1
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_link_cut_mid_chunks_resumes_without_gap_or_duplicate(hubs, tmp_path):
    n1, n2, proxy = await hubs_linked_through_a_cut(hubs)
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 60)
    member = member_log(tmp_path, "n2")
    lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="resume after the cut")
    assert proxy.cuts == 1 and proxy.connections >= 2
    leader.sync()
    assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    assert n2.followed[STREAM].errors == 0
    n2.unfollow(STREAM)
    await proxy.stop()
    member.close()
    leader.close()


async def test_malformed_frames_close_the_link_and_the_hub_stays_up(hubs, tmp_path):
    n1 = await hubs.add("n1")
    host, port = hubs.addresses["n1"]
    # garbage before any handshake
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"\x00\x00\x00\x05garbage-garbage")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    # authenticated, then a malformed frame
    reader, writer = await asyncio.open_connection(host, port)
    assert await handshake_dialer(reader, writer, "rogue", SECRET, "n1") == "n1"
    bad = bytearray(wire.encode(wire.Written(STREAM, 1, 5)))
    bad[5] = 0x01  # reserved flags
    writer.write(bytes(bad))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    await until(lambda: n1.malformed_frames >= 2, what="malformed frames counted")
    # still serving real members
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 5)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    n2 = await hubs.add("n2")
    member = member_log(tmp_path, "n2")
    n2.follow(STREAM, member, "n1", 1)
    await until(caught_up(member, leader), what="replication after bad peers")
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_wrong_secret_is_refused(hubs, tmp_path):
    n1 = await hubs.add("n1")
    n2 = await hubs.add("n2", secret=b"not-the-cluster-secret")
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 5)
    member = member_log(tmp_path, "n2")
    lead_and_follow(n1, n2, leader, member)
    await until(lambda: n2.auth_failures >= 1, what="the dialer refuses n1's proof")
    await asyncio.sleep(0.3)
    assert member.next_offset == 0 and "n1" not in n2.links and "n2" not in n1.links
    # a dialer that does not hold the secret is refused by the acceptor too
    reader, writer = await asyncio.open_connection(*hubs.addresses["n1"])
    writer.write(wire.encode(wire.Hello("n9")) + wire.encode(wire.Challenge(bytes(32))))
    for _ in range(3):
        await read_frame(reader)  # HELLO, CHALLENGE, PROOF
    writer.write(wire.encode(wire.Proof(bytes(32))))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    await until(lambda: n1.auth_failures >= 1, what="the acceptor refuses a bad proof")
    assert "n9" not in n1.links
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_new_leader_catches_up_from_the_most_up_to_date_member(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    ahead = leader_log(tmp_path, "n2-src")
    write_leader_chunks(ahead, 20)
    lagging = member_log(tmp_path, "n1")
    while lagging.next_offset < 10:
        from tests.log.acceptor_helpers import span_bytes

        data, _ = span_bytes(ahead, lagging.next_offset, 1)
        lagging.accept_chunks(data)
    lagging.sync_to_disk()
    member = member_log(tmp_path, "n2")
    replicate(ahead, member)
    ahead.close()
    n2.follow(STREAM, member)
    recorder = Recorder()
    n1.lead(STREAM, lagging, 2, ("n2",), recorder)
    n1.request_adopt(STREAM, 2, ("n2",))
    await until(lambda: "n2" in recorder.adopted, what="adopted")
    _, _, tail_epoch, tail_id = recorder.adopted["n2"]
    assert (tail_epoch, tail_id) == member.tail()
    new_tail = await n1.catch_up(STREAM, "n2", (tail_epoch, tail_id))
    assert new_tail == member.tail() == lagging.tail()
    lagging.sync_to_disk()
    assert stream_files(lagging.stream_dir) == stream_files(member.stream_dir)
    # then it leads: its epoch's first chunk, served to the member
    lagging.start_epoch(2)
    n1.serve(STREAM)
    await until(caught_up(member, lagging), what="member follows the new leader")
    assert member.tail() == (2, lagging.last_chunk_id)
    n2.unfollow(STREAM)
    member.close()
    lagging.close()


def test_file_cache_is_bounded_and_never_serves_a_replaced_file(tmp_path):
    from tierlog.cluster.link import FileCache

    cache = FileCache(max_open=2)
    paths = []
    for i in range(4):
        path = tmp_path / f"{i}.segment"
        path.write_bytes(b"old-%d" % i)
        paths.append(str(path))
    pinned = cache.acquire(paths[0])
    for path in paths[1:]:
        cache.acquire(path)
        cache.release(path)
    assert len(cache) == 2 and paths[0] in cache._files  # the pinned one stays
    cache.release(paths[0])
    assert pinned.read() == b"old-0"
    f = cache.acquire(paths[3])
    cache.release(paths[3])
    os.unlink(paths[3])
    with open(paths[3], "wb") as out:
        out.write(b"new-3")
    again = cache.acquire(paths[3])
    assert again is not f and again.read() == b"new-3"
    cache.release(paths[3])
    cache.close()


async def test_links_over_mutual_tls(hubs, tmp_path):
    import ssl

    from tests.server.certificates import make_certificates

    certs = make_certificates(tmp_path / "certs")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    server.load_verify_locations(cafile=str(certs.ca))
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=str(certs.ca))
    client.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    options = {"server_ssl": server, "client_ssl": client}
    n1 = await hubs.add("n1", **options)
    n2 = await hubs.add("n2", **options)
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 20)
    member = member_log(tmp_path, "n2")
    lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="replication over TLS")
    leader.sync()
    assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_a_failed_append_is_retried_from_what_is_on_disk(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 20)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    member = member_log(tmp_path, "n2")
    real_accept = member.accept_chunks
    failures = []

    def failing_once(data, **options):
        if not failures:
            failures.append(1)
            raise OSError("disk hiccup")
        return real_accept(data, **options)

    member.accept_chunks = failing_once
    n2.follow(STREAM, member, "n1", 1)
    await until(caught_up(member, leader), what="catch up after a failed append")
    assert failures == [1]
    leader.sync()
    assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_a_small_receive_budget_slows_links_but_loses_nothing(hubs, tmp_path):
    n1 = await hubs.add("n1")
    n2 = await hubs.add("n2", max_buffered_bytes=1000)
    leaders, members = replicate_streams(tmp_path, n1, n2, [f"b{i}" for i in range(4)], 30)
    for leader, member in zip(leaders, members, strict=True):
        await until(caught_up(member, leader), what="replication under a small budget")
        leader.sync()
        assert stream_files(member.stream_dir) == stream_files(leader.stream_dir)
    await until(lambda: n2.budget.used == 0, what="budget given back")
    for log in leaders + members:
        log.close()


async def test_late_joiner_of_a_stream_without_tracking(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    for i in range(40):
        leader.append_records([b"plain-%d" % i] * 2)
    leader.sync()
    for segment in leader.list_segments()[:2]:
        leader.delete_segment(segment.first_offset)
    n1.lead(STREAM, leader, 1, ("n2",), Recorder())
    n1.serve(STREAM)
    joiner = member_log(tmp_path, "n2")
    n2.follow(STREAM, joiner, "n1", 1)
    await until(caught_up(joiner, leader), what="late joiner without tracking snapshots")
    assert joiner.first_offset == leader.first_offset > 0
    assert stream_files(joiner.stream_dir) == stream_files(leader.stream_dir)
    n2.unfollow(STREAM)
    joiner.close()
    leader.close()


async def test_failover_converges_every_member_to_the_new_leaders_log(hubs, tmp_path):
    """n1 leads epoch 1 and writes a suffix nobody copies; n2 takes over in epoch 2 with
    n3's adoption; n1 then follows n2, cutting its suffix: three identical logs."""
    nodes = {n: await hubs.add(n) for n in ("n1", "n2", "n3")}
    logs = {"n1": leader_log(tmp_path, "n1")}
    logs.update({n: member_log(tmp_path, n) for n in ("n2", "n3")})
    write_leader_chunks(logs["n1"], 20)
    nodes["n1"].lead(STREAM, logs["n1"], 1, ("n2", "n3"), Recorder())
    nodes["n1"].serve(STREAM)
    for n in ("n2", "n3"):
        nodes[n].follow(STREAM, logs[n], "n1", 1)
    for n in ("n2", "n3"):
        await until(caught_up(logs[n], logs["n1"]), what=f"{n} in epoch 1")
    # n1 is cut off: what it writes now is never replicated
    for n in ("n2", "n3"):
        nodes[n].unfollow(STREAM)
    nodes["n1"].unlead(STREAM)
    write_leader_chunks(logs["n1"], 6, start=20)
    nodes["n1"].follow(STREAM, logs["n1"])  # a member again, answering adoptions
    # n2 acquires epoch 2; n3 adopts (a majority with n2)
    nodes["n3"].follow(STREAM, logs["n3"])
    recorder = Recorder()
    logs["n2"].persist_member_epoch(2)
    nodes["n2"].lead(STREAM, logs["n2"], 2, ("n1", "n3"), recorder)
    nodes["n2"].request_adopt(STREAM, 2, ("n3",))
    await until(lambda: "n3" in recorder.adopted, what="n3 adopts epoch 2")
    logs["n2"].start_epoch(2)
    write_leader_chunks(logs["n2"], 5, start=40)
    nodes["n2"].serve(STREAM)
    await until(caught_up(logs["n3"], logs["n2"]), what="n3 follows n2")
    # n1 learns the new leader (the directory): its epoch-1 suffix is cut
    nodes["n1"].follow(STREAM, logs["n1"], "n2", 2)
    await until(caught_up(logs["n1"], logs["n2"]), what="n1 truncates and follows")
    logs["n2"].sync()
    expected = stream_files(logs["n2"].stream_dir)
    for n in ("n1", "n3"):
        assert stream_files(logs[n].stream_dir) == expected, n
        assert logs[n].read_member_epoch() == 2
        assert logs[n].epoch_history() == logs["n2"].epoch_history()
    assert [r[0] for r in logs["n1"].epoch_history()] == [1, 2]
    for n in ("n1", "n3"):
        nodes[n].unfollow(STREAM)
    for log in logs.values():
        log.close()


async def test_adoption_is_asked_again_until_the_member_registers(hubs, tmp_path):
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    recorder = Recorder()
    n1.lead(STREAM, leader, 3, ("n2",), recorder)
    n1.request_adopt(STREAM, 3, ("n2",))
    await asyncio.sleep(0.3)  # n2 does not know the stream yet: UNKNOWN_STREAM
    assert not recorder.adopted
    member = member_log(tmp_path, "n2")
    n2.follow(STREAM, member)
    await until(lambda: "n2" in recorder.adopted, what="adopted once registered")
    assert member.read_member_epoch() == 3
    n2.unfollow(STREAM)
    member.close()
    leader.close()


async def test_members_learn_the_leaders_remote_position(hubs, tmp_path):
    """TIERED: a member learns where the leader's remote tier ends (and where retention
    trimmed it) within a heartbeat of a change, never going back, and again over a new
    link; nothing before the leader's tierer told its log anything."""
    n1, n2 = [await hubs.add(n) for n in ("n1", "n2")]
    leader = leader_log(tmp_path)
    write_leader_chunks(leader, 10)
    member = member_log(tmp_path, "n2")
    lead_and_follow(n1, n2, leader, member)
    await until(caught_up(member, leader), what="catch-up")
    await asyncio.sleep(0.5)  # a few heartbeats: nothing to tell yet
    assert STREAM not in n2.remote_positions
    leader.set_tiered_offset(6)
    await until(lambda: n2.remote_positions.get(STREAM) == (0, 6), what="the tiered offset")
    leader.set_stream_first_offset(4)
    leader.set_tiered_offset(9)
    await until(lambda: n2.remote_positions.get(STREAM) == (4, 9), what="trim and growth")
    n2.links["n1"].close()  # a new link: the leader tells it again
    n2.remote_positions[STREAM] = (0, 0)  # (as a member that just started would have)
    await until(lambda: n2.remote_positions.get(STREAM) == (4, 9), what="told again")
    n2.unfollow(STREAM)
    assert STREAM not in n2.remote_positions
    member.close()
    leader.close()
