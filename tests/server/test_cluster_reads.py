"""A clustered stream's consumers read up to the cluster commit, not the local fsync."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tierlog.log.config import LogConfig
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.writer import StreamLog
from tierlog.server.chunk_source import CommitNotifier, LocalChunkSource
from tierlog.server.cluster_reads import ClusterCommitView


def make(tmp_path: Path) -> StreamLog:
    return StreamLog.create(str(tmp_path), "/", "r", LogConfig(max_segment_chunks=2), created_ns=1)  # type: ignore[arg-type]


async def drain(cursor: object) -> list[int]:
    ids = []
    while True:
        chunk = await cursor.read()  # type: ignore[attr-defined]
        if chunk is None:
            return ids
        ids.append(chunk.chunk_id)


def test_subscriber_sees_nothing_above_the_cluster_commit(tmp_path: Path) -> None:
    log = make(tmp_path)
    ids = [log.append([b"m%d" % i]).chunk_ids[0] for i in range(5)]
    assert log.commit_point().chunk_id == ids[-1]  # fsynced locally, all of it
    view = ClusterCommitView(log)
    notifier = CommitNotifier()

    async def run() -> None:
        source = LocalChunkSource(view, notifier)
        cursor = source.attach(OffsetSpec.first())
        latest = source.attach(OffsetSpec.next())
        assert await drain(cursor) == []  # nothing committed on a majority yet
        waiting = asyncio.create_task(cursor.wait(5.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert view.set_limit(ids[1])
        notifier.notify()
        await asyncio.wait_for(waiting, 1.0)
        assert await drain(cursor) == ids[:2]
        assert not view.set_limit(ids[0])  # never goes down
        assert await drain(cursor) == []
        view.set_limit(ids[3])
        notifier.notify()
        assert await drain(cursor) == ids[2:4]
        assert await drain(latest) == []  # attached at the local end: waits there
        log.append([b"m5"])
        assert await drain(cursor) == [] and await drain(latest) == []
        view.set_limit(log.commit_point().chunk_id)
        notifier.notify()
        assert await drain(cursor) == [*ids[4:], log.commit_point().chunk_id]
        assert await drain(latest) == [log.commit_point().chunk_id]
        cursor.close()
        latest.close()

    asyncio.run(run())
    log.close()


def test_reader_through_the_view_stops_at_the_limit(tmp_path: Path) -> None:
    log = make(tmp_path)
    ids = [log.append([b"m%d" % i]).chunk_ids[0] for i in range(4)]
    view = ClusterCommitView(log, limit=ids[2])
    assert view.commit_point().chunk_id == ids[2]
    assert view.wait_for_commit(ids[3], timeout=0.05).chunk_id == ids[2]
    with log.reader(OffsetSpec.first()) as r:
        assert [o for o, _ in r.records()] == ids
    from tierlog.log.reader import LogReader

    with LogReader(view, OffsetSpec.first()) as r:
        assert [o for o, _ in r.records()] == ids[:3]
    view.set_limit(ids[3])
    assert view.wait_for_commit(ids[3], timeout=0.05).chunk_id == ids[3]
    log.close()
