"""In-memory tracking state: producer sequences (dedup), consumer offsets, timestamps.

It is rebuilt from the last segment on open (its snapshot chunk, then deltas and the
trailers of user chunks), exactly as Osiris recovers it.
"""

from __future__ import annotations

from collections.abc import Callable

from tierlog.formats.chunk import ChunkHeader, ChunkType, single_entry_body
from tierlog.formats.tracking import (
    TrackingSnapshot,
    TrackingType,
    decode_delta,
    decode_snapshot,
    encode_snapshot,
)


class TrackingState:
    """Producer sequences (id -> (chunk id, sequence)), consumer offsets and timestamps."""

    __slots__ = ("offsets", "sequences", "timestamps")

    def __init__(self) -> None:
        self.sequences: dict[bytes, tuple[int, int]] = {}
        self.offsets: dict[bytes, int] = {}
        self.timestamps: dict[bytes, int] = {}

    def is_empty(self) -> bool:
        return not (self.sequences or self.offsets or self.timestamps)

    def apply_delta(self, chunk_id: int, buf: bytes | memoryview) -> None:
        """Apply delta entries carried by chunk ``chunk_id`` (delta chunk or user trailer)."""
        for kind, ident, value in decode_delta(buf):
            if kind == TrackingType.SEQUENCE:
                self.sequences[ident] = (chunk_id, value)
            elif kind == TrackingType.OFFSET:
                self.offsets[ident] = value
            else:
                self.timestamps[ident] = value

    def replace_with_snapshot(self, buf: bytes | memoryview) -> None:
        """Replace the whole state with a snapshot chunk's content."""
        snap = decode_snapshot(buf)
        self.sequences = snap.sequences
        self.offsets = snap.offsets
        self.timestamps = snap.timestamps

    def snapshot(self, first_offset: int, first_timestamp: int, max_producers: int) -> bytes:
        """Encode a snapshot, trimming as Osiris does.

        Offsets below the stream's first offset and timestamps below its first
        timestamp are dropped; only the ``max_producers`` producers that wrote most
        recently (highest chunk id) are kept. The state itself is trimmed the same way.
        """
        self.offsets = {k: v for k, v in self.offsets.items() if v >= first_offset}
        self.timestamps = {k: v for k, v in self.timestamps.items() if v >= first_timestamp}
        if len(self.sequences) > max_producers:
            newest = sorted(self.sequences.items(), key=lambda kv: kv[1][0])[-max_producers:]
            self.sequences = dict(newest)
        return self.to_bytes()

    def to_bytes(self) -> bytes:
        """The whole state in the snapshot encoding (untrimmed)."""
        return encode_snapshot(
            TrackingSnapshot(dict(self.sequences), dict(self.offsets), dict(self.timestamps))
        )

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> TrackingState:
        state = cls()
        state.replace_with_snapshot(buf)
        return state


ReadAt = Callable[[int, int], bytes | memoryview]
"""``read(position, length)``: bytes of the chunk's container (segment file or fragment)."""


def replay_chunk(tracking: TrackingState, header: ChunkHeader, position: int, read: ReadAt) -> None:
    """Apply one chunk to ``tracking`` as Osiris does on recovery: a snapshot replaces the
    state, a delta chunk's entries and a user chunk's trailer update it.

    The chunk starts at ``position`` of its container; only the bytes tracking needs are
    read (none for a user chunk without a trailer). Recovery (segment files) and the
    tierer (the remote tail's fragments) replay through this one function.
    """
    start = position + header.data_start
    if header.chunk_type == ChunkType.TRACKING_SNAPSHOT:
        body = read(start, header.data_length)
        tracking.replace_with_snapshot(single_entry_body(body, header.num_entries))
    elif header.chunk_type == ChunkType.TRACKING_DELTA:
        body = read(start, header.data_length)
        tracking.apply_delta(header.chunk_id, single_entry_body(body, header.num_entries))
    elif header.trailer_length:
        trailer = read(start + header.data_length, header.trailer_length)
        tracking.apply_delta(header.chunk_id, trailer)
