"""The file port of an open message store: what compaction, recovery and migration need.

The store (``store.MessageStore``) owns the open file descriptors, the index and the
crash hook; the steps that rewrite files (``compaction``, ``recovery``, ``migrate``) work
on a ``StoreFiles`` instead of on the store class, so they reach no private member and
``store.py`` is imported by none of them (it imports them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tierlog.msgstore.index import FileInfo, Location


class StoreFiles(Protocol):
    """An open store's files and index, for the steps that rewrite files."""

    directory: Path
    index: dict[bytes, Location]
    files: dict[int, FileInfo]
    last_v1_file: int | None
    current_file: int | None
    v1_liveness_known: bool
    bytes_written: int

    def path_of(self, file: int) -> Path:
        """The path of segment ``file`` (``.rdq`` at or below ``last_v1_file``)."""
        ...

    def file_fd(self, file: int) -> int:
        """The open descriptor of segment ``file`` (read-write for a v2 file)."""
        ...

    def write_fd(self, file: int) -> int:
        """``file_fd`` for a write: a pending truncation of the file is made durable
        first."""
        ...

    def close_fd(self, file: int) -> None:
        """Close segment ``file``'s descriptor, if open (the file is about to go)."""
        ...

    def next_file_number(self) -> int:
        """The number a new segment file gets."""
        ...

    def crash_point(self, name: str) -> None:
        """A step's side effect is done (tests stop the store here, ``crash_hook``)."""
        ...
