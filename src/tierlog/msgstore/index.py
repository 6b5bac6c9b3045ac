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
    """Per file: its size (the append position of the current file), the live bytes, and
    the msg ids located in it (so deleting a file drops its index entries at once)."""

    __slots__ = ("live_bytes", "msg_ids", "size", "truncate_unsynced")

    def __init__(self, size: int) -> None:
        self.size = size
        self.live_bytes = 0
        self.msg_ids: set[bytes] = set()
        self.truncate_unsynced = False
        """A compaction's truncation is not fsynced yet: it must be before the file is
        written again (else a durable hole over a moved copy could outlive the truncation
        and let the original, past the intended end, come back)."""
