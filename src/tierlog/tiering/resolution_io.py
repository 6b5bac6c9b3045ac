"""The I/O of startup resolution: read what ``tiering.resolution`` needs from the remote
tier past (and at) the committed manifest's tail (the chain of uploaded-but-unlisted
fragments, the last committed fragment's segment position), then carry its decision out
(restart the local log past the remote tail with the tracking state replayed from it,
and the fencing commit).

``tiering.resolution`` decides from these facts without I/O. This module is kept apart
from the running tierer because it runs once per start, for thousands of streams at a
node restart, so the fragment reads go out concurrently on the shared resolution pool.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from dataclasses import dataclass

from tierlog.formats.chunk import decode_header
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.dictionaries import read_chunk_bytes
from tierlog.remote.fragments import FragmentEntry, RemoteFragment, RemoteStream
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.storage.errors import StorageError
from tierlog.tiering.committer import ManifestCommitter
from tierlog.tiering.errors import CommitRetryError
from tierlog.tiering.fragment_build import local_chunks, read_fragment_checked
from tierlog.tiering.resolution import (
    Chain,
    CommittedRange,
    Fetched,
    LocalLog,
    adopted_before,
    fetched_end,
    follow_chain,
    needs_committed_tail,
    resolve,
    stream_first_offset,
)
from tierlog.tiering.state import TieringConfig, TieringState

log = get_logger(__name__)

RESOLUTION_BATCH = 64  # listed fragments fetched per round of resolution


@dataclass(frozen=True, slots=True)
class ResolveResult:
    next_offset: int
    adopted: int
    restarted_local: bool


class StartupResolver:
    """Startup resolution of one stream's tierer (one use)."""

    def __init__(
        self,
        stream_log: StreamLog,
        remote: RemoteStream,
        committer: ManifestCommitter,
        reads: Executor,
        epoch: int,
        config: TieringConfig,
    ) -> None:
        self.log = stream_log
        self.remote = remote
        self.committer = committer
        self._reads = reads  # shared by every stream resolving
        self.epoch = epoch
        self.config = config

    def run(self) -> tuple[ResolveResult, TieringState]:
        """Resolve and carry the decision out; the state machine to start from."""
        committer = self.committer
        tree = committer.load()
        committed = CommittedRange(tree.first_offset, tree.next_offset, tree.is_empty)
        chain = self.uncommitted_chain(tree.next_offset)
        tail = None
        if needs_committed_tail(committed, chain):
            tail = self.last_fragment_position(tree)
        self.log.set_stream_first_offset(stream_first_offset(committed))
        local = LocalLog(self.log.first_offset, self.log.next_offset, self.log.max_epoch)
        decision = resolve(committed, chain, local, self.epoch, tail)
        if decision.restart_epoch is not None:
            # timestamps stay monotonic across the restart: the remote tail may be newer
            remote_max_ts = max(
                [tree.header().max_timestamp] + [f.entry().max_timestamp for f in chain.fragments]
            )
            # the tracking replay reads the chain's tail
            self._restart_local(
                decision.next_offset, decision.restart_epoch, remote_max_ts, chain.fragments
            )
        adopted = list(decision.adopted)
        pointer = committer.pointer
        already_fenced = (
            pointer is not None and pointer.root_uid is not None and pointer.epoch == self.epoch
        )
        if adopted or decision.restart_epoch is not None or not already_fenced:
            # a restart under the epoch the pointer already carries changes no owner: the
            # commit would only rewrite the same root (two MetaStore writes and a PUT per
            # stream, the bulk of a restart of thousands of streams)
            self._fencing_commit(adopted)
        state = TieringState(
            self.config, committed_next=decision.next_offset, last_fragment=decision.last_fragment
        )
        result = ResolveResult(
            decision.next_offset, len(adopted), decision.restart_epoch is not None
        )
        return result, state

    def _fencing_commit(self, adopted: list[FragmentEntry], attempts: int = 8) -> None:
        """Commit our epoch (and what resolution adopted) before uploading anything."""
        for attempt in range(attempts):
            try:
                self.committer.commit(adopted)
                return
            except CommitRetryError:
                if attempt == attempts - 1:
                    raise
                time.sleep(min(self.config.retry_max, self.config.retry_base * 2**attempt))

    def _restart_local(
        self,
        next_offset: int,
        epoch: int,
        remote_max_timestamp: int,
        uncommitted: tuple[RemoteFragment, ...],
    ) -> None:
        """The remote tier is ahead: continue the local log past it, with the tracking
        state replayed from the remote tail's segment."""
        tracking = self.tracking_at(self.committer.tree, next_offset, uncommitted)
        log.warning(
            "local_log_restarted_past_remote",
            stream_dir=self.remote.stream_dir,
            remote_next_offset=next_offset,
            local_next_offset=self.log.next_offset,
            epoch=epoch,
        )
        self.log.restart_at(next_offset, epoch, tracking.to_bytes(), remote_max_timestamp)

    def uncommitted_chain(self, start: int) -> Chain:
        """The adoptable chain after the committed manifest. Fragments chain by next offset,
        known only from a trailer, so the candidates come from a listing of ``data/`` and
        are read concurrently; an offset the listing missed is read when the chain gets
        there, so an incomplete listing costs reads, never correctness."""
        fetched: dict[int, Fetched] = {}
        listed = self._listed_from(start)
        want = listed or []
        while True:
            fetched.update(self._fetch_fragments([o for o in want if o not in fetched]))
            local = local_chunks(self.log, start, fetched_end(start, fetched))
            chain = follow_chain(start, fetched, self.epoch, local)
            if chain.unfetched is None:
                return chain
            at = chain.unfetched
            if listed is not None:  # list on from where the chain got to
                listed = self._listed_from(at)
            want = [at, *(o for o in listed or [] if o != at)]

    def _listed_from(self, start: int) -> list[int] | None:
        """First offsets of fragment objects at or after ``start`` (None: listing failed,
        so the chain is followed one read at a time)."""
        try:
            return self.remote.uncommitted_offsets(start, RESOLUTION_BATCH)
        except StorageError as exc:
            log.warning(
                "fragment_listing_failed", stream_dir=self.remote.stream_dir, error=str(exc)
            )
            return None

    def _fetch_fragments(self, offsets: list[int]) -> dict[int, Fetched]:
        """Metadata of the fragments at ``offsets``, read with bounded concurrency."""
        if len(offsets) <= 1:
            return {o: self._fetch_fragment(o) for o in offsets}
        return dict(zip(offsets, self._reads.map(self._fetch_fragment, offsets), strict=True))

    def _fetch_fragment(self, first_offset: int) -> Fetched:
        try:
            return read_fragment_checked(self.remote, first_offset)
        except Exception as exc:  # an error counts only if the chain reaches this offset
            return exc

    def last_fragment_position(self, tree: ManifestTree) -> tuple[int, int] | None:
        """(segment first offset, sequence number) of the committed manifest's last
        fragment (None when it is gone)."""
        loc = tree.locate_offset(tree.next_offset - 1, self.remote.load)
        fragment = read_fragment_checked(self.remote, loc.entry.first_offset)
        if fragment is None:
            return None
        return (fragment.trailer.segment_first_offset, fragment.trailer.seq_no)

    def tracking_at(
        self, tree: ManifestTree, next_offset: int, uncommitted: tuple[RemoteFragment, ...]
    ) -> TrackingState:
        """The tracking state at ``next_offset``, replayed from the remote tail's segment
        (the committed manifest, then the ``uncommitted`` chain being adopted)."""
        tracking = TrackingState()
        if tree.next_offset == 0 and next_offset == 0:
            return tracking
        # Walk back to the first fragment of the last segment, then replay forward.
        first = self._fragment_starting_before(tree, uncommitted, next_offset)
        if first is None:
            return tracking
        segment = first.trailer.segment_first_offset
        chain = [first]
        while chain[-1].trailer.seq_no > 0 and chain[-1].trailer.first_offset > segment:
            prev = self._fragment_starting_before(tree, uncommitted, chain[-1].trailer.first_offset)
            if prev is None or prev.trailer.segment_first_offset != segment:
                break
            chain.append(prev)
        for fragment in reversed(chain):
            key = self.remote.fragment_key(fragment.trailer.first_offset)
            # the chunks as the segment held them (a v2 fragment's frames decoded: its
            # stored bytes are compressed and/or sealed, not chunks)
            data = memoryview(read_chunk_bytes(self.remote.store, key, fragment.index))

            def read(position: int, length: int, data: memoryview = data) -> memoryview:
                return data[position : position + length]

            position = 0
            for _ in range(len(fragment.index)):
                header = decode_header(data, position)
                replay_chunk(tracking, header, position, read)
                position += header.total_size
        return tracking

    def _fragment_starting_before(
        self, tree: ManifestTree, uncommitted: tuple[RemoteFragment, ...], offset: int
    ) -> RemoteFragment | None:
        """The remote fragment holding ``offset - 1`` (manifest or adopted chain)."""
        target = offset - 1
        if target < 0:
            return None
        if not tree.is_empty and target < tree.next_offset:
            loc = tree.locate_offset(target, self.remote.load)
            return read_fragment_checked(self.remote, loc.entry.first_offset)
        # Beyond the manifest: the chain resolution is adopting.
        return adopted_before(uncommitted, target)
