"""Many streams over one link: a bounded worker pool, no thread, task or connection per
stream, and a bounded cache of open segment files."""

from __future__ import annotations

import os
import threading
import time

from tests.cluster.hub_helpers import Cluster, replicate_streams, until

STREAMS = int(os.environ.get("HUB_SCALE_STREAMS", "100"))


async def test_many_streams_share_one_link_and_a_bounded_pool(tmp_path):
    cluster = Cluster()
    try:
        n1 = await cluster.add("n1", max_open_files=8, workers=2)
        n2 = await cluster.add("n2", max_open_files=8, workers=2)
        threads_before = threading.active_count()
        leaders, members = replicate_streams(tmp_path, n1, n2, [f"s{i}" for i in range(STREAMS)], 8)
        started = time.monotonic()
        await until(
            lambda: all(
                m.durable_point().next_offset == le.next_offset
                for m, le in zip(members, leaders, strict=True)
            ),
            timeout=120,
            what="all streams replicated",
        )
        seconds = time.monotonic() - started
        print(f"{STREAMS} streams x 8 chunks replicated in {seconds:.2f} s")
        assert len(n1.links) == 1 and len(n2.links) == 1
        assert len(n1.files) <= 8
        # the two hubs' pools (2 workers each) and nothing per stream
        assert threading.active_count() - threads_before <= 4 + 2
        for leader, member in zip(leaders, members, strict=True):
            assert member.epoch_history() == leader.epoch_history()
    finally:
        await cluster.stop()
        for log in leaders + members:
            log.close()
