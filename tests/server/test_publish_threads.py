"""Where a publish group is written: on the event loop in ``os`` sync mode (no thread hop
when the stream's writer lane is idle and the group cannot roll the segment), on the
writer lane in ``fsync`` mode and for a group that rolls; every frame is confirmed and
readable either way, and a lane task running meanwhile is never run beside it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.logs import log_records as records
from tierlog.concurrency import SerialPool
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import decode_publish, encode_publish
from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog
from tierlog.metrics import Metrics
from tierlog.remote.catalog import StreamRecord
from tierlog.remote.settings import StreamSettings
from tierlog.server.broker import StreamHandle
from tierlog.server.config import ServerConfig


def batch(first: int, n: int):  # type: ignore[no-untyped-def]
    frame = encode_publish(1, [(first + i, b"m%d" % (first + i)) for i in range(n)])
    return decode_publish(memoryview(frame)[4:])


async def publish_groups(
    tmp_path: Path, mode: str, segment_bytes: int = 500_000_000
) -> tuple[list[str], list[int], StreamLog]:
    config = LogConfig(sync=mode, max_segment_bytes=segment_bytes)
    log = StreamLog.create(str(tmp_path), "/", "s", config, created_ns=1)
    record = StreamRecord("/", "s", "inc", 1, StreamSettings(sync=mode), 1)
    pool = SerialPool(1, "writer")
    broker = SimpleNamespace(config=ServerConfig(), metrics=Metrics())
    handle = StreamHandle(record, log, broker, pool.lane("s"))  # type: ignore[arg-type]
    threads: list[str] = []
    real = handle._write_group

    def spy(ops):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real(ops)

    handle._write_group = spy  # type: ignore[method-assign]
    codes: list[int] = []
    next_id = 1
    for _ in range(5):
        for _ in range(3):  # three frames in one loop turn: one group
            handle.submit_publish(batch(next_id, 4), "p", codes.append)
            next_id += 4
        await handle.flush()
    pool.shutdown()
    return threads, codes, log


@pytest.mark.parametrize(("mode", "where"), [("os", "MainThread"), ("fsync", "writer-0")])
def test_group_thread_per_sync_mode(tmp_path: Path, mode: str, where: str) -> None:
    threads, codes, log = asyncio.run(publish_groups(tmp_path, mode))
    assert threads == [where] * 5  # one group per loop turn, on the expected thread
    assert codes == [ResponseCode.OK] * 15
    assert records(log) == [b"m%d" % i for i in range(1, 61)]
    assert log.committed_offset == 59
    log.close()


def test_os_mode_group_that_may_roll_goes_to_the_writer(tmp_path: Path) -> None:
    threads, codes, log = asyncio.run(publish_groups(tmp_path, "os", segment_bytes=300))
    assert "writer-0" in threads  # near the segment's end: the roll's fsync stays off the loop
    assert codes == [ResponseCode.OK] * 15
    assert records(log) == [b"m%d" % i for i in range(1, 61)]
    assert len(log.list_segments()) > 1
    log.close()


def test_os_mode_waits_for_a_busy_lane(tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[int], StreamLog]:
        config = LogConfig(sync="os")
        log = StreamLog.create(str(tmp_path), "/", "s", config, created_ns=1)
        record = StreamRecord("/", "s", "inc", 1, StreamSettings(sync="os"), 1)
        pool = SerialPool(1, "writer")
        lane = pool.lane("s")
        broker = SimpleNamespace(config=ServerConfig(), metrics=Metrics())
        handle = StreamHandle(record, log, broker, lane)  # type: ignore[arg-type]
        release = threading.Event()
        busy = lane.submit(release.wait, 5)  # e.g. retention deleting a segment
        await asyncio.sleep(0.05)
        codes: list[int] = []
        handle.submit_publish(batch(1, 2), "p", codes.append)
        await asyncio.sleep(0.05)
        assert codes == []  # not written beside the running lane task
        release.set()
        await handle.flush()
        busy.result(timeout=5)
        pool.shutdown()
        return [], codes, log

    _threads, codes, log = asyncio.run(main())
    assert codes == [ResponseCode.OK]
    assert records(log) == [b"m1", b"m2"]
    log.close()
