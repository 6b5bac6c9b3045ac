"""Committed-tail queries between in-process hubs on loopback: the leader's answer
(commit, offset after it, last user chunk, a producer's sequence) reaches the asker; a
node that does not lead the stream answers at once that it does not; an unreachable
node gives None after the timeout, never a made-up tail."""

from __future__ import annotations

import socket
import time

import pytest

from tests.cluster.hub_helpers import STREAM, Cluster
from tests.cluster.test_cluster_metrics import scrape, value, watched
from tests.log.acceptor_helpers import SMALL, write_leader_chunks
from tierlog.formats import replication as wire
from tierlog.log.committed_chunk import chunk_end, last_user_chunk
from tierlog.log.writer import StreamLog


@pytest.fixture
async def cluster():
    c = Cluster()
    yield c
    await c.stop()


async def test_tail_queries(cluster: Cluster, tmp_path) -> None:
    n1 = await cluster.add("n1")
    n2 = await cluster.add("n2")
    log = StreamLog.create(str(tmp_path / "n1"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(log, 20)
    log.sync()
    commit = log.commit_point().chunk_id
    end = chunk_end(log, commit)
    assert end is not None and end.next_offset == log.next_offset
    last = last_user_chunk(log, commit)
    sequence = log.producer_sequence("prod")
    assert sequence is not None

    async def answer(stream: str, reference: str) -> wire.Tail | None:
        if stream != STREAM:
            return None
        known = log.producer_sequence(reference) if reference else None
        return wire.Tail(stream, 4, 0, True, commit, end.next_offset, last, known or -1)

    n1.tail_answerer = answer
    tail = await n2.query_tail(STREAM, "n1", "prod", timeout=5)
    assert tail is not None
    assert (tail.epoch, tail.commit_chunk_id, tail.next_offset) == (4, commit, log.next_offset)
    assert (tail.last_user_chunk_id, tail.sequence) == (last, sequence)
    started = time.monotonic()
    assert await n2.query_tail("another-stream", "n1", timeout=5) is None
    assert time.monotonic() - started < 2  # answered "not leading", not timed out
    assert await n1.query_tail(STREAM, "n2", timeout=5) is None  # n2 answers no tails
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        cluster.addresses["n3"] = s.getsockname()  # nobody listens there
    started = time.monotonic()
    assert await n2.query_tail(STREAM, "n3", timeout=0.5) is None
    assert 0.4 < time.monotonic() - started < 3
    assert n2.tails.unanswered == 1 and n1.tails.answered == 1
    assert value(scrape(watched(n2)), "tierlog_cluster_tail_queries_unanswered_total") == 1
    assert value(scrape(watched(n1)), "tierlog_cluster_tail_queries_answered_total") == 1
    log.close()
