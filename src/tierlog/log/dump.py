"""``tierlog dump``: every user record of a stream directory as JSON lines, oldest first.

Works read-only on directories written by tierlog or by RabbitMQ 3.x (Osiris):
tracking chunks are skipped, offsets may have gaps (tracking chunks take offsets),
sub-batches are decompressed when their codec is available.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from tierlog.log.offset_spec import OffsetSpec
from tierlog.log.reader import ChunkRead, LogReader, LogView


def iter_dump(stream_dir: str) -> Iterator[dict[str, Any]]:
    """One dict per user record: offset, chunk_id, timestamp, epoch, body (base64)."""
    view = LogView(stream_dir)
    with LogReader(view, OffsetSpec.first()) as reader:
        yield from dump_chunks(reader.chunks())


def dump_chunks(chunks: Iterable[ChunkRead]) -> Iterator[dict[str, Any]]:
    """The dump's dicts of every record of ``chunks`` (from any reader of either tier)."""
    for chunk in chunks:
        header = chunk.header
        for offset, record in chunk.records():
            yield {
                "offset": offset,
                "chunk_id": header.chunk_id,
                "timestamp": header.timestamp,
                "epoch": header.epoch,
                "body": base64.b64encode(record).decode("ascii"),
            }


def dump(stream_dir: str, out: TextIO, items: Iterable[dict[str, Any]] | None = None) -> int:
    """Write the JSON lines (of ``items``, default the directory's) to ``out``; return how
    many records were written."""
    count = 0
    for item in iter_dump(stream_dir) if items is None else items:
        out.write(json.dumps(item, separators=(",", ":")))
        out.write("\n")
        count += 1
    return count
