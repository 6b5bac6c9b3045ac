"""``tierlog dump``: every user record of a stream directory as JSON lines, oldest first.

Works read-only on directories written by tierlog or by RabbitMQ 3.x (Osiris):
tracking chunks are skipped, offsets may have gaps (tracking chunks take offsets),
sub-batches are decompressed when their codec is available.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any, TextIO

from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import LogReader, LogView


def iter_dump(stream_dir: str) -> Iterator[dict[str, Any]]:
    """One dict per user record: offset, chunk_id, timestamp, epoch, body (base64)."""
    view = LogView(stream_dir)
    with LogReader(view, OffsetSpec.first()) as reader:
        for chunk in reader.chunks():
            header = chunk.header
            for offset, record in chunk.records():
                yield {
                    "offset": offset,
                    "chunk_id": header.chunk_id,
                    "timestamp": header.timestamp,
                    "epoch": header.epoch,
                    "body": base64.b64encode(record).decode("ascii"),
                }


def dump(stream_dir: str, out: TextIO) -> int:
    """Write the JSON lines to ``out``; return how many records were written."""
    count = 0
    for item in iter_dump(stream_dir):
        out.write(json.dumps(item, separators=(",", ":")))
        out.write("\n")
        count += 1
    return count
