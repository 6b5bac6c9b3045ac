"""Opening a store: clean recovery from the clean-shutdown file, or dirty recovery that
rebuilds the index and ``last_v1_file`` by scanning every segment."""

from __future__ import annotations

import os
from pathlib import Path

from tierlog.formats import msgstore as fmt
from tierlog.formats.errors import EtsFileError, MsgStoreFormatError
from tierlog.formats.ets_file import MsgLocation, read_msg_locations
from tierlog.formats.msgstore_clean import decode_clean
from tierlog.logs import get_logger
from tierlog.msgstore.errors import CorruptSegmentError, MixedStoreError
from tierlog.msgstore.files import (
    RABBIT_CLEAN_FILE,
    RABBIT_INDEX_FILE,
    V1_EXT,
    V2_EXT,
    last_v1_file_on_disk,
    list_segments,
    scan_v1_fd,
    scan_v2_fd,
)
from tierlog.msgstore.index import FileInfo, Location
from tierlog.msgstore.port import StoreFiles

log = get_logger(__name__)


def recover_clean(store: StoreFiles, data: bytes) -> None:
    state = decode_clean(data)
    if state.last_v1_file != last_v1_file_on_disk(store.directory):
        raise MixedStoreError("clean-shutdown file's last_v1_file does not match the files")
    store.last_v1_file = state.last_v1_file
    load_file_sizes(store)
    for e in state.entries:
        info = store.files.get(e.file)
        if info is None:
            raise MixedStoreError(f"clean-shutdown file names missing file {e.file}")
        store.index[e.msg_id] = Location(e.ref_count, e.file, e.offset, e.total_size)
        info.msg_ids.add(e.msg_id)
        info.live_bytes += e.total_size
    for file in list_segments(store.directory, V2_EXT):
        info = store.files[file]
        locs = (store.index[m] for m in info.msg_ids)
        info.set_holes([(loc.offset, loc.size) for loc in locs], fmt.HEADER_SIZE, info.size)


def load_file_sizes(store: StoreFiles) -> None:
    for ext in (V1_EXT, V2_EXT):
        for file in list_segments(store.directory, ext):
            store.files[file] = FileInfo(os.stat(store.directory / f"{file}{ext}").st_size)


def recover_dirty(store: StoreFiles) -> None:
    """Rebuild the index and ``last_v1_file`` by scanning: v2 files first (a message in
    both a v1 file and a v2 file was migrated: the v2 copy wins), then v1 files with
    liveness from RabbitMQ's index when it was written at a clean shutdown."""
    store.last_v1_file = last_v1_file_on_disk(store.directory)
    load_file_sizes(store)
    duplicates = 0
    for file in list_segments(store.directory, V2_EXT):
        duplicates += _recover_v2_file(store, file)
    rabbit = load_rabbit_index(store.directory)
    store.v1_liveness_known = rabbit is not None
    for file in list_segments(store.directory, V1_EXT):
        _recover_v1_file(store, file, rabbit)
    log.info(
        "msgstore_recovered_dirty",
        directory=str(store.directory),
        messages=len(store.index),
        duplicates_dropped=duplicates,
        last_v1_file=store.last_v1_file,
        v1_liveness="rabbitmq_index" if rabbit is not None else "unknown",
    )


def _recover_v2_file(store: StoreFiles, file: int) -> int:
    """Index a v2 file's messages (first copy of a msg id wins), cut a torn tail, and make
    each gap one hole again: a second copy left by a crash during compaction becomes part
    of the hole around it, so it can never come back."""
    fd = store.file_fd(file)
    try:
        result = scan_v2_fd(fd)
    except MsgStoreFormatError as exc:
        raise CorruptSegmentError(f"{store.path_of(file)}: {exc}") from exc
    info = store.files[file]
    duplicates = 0
    whole_holes: set[tuple[int, int]] = set()
    live: list[tuple[int, int]] = []
    for rec in result.records:
        if rec.msg_id is None:
            if rec.type == fmt.HOLE:
                whole_holes.add((rec.position, rec.position + rec.size))
            continue
        if rec.msg_id in store.index:
            duplicates += 1
            continue
        store.index[rec.msg_id] = Location(1, file, rec.position, rec.size)
        info.msg_ids.add(rec.msg_id)
        info.live_bytes += rec.size
        live.append((rec.position, rec.size))
    end = result.end
    if end < result.file_size or end < fmt.HEADER_SIZE:
        if end < fmt.HEADER_SIZE:
            os.ftruncate(fd, 0)
            os.pwrite(fd, fmt.encode_header(), 0)
            end = fmt.HEADER_SIZE
        else:
            os.ftruncate(fd, end)
        log.warning(
            "msgstore_torn_tail_dropped",
            file=str(store.path_of(file)),
            position=end,
            bytes=result.file_size - end,
        )
    info.size = end
    info.set_holes(live, fmt.HEADER_SIZE, end)
    merged = 0
    for start, stop in info.hole_end.items():
        if stop - start >= fmt.HOLE_MIN and (start, stop) not in whole_holes:
            os.pwrite(fd, fmt.hole_marker(stop - start), start)
            merged += 1
    if merged or end < result.file_size:
        os.fsync(fd)
    store.crash_point("recover.file_scanned")
    return duplicates


def _recover_v1_file(store: StoreFiles, file: int, rabbit: dict[bytes, MsgLocation] | None) -> None:
    result = scan_v1_fd(store.file_fd(file))
    info = store.files[file]
    for rec in result.records:
        msg_id = rec.msg_id
        assert msg_id is not None
        if msg_id in store.index:
            continue
        ref_count = 1
        if rabbit is not None:
            loc = rabbit.get(msg_id)
            if loc is None or loc.ref_count <= 0 or loc.file != file or loc.offset != rec.position:
                continue
            ref_count = loc.ref_count
        store.index[msg_id] = Location(ref_count, file, rec.position, rec.size)
        info.msg_ids.add(msg_id)
        info.live_bytes += rec.size


def load_rabbit_index(directory: Path) -> dict[bytes, MsgLocation] | None:
    """RabbitMQ's index when it was written at a clean shutdown (``clean.dot`` and
    ``msg_store_index.ets`` both present and readable), else None (liveness unknown)."""
    index_path = directory / RABBIT_INDEX_FILE
    if not (directory / RABBIT_CLEAN_FILE).exists() or not index_path.exists():
        return None
    try:
        return read_msg_locations(index_path.read_bytes())
    except EtsFileError as exc:
        log.warning("msgstore_rabbit_index_unreadable", file=str(index_path), error=str(exc))
        return None
