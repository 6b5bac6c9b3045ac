"""A delayed stream's files damaged while messages are scheduled (issue 30: delayed streams
join the corruption campaign). One ``tierlog serve`` on SeaweedFS + etcd, an ordinary
tiered delayed stream, scheduled messages published with the real ``rstream`` client:
some due at once (delivered before the stop, so the stream itself has chunks), the others
due 10-13 s later (still scheduled). Once both the stream and its system stream are tiered
the server is stopped, one bit of one file flipped, and the server started again:

* ``system-index``: the last index record of the system stream's active segment (a derived
  file: the index is rebuilt from the chunks);
* ``system-first-chunk``: the data of the system stream's first chunk, the SCHEDULE records
  of the pending messages (tiered: the remote copy serves them);
* ``system-last-chunk``: the data of the system stream's last chunk (tiered; read as a torn
  tail, the local log restarts at the remote tail);
* ``stream-middle-chunk``: the data of a chunk in the middle of the delayed stream's own
  active segment (tiered: the remote copy serves it).

Oracle: every confirmed scheduled message is appended exactly once and never before its
due time, and a consumer reading from the first offset gets each one once.
"""

from __future__ import annotations

import asyncio
import collections
import glob
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.delayed.disk_loss import (
    KINDS,
    _create,
    s3_env,
    server_config,
    wait_pending,
    wait_tiered,
)
from tests.delayed.test_process import QUIET, body_of, consume_all, publish, wait_scheduler
from tests.plugins.seaweed import SeaweedServer
from tests.plugins.tierlog_server import TierlogServerProcess
from tierlog.formats.chunk import HEADER_SIZE, ChunkType
from tierlog.formats.segment import FILE_HEADER_SIZE
from tierlog.log.segment_files import scan_segment
from tierlog.server.delayed_intake import system_stream_name

pytestmark = [pytest.mark.s3, pytest.mark.etcd]

STREAM = "timers"
INDEX_RECORD = 29
EARLY = 30  # due within 1.5 s: delivered before the stop
LATE = 40  # due 10-13 s after publishing: scheduled while the file is damaged


@pytest.fixture
def node(
    tmp_path: Path, seaweed: SeaweedServer, etcd_server: str
) -> Iterator[TierlogServerProcess]:
    prefix = f"delayed-corrupt-{uuid.uuid4().hex}"
    server = TierlogServerProcess(
        tmp_path / "node-data",
        config_text=server_config(seaweed, etcd_server, prefix, checkpoint_records=40),
        env=s3_env(seaweed),
    )
    try:
        yield server.start()
    finally:
        try:
            server.stop()
        finally:
            server.kill()


def stream_dir(server: TierlogServerProcess, name: str) -> str:
    """The local directory of ``name`` (vhost ``/``): ``<data>/streams/__<name>_<ns>``."""
    [found] = glob.glob(os.path.join(server.data_dir, "streams", f"__{glob.escape(name)}_*"))
    return found


def flip(path: str, at: int, bit: int) -> bytes:
    """Flip one bit; returns the file's bytes before."""
    with open(path, "r+b") as f:
        before = f.read()
        f.seek(at)
        f.write(bytes([before[at] ^ (1 << bit)]))
    return before


def last_index_record(directory: str) -> tuple[str, int]:
    [index] = sorted(glob.glob(os.path.join(directory, "*.index")))[-1:]
    size = os.path.getsize(index)
    assert size >= FILE_HEADER_SIZE + INDEX_RECORD, f"{index} has no record"
    return index, size - INDEX_RECORD


