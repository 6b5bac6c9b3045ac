"""A log's epoch history: for each epoch, the first and last chunk id written in it.

The cluster decisions summarise a log by this history (``cluster.log_history``); the
log keeps it as plain ``(epoch, first chunk id, last chunk id)`` tuples because the log
layer may not import the cluster layer. It is maintained per chunk in O(1) (epochs
never go down along a log) and rebuilt on open from the index files: a segment whose
first and last index record carry the same epoch is one range, so only segments where
the epoch changed are read whole.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from tierlog.formats.segment import (
    FILE_HEADER_SIZE,
    INDEX_RECORD_DTYPE,
    INDEX_RECORD_SIZE,
    decode_index_record,
    index_record_count,
    index_record_position,
)
from tierlog.log.segment_files import SegmentRef, pread_exact

EpochRangeTuple = tuple[int, int, int]
"""(epoch, first chunk id, last chunk id), both ids inclusive."""

NO_CHUNK = -1


class EpochHistory:
    """The epoch ranges of one log, oldest first (mutated by the writer thread only;
    ``ranges`` returns an immutable copy for other threads)."""

    __slots__ = ("_ranges",)

    def __init__(self, ranges: Sequence[EpochRangeTuple] = ()) -> None:
        self._ranges: list[list[int]] = [list(r) for r in ranges]

    def add(self, epoch: int, chunk_id: int) -> None:
        """Chunk ``chunk_id`` of ``epoch`` was appended (ids and epochs only go up)."""
        ranges = self._ranges
        if ranges and ranges[-1][0] == epoch:
            ranges[-1][2] = chunk_id
        else:
            ranges.append([epoch, chunk_id, chunk_id])

    def ranges(self) -> tuple[EpochRangeTuple, ...]:
        return tuple((e, f, la) for e, f, la in self._ranges)

    def tail(self) -> tuple[int, int]:
        """(epoch of the last chunk, last chunk id); ``(0, -1)`` for an empty log."""
        if not self._ranges:
            return (0, NO_CHUNK)
        last = self._ranges[-1]
        return (last[0], last[2])

    @classmethod
    def load(cls, refs: Sequence[SegmentRef]) -> EpochHistory:
        """Rebuild from the index files of ``refs`` (oldest first; indexes recovered)."""
        history = cls()
        for ref in refs:
            for epoch, first, last in _segment_ranges(ref.index_path):
                ranges = history._ranges
                if ranges and ranges[-1][0] == epoch:
                    ranges[-1][2] = last
                else:
                    ranges.append([epoch, first, last])
        return history


def _segment_ranges(index_path: str) -> list[EpochRangeTuple]:
    fd = os.open(index_path, os.O_RDONLY)
    try:
        count = index_record_count(os.fstat(fd).st_size)
        if count == 0:
            return []
        first = decode_index_record(pread_exact(fd, INDEX_RECORD_SIZE, FILE_HEADER_SIZE))
        last = decode_index_record(
            pread_exact(fd, INDEX_RECORD_SIZE, index_record_position(count - 1))
        )
        if first.epoch == last.epoch:
            return [(first.epoch, first.chunk_id, last.chunk_id)]
        raw = pread_exact(fd, count * INDEX_RECORD_SIZE, FILE_HEADER_SIZE)
    finally:
        os.close(fd)
    records = np.frombuffer(raw, INDEX_RECORD_DTYPE, count)
    epochs = records["epoch"]
    ids = records["chunk_id"]
    starts = np.flatnonzero(np.concatenate(([True], epochs[1:] != epochs[:-1])))
    ends = np.concatenate((starts[1:] - 1, [count - 1]))
    return [(int(epochs[s]), int(ids[s]), int(ids[e])) for s, e in zip(starts, ends, strict=True)]
