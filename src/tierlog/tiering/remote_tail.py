"""Reading what startup resolution needs from the remote tier past (and at) the committed
manifest's tail: the chain of uploaded-but-unlisted fragments, the last committed
fragment's segment position, and the tracking state at the remote tail.

``tiering.resolution`` decides from these facts without I/O; this module is the I/O that
gathers them, kept apart from the running tierer because it runs once per start (for
thousands of streams at a node restart, so the fragment reads go out concurrently on the
shared resolution pool).
"""

from __future__ import annotations

from concurrent.futures import Executor

from tierlog.formats.chunk import decode_header
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.log.writer import StreamLog
from tierlog.logs import get_logger
from tierlog.remote.fragments import RemoteFragment, RemoteStream
from tierlog.remote.manifest_tree import ManifestTree
from tierlog.storage.errors import StorageError
from tierlog.tiering.fragment_build import local_chunks, read_fragment_checked
from tierlog.tiering.resolution import Chain, Fetched, adopted_before, fetched_end, follow_chain

log = get_logger(__name__)

RESOLUTION_BATCH = 64  # listed fragments fetched per round of resolution


class RemoteTail:
    """The remote tier of one stream as startup resolution reads it."""

    def __init__(
        self, stream_log: StreamLog, remote: RemoteStream, reads: Executor, epoch: int
    ) -> None:
        self.log = stream_log
        self.remote = remote
        self._reads = reads  # shared by every stream resolving
        self.epoch = epoch

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
            data = memoryview(self.remote.store.get(key))

            def read(position: int, length: int, data: memoryview = data) -> memoryview:
                return data[position : position + length]

            for i in range(len(fragment.index)):
                _info, position = fragment.index.chunk(i)
                replay_chunk(tracking, decode_header(data, position), position, read)
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
