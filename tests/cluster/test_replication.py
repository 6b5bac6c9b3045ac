"""The per-stream replication exchange, member and leader side, with frames going
through the real wire codec: adopt, truncation of a divergent suffix, verbatim appends,
acks after fsync, commit visibility, and refusals of older epochs."""

from __future__ import annotations

from tierlog.cluster import replication as rep
from tierlog.cluster.log_history import NO_CHUNK, history_of
from tierlog.formats import replication as wire

STREAM = "%2F_orders_1"


def through_wire(frame: wire.Frame) -> wire.Frame:
    return wire.decode(wire.encode(frame))


class Leader:
    """A leader log of one-offset chunks ``(epoch, id)``; data is the id as 8 bytes."""

    def __init__(self, epoch: int, chunks: list[tuple[int, int]], commit: int) -> None:
        self.epoch, self.chunks, self.commit = epoch, chunks, commit

    def answer(self, fetch: wire.Fetch, join_offset: int = 0) -> wire.Frame:
        answer = rep.answer_fetch(
            STREAM,
            self.epoch,
            history_of(self.chunks),
            len(self.chunks),
            self.commit,
            through_wire(fetch),  # type: ignore[arg-type]
            join_offset,
        )
        if isinstance(answer, rep.ServeChunks):
            part = self.chunks[answer.from_offset : answer.from_offset + 3]
            data = b"".join(cid.to_bytes(8, "big") for _, cid in part)
            return through_wire(
                wire.Chunks(
                    STREAM,
                    self.epoch,
                    answer.from_offset,
                    answer.from_offset + len(part),
                    self.commit,
                    len(part),
                    data,
                )
            )
        return through_wire(answer)


class Member:
    """A member's log and the shell that carries out the session's actions."""

    def __init__(self, chunks: list[tuple[int, int]], highest: int) -> None:
        self.chunks = chunks
        self.persisted = highest
        self.session = rep.ReplicaSession(STREAM, history_of(chunks), len(chunks), highest)
        self.sent: list[wire.Frame] = []
        self.visible = NO_CHUNK

    def run(self, actions: list[rep.Action], leader: Leader) -> None:
        """Carry out actions; answer fetches from ``leader`` until nothing is left."""
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, rep.PersistEpoch):
                self.persisted = action.epoch
            elif isinstance(action, rep.Truncate):
                del self.chunks[action.keep_through + 1 :]
                queue += self.session.truncated(history_of(self.chunks), len(self.chunks))
            elif isinstance(action, rep.AppendChunks):
                frame = action.chunks
                ids = [
                    int.from_bytes(frame.data[i : i + 8], "big")
                    for i in range(0, len(frame.data), 8)
                ]
                self.chunks += [(leader.chunks[cid][0], cid) for cid in ids]
                queue += self.session.written(history_of(self.chunks), len(self.chunks))
            elif isinstance(action, rep.SetCommit):
                self.visible = action.chunk_id
            elif isinstance(action, rep.Send):
                assert self.persisted >= self.session.guard.highest  # persisted before sent
                self.sent.append(through_wire(action.frame))
                if isinstance(action.frame, wire.Fetch):
                    answer = leader.answer(action.frame)
                    if isinstance(answer, wire.Chunks) and answer.chunk_count == 0:
                        continue  # caught up: a real leader holds the fetch until data
                    queue += self.session.on_frame(answer)


def test_adopt_persists_then_reports_the_tail() -> None:
    member = Member([(1, 0), (1, 1), (2, 2)], highest=2)
    actions = member.session.on_frame(wire.Adopt(STREAM, 5))
    assert actions == [
        rep.PersistEpoch(5),
        rep.Send(wire.Adopted(STREAM, 5, True, 5, 2, 2)),
    ]
    refused = member.session.on_frame(wire.Adopt(STREAM, 4))
    assert len(refused) == 1 and isinstance(refused[0], rep.Send)
    frame = refused[0].frame
    assert isinstance(frame, wire.Refused)
    assert frame.code is wire.RefusalCode.STALE_EPOCH and frame.highest_epoch == 5


def test_member_cuts_its_divergent_suffix_then_copies_the_leader() -> None:
    leader = Leader(3, [(1, 0), (1, 1), (3, 2), (3, 3), (3, 4), (3, 5)], commit=4)
    member = Member([(1, 0), (1, 1), (2, 2), (2, 3)], highest=2)  # epoch 2 never committed
    member.run(member.session.on_frame(wire.Adopt(STREAM, 3)), leader)
    member.run([rep.Send(member.session.fetch())], leader)
    assert member.chunks == leader.chunks
    assert member.persisted == 3
    acks = [f for f in member.sent if isinstance(f, wire.Written)]
    assert acks and acks[-1] == wire.Written(STREAM, 3, 5)
    assert member.visible == 4


def test_commit_is_never_visible_beyond_the_local_log() -> None:
    member = Member([(1, 0)], highest=1)
    member.session.on_frame(wire.Adopt(STREAM, 1))
    actions = member.session.on_frame(wire.Commit(STREAM, 1, 9))
    assert actions == [rep.SetCommit(0)]
    assert member.session.on_frame(wire.Commit(STREAM, 1, 9)) == []


def test_chunks_from_an_older_epoch_are_refused_and_not_appended() -> None:
    member = Member([(1, 0)], highest=4)
    member.session.on_frame(wire.Adopt(STREAM, 4))
    stale = wire.Chunks(STREAM, 3, 1, 2, 0, 1, bytes(8))
    actions = member.session.on_frame(stale)
    assert [type(a) for a in actions] == [rep.Send]
    assert isinstance(actions[0], rep.Send) and isinstance(actions[0].frame, wire.Refused)


