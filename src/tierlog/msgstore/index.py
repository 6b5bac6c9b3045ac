"""The in-memory index: where each live message is, and what each file holds."""

from __future__ import annotations


class Location:
    """Where a live message is and how many references it has."""

    __slots__ = ("file", "offset", "ref_count", "size")

    def __init__(self, ref_count: int, file: int, offset: int, size: int) -> None:
        self.ref_count = ref_count
        self.file = file
        self.offset = offset
        self.size = size


class FileInfo:
    """Per file: its size (the append position of the current file), the live bytes, the
    msg ids located in it (so deleting a file drops its index entries at once), and its gaps.

    Every gap of a v2 file is one hole on disk (one HOLE record, or SMALL_HOLE bytes below
    5 bytes): a removal merges its record with the holes on either side. So compaction can
    write inside any gap without first rewriting the gap's header, and a write lost in a
    crash can never expose the inside of a hole. ``hole_end`` maps a gap's start to its
    end, ``hole_start`` its end to its start."""

    __slots__ = ("hole_end", "hole_start", "live_bytes", "msg_ids", "size", "truncate_unsynced")

    def __init__(self, size: int) -> None:
        self.size = size
        self.live_bytes = 0
        self.msg_ids: set[bytes] = set()
        self.hole_end: dict[int, int] = {}
        self.hole_start: dict[int, int] = {}
        self.truncate_unsynced = False
        """A compaction's truncation is not fsynced yet: it must be before the file is
        written again (else a durable hole over a moved copy could outlive the truncation
        and let the original, past the intended end, come back)."""

    def add_hole(self, start: int, end: int) -> tuple[int, int]:
        """Record the gap [start, end), merged with the gaps touching it: the merged extent."""
        before = self.hole_start.pop(start, None)
        if before is not None:
            del self.hole_end[before]
            start = before
        after = self.hole_end.pop(end, None)
        if after is not None:
            del self.hole_start[after]
            end = after
        self.hole_end[start] = end
        self.hole_start[end] = start
        return start, end

    def set_holes(self, live: list[tuple[int, int]], first: int, end: int) -> None:
        """Recompute the gaps from the live records ``(offset, size)`` in [first, end)."""
        self.hole_end.clear()
        self.hole_start.clear()
        cursor = first
        for offset, size in sorted(live):
            if offset > cursor:
                self.hole_end[cursor] = offset
                self.hole_start[offset] = cursor
            cursor = offset + size
        if end > cursor:
            self.hole_end[cursor] = end
            self.hole_start[end] = cursor
