"""The member's commit view on real follower logs: readers see exactly the chunks up to
the learned cluster commit (across segment rolls), a ``next`` reader waits right after
the last committed chunk, a divergent suffix is never shown and a reader keeps going
across its truncation onto the new leader's chunks; a cut below what was shown breaks
the view."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.log.acceptor_helpers import SMALL, replicate, span_bytes, write_leader_chunks
from tierlog.log.committed_chunk import chunk_end, last_user_chunk
from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader
from tierlog.log.writer import StreamLog
from tierlog.server.member_view import MemberCommitView


def chunk_ids(log: StreamLog) -> list[tuple[int, int]]:
    """(chunk id, next offset) of every chunk of ``log``."""
    out = []
    offset = 0
    while (got := span_bytes(log, offset, 1)) is not None:
        out.append((offset, got[1]))
        offset = got[1]
    return out


def records(reader: LogReader) -> list[tuple[int, bytes]]:
    return [(offset, bytes(data)) for offset, data in reader.records()]


def test_readers_see_exactly_the_learned_commit_across_rolls(tmp_path: Path) -> None:
    leader = StreamLog.create(str(tmp_path / "leader"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(leader, 40)
    leader.sync()
    follower = StreamLog.create_follower(str(tmp_path / "f" / "v_s_1"), SMALL)
    replicate(leader, follower)
    assert len(follower.segment_refs()) > 3
    view = MemberCommitView(follower)
    assert view.commit_point().chunk_id == -1
    assert records(LogReader(view, OffsetSpec.first())) == []
    everything = records(LogReader(leader, OffsetSpec.first()))
    for chunk_id, next_offset in chunk_ids(leader):
        assert view.set_limit(chunk_id)
        point = view.commit_point()
        assert (point.chunk_id, point.next_offset) == (chunk_id, next_offset)
        assert point == chunk_end(follower, chunk_id)
        seen = records(LogReader(view, OffsetSpec.first()))
        assert seen == [r for r in everything if r[0] < next_offset]
        # ``next`` waits right after the committed chunk, not at the log's end
        assert LogReader(view, OffsetSpec.next()).next_offset == next_offset
        # ``last`` is the last user chunk up to it
        last = LogReader(view, OffsetSpec.last()).next_offset
        assert last_user_chunk(follower, chunk_id) == (last if last <= chunk_id else -1)
    assert not view.set_limit(0)  # never down
    follower.close()
    leader.close()


def test_a_divergent_suffix_is_never_shown_and_readers_follow_the_new_leader(
    tmp_path: Path,
) -> None:
    old = StreamLog.create(str(tmp_path / "old"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(old, 10)
    old.sync()
    common = chunk_ids(old)
    committed_id, committed_next = common[-1]
    # the new leader holds the committed prefix, then writes in a newer epoch
    new = StreamLog.create_follower(str(tmp_path / "new" / "v_s_1"), SMALL)
    replicate(old, new)
    new.start_epoch(2)
    new.append([b"new-1", b"new-2"])
    new.append([b"new-3"])
    new.sync()
    # the old leader wrote a suffix the member copied but a majority never held
    old.append([b"lost-1"] * 3)
    old.append([b"lost-2"])
    old.sync()
    member = StreamLog.create_follower(str(tmp_path / "m" / "v_s_1"), SMALL)
    replicate(old, member)
    view = MemberCommitView(member)
    view.set_limit(committed_id)
    reader = LogReader(view, OffsetSpec.next())
    first = LogReader(view, OffsetSpec.first())
    assert reader.next_offset == committed_next
    assert [r[1] for r in records(first)][-1] != b"lost-2"
    assert all(not r[1].startswith(b"lost") for r in records(LogReader(view, OffsetSpec.first())))
    assert records(reader) == []
    # the member cuts its suffix (the view keeps everything it showed) and follows
    member.truncate_after(committed_id)
    assert view.truncated(committed_id)
    replicate(new, member)
    view.set_limit(chunk_ids(new)[-1][0])
    assert [r[1] for r in records(reader)] == [b"new-1", b"new-2", b"new-3"]
    assert [r[1] for r in records(first)] == [b"new-1", b"new-2", b"new-3"]
    # a cut below what was shown breaks the view (its readers are told)
    member.truncate_after(-1)
    assert not view.truncated(-1)
    assert view.broken and not view.set_limit(10**6)
    for log in (member, new, old):
        log.close()


class Told:
    """A connection that uses a stream (``StreamListener``): records being told."""

    def __init__(self) -> None:
        self.unavailable = 0

    def stream_unavailable(self, stream: object) -> None:
        self.unavailable += 1

    def resume_publishing(self, stream: object) -> None:
        pass


async def test_member_handles_follow_the_follower(tmp_path: Path) -> None:
    """Not readable before the first commit; a commit opens and wakes it; a cut below
    what was shown, or the end of following (take-over, removal) tells its users and
    replaces it."""
    from tests.read.test_read_anywhere_inprocess import shared
    from tierlog.remote.catalog import Catalog
    from tierlog.server.member_reads import MemberReads
    from tierlog.server.remote_stream import RemoteStreams
    from tierlog.storage.fs_object_store import FsObjectStore
    from tierlog.storage.meta_store import open_meta_store

    config = shared(tmp_path, "member", read_only=False)
    meta = open_meta_store(config.storage.meta_store)
    catalog = Catalog(meta)
    record = catalog.create("v", "s")
    remote = RemoteStreams(config, catalog, FsObjectStore(tmp_path / "objects"))
    leader = StreamLog.create(str(tmp_path / "leader"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(leader, 12)
    leader.sync()
    follower = StreamLog.create_follower(str(tmp_path / "f" / record.incarnation), SMALL)
    replicate(leader, follower)
    reads = MemberReads(remote)
    assert reads.handle(record) is None  # not following yet
    reads.opened(record, follower)
    handle = reads.handle(record)
    assert handle is not None and handle.unavailable is None
    told = Told()
    handle.listeners.add(told)
    # subscribed before any commit reached the member: it waits, then reads from there
    early = handle.source.attach(OffsetSpec.next())
    assert await early.read() is None
    waiting = asyncio.ensure_future(early.wait())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    shown_id, shown_next = chunk_ids(leader)[3]
    reads.committed(record.incarnation, shown_id)
    await asyncio.wait_for(waiting, 1)
    assert reads.handle(record) is handle
    assert await early.read() is None
    assert early.next_offset == shown_next  # ``next``: after the commit it learned
    first = handle.source.attach(OffsetSpec.first())
    got = []
    while (chunk := await first.read()) is not None:
        got.append(chunk.chunk_id)
    assert got and got[-1] <= shown_id
    reads.committed(record.incarnation, chunk_ids(leader)[5][0])
    later = await early.read()
    assert later is not None and later.chunk_id >= shown_next
    first.close()
    early.close()
    reads.truncated(record.incarnation, chunk_ids(leader)[5][0])  # above what was shown
    assert told.unavailable == 0 and not handle.closed
    reads.truncated(record.incarnation, -1)  # rejoining: the shown range is gone
    assert told.unavailable == 1 and handle.closed
    again = reads.handle(record)
    assert again is not None and again is not handle and again.view.limit == -1
    reads.stopped(record.incarnation)
    assert again.closed and reads.handle(record) is None
    reads.close()
    remote.close()
    follower.close()
    leader.close()
    meta.close()


async def test_a_consumer_past_the_learned_commit_starts_at_the_chunk_holding_its_offset(
    tmp_path: Path,
) -> None:
    """A consumer resuming at an offset the member has written but not yet learned as
    committed waits at the view's end; once the commit moves past it, the first chunk it
    gets is the one that holds its offset, not the chunks between the old commit and it
    (clients skip records below their offset only inside the first chunk)."""
    from tierlog.server.chunk_source import CommitNotifier, LocalChunkSource

    leader = StreamLog.create(str(tmp_path / "leader"), "v", "s", SMALL, created_ns=1)
    write_leader_chunks(leader, 40)
    leader.sync()
    follower = StreamLog.create_follower(str(tmp_path / "f" / "v_s_1"), SMALL)
    replicate(leader, follower)
    chunks = chunk_ids(leader)
    view = MemberCommitView(follower)
    view.set_limit(chunks[10][0])  # the learned commit lags what the member wrote
    resume_at = chunks[20][0] + 1 if chunks[20][1] > chunks[20][0] + 1 else chunks[20][0]
    source = LocalChunkSource(view, CommitNotifier())
    cursor = source.attach(OffsetSpec.offset(resume_at))
    assert await cursor.read() is None  # nothing committed at or after it yet
    view.set_limit(chunks[-1][0])
    first = await cursor.read()
    assert first is not None
    assert first.chunk_id <= resume_at < first.next_offset
    cursor.close()
    follower.close()
    leader.close()