def test_chunks_that_do_not_continue_the_log_are_ignored() -> None:
    member = Member([(1, 0), (1, 1)], highest=1)
    member.session.on_frame(wire.Adopt(STREAM, 1))
    gap = wire.Chunks(STREAM, 1, 5, 6, NO_CHUNK, 1, bytes(8))
    assert member.session.on_frame(gap) == []
    again = wire.Chunks(STREAM, 1, 1, 2, NO_CHUNK, 1, bytes(8))  # overlaps chunk 1
    assert member.session.on_frame(again) == []


def test_leader_answers_by_the_member_tail() -> None:
    history = history_of([(1, 0), (1, 1), (3, 2), (3, 3)])

    def answer(fetch: wire.Fetch, join: int = 0) -> rep.FetchAnswer:
        return rep.answer_fetch(STREAM, 3, history, 4, 3, fetch, join)

    assert answer(wire.Fetch(STREAM, 3, 2, 1, 1, 100)) == rep.ServeChunks(2, 100)
    assert answer(wire.Fetch(STREAM, 3, 0, 0, NO_CHUNK, 100)) == rep.ServeChunks(0, 100)
    assert answer(wire.Fetch(STREAM, 3, 0, 0, NO_CHUNK, 100), join=2) == rep.ServeChunks(2, 100)
    divergent = answer(wire.Fetch(STREAM, 3, 4, 2, 3, 100))
    assert isinstance(divergent, wire.History)
    assert divergent.ranges == ((1, 0, 1), (3, 2, 3)) and divergent.commit_chunk_id == 3
    older = answer(wire.Fetch(STREAM, 2, 2, 1, 1, 100))  # a member still on epoch 2
    assert isinstance(older, wire.History)
    newer = answer(wire.Fetch(STREAM, 4, 2, 1, 1, 100))
    assert isinstance(newer, wire.Refused) and newer.code is wire.RefusalCode.NOT_LEADER
    beyond = answer(wire.Fetch(STREAM, 3, 9, 3, 3, 100))
    assert isinstance(beyond, wire.Refused) and beyond.code is wire.RefusalCode.OUT_OF_RANGE


def test_late_joiner_starts_at_the_join_offset() -> None:
    leader = Leader(2, [(1, 0), (1, 1), (2, 2), (2, 3)], commit=3)
    member = Member([], highest=0)
    member.session.on_frame(wire.Adopt(STREAM, 2))
    fetch = member.session.fetch()
    answer = leader.answer(fetch, join_offset=2)
    assert isinstance(answer, wire.Chunks) and answer.first_chunk_id == 2
    actions = member.session.on_frame(answer)
    assert [type(a) for a in actions] == [rep.AppendChunks]  # nothing held yet to expose
    after = member.session.written(history_of([(2, 2), (2, 3)]), 4)
    assert after[0] == rep.Send(wire.Written(STREAM, 2, 3))
    assert after[1] == rep.SetCommit(3)


def test_member_below_the_leaders_local_log_drops_its_copy_and_rejoins() -> None:
    session = rep.ReplicaSession(STREAM, history_of([(1, i) for i in range(5)]), 5, 1)
    session.follow(2)
    assert session.below_local_log(1) == []  # a stale answer from another epoch's leader
    assert session.below_local_log(2) == [rep.Truncate(NO_CHUNK)]
    actions = session.truncated((), 0)
    # the answer to a fetch that was in flight before the drop: the copy is gone already
    assert session.below_local_log(2) == []
    assert len(actions) == 1 and isinstance(actions[0], rep.Send)
    fetch = actions[0].frame
    assert isinstance(fetch, wire.Fetch)
    assert fetch.tail_chunk_id == NO_CHUNK and fetch.epoch == 2  # an empty member's fetch
    joined = rep.answer_fetch(
        STREAM, 2, history_of([(2, i) for i in range(40, 50)]), 50, 49, fetch, 40
    )
    assert joined == rep.ServeChunks(40, fetch.max_bytes)


def test_commit_is_not_shown_over_a_divergent_suffix_before_the_history() -> None:
    """A member back from an older epoch holds chunks the new leader never wrote; a
    COMMIT of the new epoch arriving before the leader's HISTORY must not make them
    readable (only chunks known to be the leader's are shown)."""
    leader = Leader(3, [(1, 0), (1, 1), (3, 2), (3, 3), (3, 4), (3, 5)], commit=4)
    member = Member([(1, 0), (1, 1), (2, 2), (2, 3), (2, 4)], highest=2)
    follow = member.session.follow(3)
    member.run([a for a in follow if isinstance(a, rep.PersistEpoch)], leader)  # fetch in flight
    member.run(member.session.on_frame(wire.Commit(STREAM, 3, 4)), leader)
    assert member.visible == NO_CHUNK  # (2, 2..4) would have been shown: not the leader's
    member.run([rep.Send(member.session.fetch())], leader)
    assert member.chunks == leader.chunks
    assert member.visible == 4


def test_adopt_by_a_new_leader_forgets_what_agreed_with_the_old_one() -> None:
    old = Leader(2, [(1, 0), (2, 1), (2, 2)], commit=1)
    member = Member([(1, 0)], highest=1)
    member.run(member.session.follow(2), old)
    assert member.chunks == old.chunks and member.visible == 1
    # a new leader elected without us never saw (2, 2); its commit must not show it
    member.run(member.session.on_frame(wire.Adopt(STREAM, 3)), old)
    member.run(member.session.on_frame(wire.Commit(STREAM, 3, 2)), old)
    assert member.visible == 1
    new = Leader(3, [(1, 0), (2, 1), (3, 2)], commit=2)
    member.run([rep.Send(member.session.fetch())], new)
    assert member.chunks == new.chunks and member.visible == 2