def user_chunk(directory: str, which: str) -> tuple[str, int, int]:
    """(segment, position, size) of the ``first``, ``middle`` or ``last`` user chunk of the
    active segment."""
    [segment] = sorted(glob.glob(os.path.join(directory, "*.segment")))[-1:]
    first = int(os.path.basename(segment)[:20])
    chunks = [c for c in scan_segment(segment, first).chunks if c.chunk_type == ChunkType.USER]
    assert len(chunks) >= 3, f"{segment} holds {len(chunks)} user chunks"
    chunk = {"first": chunks[0], "middle": chunks[len(chunks) // 2], "last": chunks[-1]}[which]
    return segment, chunk.position, chunk.size


# case -> (stream damaged, what, the server's log event that shows the damage handled)
CASES = {
    "system-index": ("system", "last index record", "index_record_disagrees"),
    # the SCHEDULE records of the pending messages
    "system-first-chunk": ("system", "first", "segment_repaired_from_remote"),
    # the log's last chunk: a torn tail, the local log restarts at the remote tail
    "system-last-chunk": ("system", "last", "local_log_restarted_past_remote"),
    "stream-middle-chunk": ("stream", "middle", "segment_repaired_from_remote"),
}


def damage(server: TierlogServerProcess, case: str) -> tuple[str, bytes]:
    which, what, _event = CASES[case]
    name = system_stream_name(STREAM) if which == "system" else STREAM
    if what == "last index record":
        path, at = last_index_record(stream_dir(server, name))
        return path, flip(path, at + 7, 2)  # the chunk id's low byte
    path, position, size = user_chunk(stream_dir(server, name), what)
    assert size > HEADER_SIZE + 2
    return path, flip(path, position + HEADER_SIZE + (size - HEADER_SIZE) // 2, 4)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_damaged_file_of_a_delayed_stream_loses_nothing(
    node: TierlogServerProcess, case: str
) -> None:
    rng = random.Random(11)
    _create(node, STREAM, KINDS["tiered"])
    now = int(time.time() * 1000)
    due = {p: now + rng.randint(100, 1500) for p in range(1, EARLY + 1)}
    due |= {p: now + rng.randint(10_000, 13_000) for p in range(EARLY + 1, EARLY + LATE + 1)}
    messages = {p: (f"msg-{p:05d}".encode(), d) for p, d in due.items()}
    confirmed = await publish(node, STREAM, messages)
    assert confirmed == set(messages), f"{len(messages) - len(confirmed)} not confirmed"
    await wait_pending(node, STREAM, LATE, timeout=15)
    await wait_tiered(node, [STREAM, system_stream_name(STREAM)], timeout=30)
    assert node.stop() == 0
    stopped = int(time.time() * 1000)
    assert stopped < min(due[p] for p in range(EARLY + 1, EARLY + LATE + 1)) - 1000

    path, before = damage(node, case)
    assert Path(path).read_bytes() != before  # the bit really flipped

    node.start()
    wait_scheduler(node, STREAM)
    due_of = {body: d for body, d in messages.values()}
    await asyncio.sleep(max(0.0, (max(due_of.values()) - time.time() * 1000 + 2000) / 1000))
    got = await consume_all(node, STREAM, len(due_of), timeout=6, quiet=QUIET)
    counts = collections.Counter(body_of(raw) for _ts, raw in got)
    missing = sorted(set(due_of) - set(counts))
    duplicated = sorted(b for b, c in counts.items() if c > 1)
    early = sorted(body_of(raw) for ts, raw in got if ts < due_of.get(body_of(raw), 0))
    tail = node.log_tail()
    assert not missing, f"{len(missing)} of {len(due_of)} lost: {missing[:5]}\n{tail}"
    assert not duplicated, f"{len(duplicated)} delivered twice: {duplicated[:5]}\n{tail}"
    assert not early, f"{len(early)} delivered early: {early[:5]}"
    assert len(got) == len(due_of) == EARLY + LATE
    log = node.log_tail(1_000_000)
    assert f"event={CASES[case][2]} " in log, f"the damage was not seen:\n{tail}"
    for bad in ("Traceback", "level=error"):  # e.g. delayed_tick_failed: a scheduler stall
        assert bad not in log, "\n".join(line for line in log.splitlines() if bad in line)
