"""The commit point: where the fsynced (committed) part of a stream log ends."""

from __future__ import annotations

from typing import NamedTuple


class CommitPoint(NamedTuple):
    """The end of the committed (fsynced) log, published atomically for readers.

    ``chunk_id`` is the last committed chunk (-1 when none), ``next_offset`` the
    offset after it; ``segment_first_offset`` / ``end_position`` say where in which
    segment file the committed bytes end (where a ``next`` reader attaches).
    """

    chunk_id: int
    next_offset: int
    segment_first_offset: int
    end_position: int
