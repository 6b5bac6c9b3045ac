"""``tierlog msgstore dump DIR``: every record of every segment as one JSON line, read-only.

A salvage tool for both formats. Each line holds ``file``, ``position``, ``type``
(``MESSAGE``, ``MESSAGE_WITH_CHECKSUM``, ``HOLE``, ``SMALL_HOLE``; v1 records are
``V1_MESSAGE``), ``size``, ``msg_id`` (hex, null for holes), ``live`` and ``body`` (base64;
for v1 the record's body bytes as stored, an Erlang term). ``live`` comes from tierlog's
clean-shutdown file when present; otherwise a v2 message is live unless it is a second copy
of a msg id (a compaction remnant), and a v1 record's liveness comes from RabbitMQ's index
when it was written at a clean shutdown, else it is null (unknown). A v2 file that stops
scanning (zero-filled region, unknown type) gets an ``error`` line naming the position and
the dump goes on with the next file. Nothing in the directory is modified, opened for
writing or deleted (RabbitMQ's own recovery deletes ``clean.dot`` and its ``.ets`` files).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, TextIO

from tierlog.formats import msgstore as fmt
from tierlog.formats.errors import CleanFileError, MsgStoreFormatError, RecordChecksumError
from tierlog.formats.msgstore_clean import decode_clean
from tierlog.logs import get_logger
from tierlog.msgstore.errors import NotADirectoryStoreError
from tierlog.msgstore.files import (
    CLEAN_FILE,
    V1_EXT,
    V2_EXT,
    list_segments,
    scan_v1_fd,
    scan_v2_fd,
)
from tierlog.msgstore.recovery import load_rabbit_index

log = get_logger(__name__)

_TYPE_NAMES = {
    fmt.SMALL_HOLE: "SMALL_HOLE",
    fmt.HOLE: "HOLE",
    fmt.MESSAGE: "MESSAGE",
    fmt.MESSAGE_WITH_CHECKSUM: "MESSAGE_WITH_CHECKSUM",
}


def dump(directory: str | os.PathLike[str], out: TextIO) -> int:
    """Write the JSON lines; return how many files could not be scanned completely."""
    path = Path(directory)
    if not path.is_dir():
        raise NotADirectoryStoreError(f"{path} is not a directory")
    clean = _clean_index(path)
    rabbit = load_rabbit_index(path) if clean is None else None
    errors = 0
    for file in list_segments(path, V1_EXT):
        _dump_v1(path, file, clean, rabbit, out)
    for file in list_segments(path, V2_EXT):
        errors += _dump_v2(path, file, clean, out)
    return errors


def _clean_index(path: Path) -> dict[bytes, tuple[int, int]] | None:
    clean = path / CLEAN_FILE
    if not clean.exists():
        return None
    try:
        state = decode_clean(clean.read_bytes())
    except CleanFileError as exc:
        log.warning("msgstore_dump_clean_file_rejected", file=str(clean), error=str(exc))
        return None
    return {e.msg_id: (e.file, e.offset) for e in state.entries}


def _line(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, separators=(",", ":")) + "\n")


def _dump_v1(
    path: Path,
    file: int,
    clean: dict[bytes, tuple[int, int]] | None,
    rabbit: Any,
    out: TextIO,
) -> None:
    name = f"{file}{V1_EXT}"
    fd = os.open(path / name, os.O_RDONLY)
    try:
        result = scan_v1_fd(fd)
        for rec in result.records:
            assert rec.msg_id is not None
            live: bool | None
            if clean is not None:
                live = clean.get(rec.msg_id) == (file, rec.position)
            elif rabbit is not None:
                loc = rabbit.get(rec.msg_id)
                live = bool(
                    loc is not None
                    and loc.ref_count > 0
                    and loc.file == file
                    and loc.offset == rec.position
                )
            else:
                live = None
            body = os.pread(fd, rec.size - fmt.V1_OVERHEAD, rec.position + 24)
            _line(
                out,
                {
                    "file": name,
                    "position": rec.position,
                    "type": "V1_MESSAGE",
                    "size": rec.size,
                    "msg_id": rec.msg_id.hex(),
                    "live": live,
                    "body": base64.b64encode(body).decode(),
                },
            )
    finally:
        os.close(fd)


def _dump_v2(path: Path, file: int, clean: dict[bytes, tuple[int, int]] | None, out: TextIO) -> int:
    name = f"{file}{V2_EXT}"
    fd = os.open(path / name, os.O_RDONLY)
    try:
        try:
            result = scan_v2_fd(fd, check=True)
        except MsgStoreFormatError as exc:
            _line(out, {"file": name, "error": type(exc).__name__, "message": str(exc)})
            log.warning("msgstore_dump_file_unreadable", file=name, error=str(exc))
            return 1
        seen: set[bytes] = set()
        for rec in result.records:
            obj: dict[str, Any] = {
                "file": name,
                "position": rec.position,
                "type": _TYPE_NAMES[rec.type],
                "size": rec.size,
                "msg_id": None,
                "live": None,
                "body": None,
            }
            if rec.msg_id is not None:
                data = os.pread(fd, rec.size, rec.position)
                head = (
                    fmt.CHECKSUM_MESSAGE_MIN
                    if rec.type == fmt.MESSAGE_WITH_CHECKSUM
                    else (fmt.MESSAGE_MIN)
                )
                obj["msg_id"] = rec.msg_id.hex()
                if clean is not None:
                    obj["live"] = clean.get(rec.msg_id) == (file, rec.position)
                else:
                    obj["live"] = rec.msg_id not in seen
                seen.add(rec.msg_id)
                obj["body"] = base64.b64encode(data[head:]).decode()
                try:
                    fmt.decode_message(data)
                except RecordChecksumError as exc:
                    obj["error"] = str(exc)
            _line(out, obj)
        if result.torn:
            _line(
                out,
                {
                    "file": name,
                    "position": result.end,
                    "torn_tail_bytes": result.file_size - result.end,
                },
            )
        return 0
    finally:
        os.close(fd)
