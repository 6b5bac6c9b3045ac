"""Helpers for acceptor tests: leader logs with rolls and tracking, verbatim copying
through ``chunk_span`` and byte comparison of stream directories."""

from __future__ import annotations

import os

from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog

SMALL = LogConfig(max_segment_chunks=6, max_segment_bytes=4000)


def write_leader_chunks(log: StreamLog, count: int, start: int = 0) -> None:
    """``count`` chunks: user chunks of one producer, some plain, some offset stores."""
    for i in range(start, start + count):
        if i % 5 == 3:
            log.store_offset("consumer-a", i)
        elif i % 2:
            log.append([f"plain-{i}".encode()] * (1 + i % 3))
        else:
            log.append(
                [f"p-{i}".encode(), b"x" * (i % 50)],
                producer="prod",
                publishing_ids=[2 * i, 2 * i + 1],
            )


def span_bytes(log: StreamLog, from_offset: int, max_bytes: int) -> tuple[bytes, int] | None:
    span = log.chunk_span(from_offset, max_bytes)
    if span is None:
        return None
    with open(span.segment_path, "rb") as f:
        f.seek(span.position)
        data = f.read(span.length)
    assert len(data) == span.length
    return data, span.next_offset


def replicate(leader: StreamLog, follower: StreamLog, max_bytes: int = 700) -> int:
    """Copy everything the leader wrote that the follower lacks; returns spans sent."""
    spans = 0
    while True:
        got = span_bytes(leader, follower.next_offset, max_bytes)
        if got is None:
            return spans
        data, next_offset = got
        assert follower.accept_chunks(data) == next_offset
        follower.sync_to_disk()
        spans += 1


def stream_files(
    stream_dir: str, suffixes: tuple[str, ...] = (".segment", ".index")
) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(stream_dir)):
        if name.endswith(suffixes):
            with open(os.path.join(stream_dir, name), "rb") as f:
                out[name] = f.read()
    return out
