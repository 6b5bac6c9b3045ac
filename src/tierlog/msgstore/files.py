"""Segment file names, the ``last_v1_file`` boundary and the file-level scanners.

``file_format`` is the seed's ``file_format/2``: the only place that decides which format a
file number has. The scanners read with ``os.pread`` in large blocks and hand the bytes to
the pure scanners of ``tierlog.formats.msgstore``; a record that ends past the block moves
the next read to its end, so a hole of any size costs one header read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from tierlog.formats.msgstore import (
    HEADER_SIZE,
    Record,
    ScanStop,
    check_header,
    scan_block,
    scan_v1_block,
)

V1_EXT = ".rdq"
V2_EXT = ".sqs"
TMP_SUFFIX = ".tmp"
CLEAN_FILE = "tierlog_msgstore.clean"
"""tierlog's clean-shutdown file (RabbitMQ's own ``clean.dot`` is never touched)."""
RABBIT_CLEAN_FILE = "clean.dot"
RABBIT_INDEX_FILE = "msg_store_index.ets"
SCAN_BLOCK = 4 * 1024 * 1024

Format = Literal["v1", "v2"]


def file_format(file: int, last_v1_file: int | None) -> Format:
    """``file_format(_, none) -> v2; file_format(F, L) when F =< L -> v1; _ -> v2``."""
    if last_v1_file is None:
        return "v2"
    return "v1" if file <= last_v1_file else "v2"


def filenum_to_name(file: int, last_v1_file: int | None) -> str:
    return f"{file}{V1_EXT if file_format(file, last_v1_file) == 'v1' else V2_EXT}"


def list_segments(directory: Path, ext: str) -> list[int]:
    """File numbers of ``<n><ext>`` in ``directory``, ascending (other names are ignored)."""
    numbers = []
    for name in os.listdir(directory):
        stem, dot, rest = name.partition(".")
        if dot and "." + rest == ext and stem.isdigit():
            numbers.append(int(stem))
    return sorted(numbers)


def last_v1_file_on_disk(directory: Path) -> int | None:
    """The boundary recomputed from disk: the highest ``.rdq`` number, or None."""
    v1 = list_segments(directory, V1_EXT)
    return v1[-1] if v1 else None


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ScanResult:
    """Records of one file in position order, and where its last whole record ends."""

    __slots__ = ("end", "file_size", "records", "torn")

    def __init__(self, records: list[Record], end: int, file_size: int, torn: bool) -> None:
        self.records = records
        self.end = end
        self.file_size = file_size
        self.torn = torn


def scan_v2_fd(fd: int, *, check: bool = True) -> ScanResult:
    """Scan an open v2 segment. Typed errors from the record scanner propagate."""
    file_size = os.fstat(fd).st_size
    records: list[Record] = []
    if file_size < HEADER_SIZE:
        return ScanResult(records, 0, file_size, file_size > 0)
    if check:
        check_header(os.pread(fd, HEADER_SIZE, 0))
    position = HEADER_SIZE
    need = position
    while True:
        length = min(max(SCAN_BLOCK, need - position), file_size - position)
        block = os.pread(fd, length, position)
        stop: ScanStop = scan_block(block, position, position, file_size, records)
        if stop.need == 0:
            return ScanResult(records, stop.position, file_size, stop.torn)
        position, need = stop.position, stop.need


def scan_v1_fd(fd: int) -> ScanResult:
    """RabbitMQ's salvage scan of an open v1 segment (never fails: garbage is skipped)."""
    file_size = os.fstat(fd).st_size
    records: list[Record] = []
    seen: set[bytes] = set()
    position = need = 0
    while True:
        length = min(max(SCAN_BLOCK, need - position), file_size - position)
        block = os.pread(fd, length, position)
        stop = scan_v1_block(block, position, position, file_size, seen, records)
        if stop.need == 0:
            end = records[-1].position + records[-1].size if records else 0
            return ScanResult(records, end, file_size, False)
        position, need = stop.position, stop.need
