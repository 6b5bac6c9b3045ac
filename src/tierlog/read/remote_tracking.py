"""The tracking state (consumer offsets, producer sequences) at the remote tier's tail,
for a process that reads a stream it does not write.

The writer keeps consumer offsets in its log (tracking chunks); once tiered they are in
the remote tier. A reader that is not the writer rebuilds the state the way recovery does:
from the first chunk of the stream's last segment (a tracking snapshot) through every later
chunk. ``RemoteTracking`` does it incrementally: the first call replays the last segment,
later calls only the chunks committed since.
"""

from __future__ import annotations

import threading

from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.tracking import TrackingState, replay_chunk
from tierlog.read.manifest_source import ManifestSource
from tierlog.read.tiered_reader import TieredReader
from tierlog.remote.fragments import read_known_fragment


class RemoteTracking:
    """The tracking state of one stream as its committed remote tier holds it."""

    def __init__(self, manifest: ManifestSource) -> None:
        self._manifest = manifest
        self._state = TrackingState()
        self._reader: TieredReader | None = None
        self._lock = threading.Lock()

    def _last_segment_start(self) -> int | None:
        tree = self._manifest.tree()
        if tree.is_empty:
            return None
        loc = self._manifest.locate_offset(tree, tree.next_offset - 1)
        if loc.entry.is_segment:
            return loc.entry.first_offset
        fragment = read_known_fragment(self._manifest.store, loc.entry)
        return max(tree.first_offset, fragment.trailer.segment_first_offset)

    def state(self) -> TrackingState:
        """Replay what was committed since the last call (blocking: object-store reads)."""
        with self._lock:
            if self._reader is None:
                start = self._last_segment_start()
                if start is None:
                    return self._state
                self._reader = TieredReader(
                    None, self._manifest, OffsetSpec.offset(start), user_only=False
                )
            reader = self._reader
            state = self._state
            while True:
                chunk = reader.read_chunk()
                if chunk is None:
                    return state
                raw = chunk.raw
                assert raw is not None

                def read(position: int, length: int, raw: memoryview = raw) -> memoryview:
                    return raw[position : position + length]

                replay_chunk(state, chunk.header, 0, read)

    def consumer_offset(self, reference: str) -> int | None:
        return self.state().offsets.get(reference.encode())

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
