"""The sync mode: what a commit (and so a PublishConfirm) waits for.

``fsync`` commits after an fdatasync of the active segment; ``os`` commits once the
write reached the OS and leaves the disk to rolls, close and the OS. fdatasync calls
are counted through a wrapper around the real call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.logs import log_records as records
from tierlog.errors import ConfigError
from tierlog.formats.protocol.constants import ResponseCode
from tierlog.formats.protocol.publish import decode_publish, encode_publish
from tierlog.log.config import LogConfig
from tierlog.log.writer import StreamLog
from tierlog.remote.catalog import StreamRecord
from tierlog.remote.settings import StreamSettings
from tierlog.server.arguments import settings_changes
from tierlog.server.broker import StreamHandle, _PublishOp
from tierlog.server.config import LogSection


@pytest.fixture
def fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real: Callable[[int], None] = os.fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


def make_log(tmp_path: Path, sync: str, **config: object) -> StreamLog:
    cfg = LogConfig(fsync="never", sync=sync, **config)  # type: ignore[arg-type]
    return StreamLog.create(str(tmp_path), "/", "s", cfg, created_ns=1)


def test_fsync_mode_commits_only_after_fdatasync(tmp_path: Path, fdatasyncs: list[int]) -> None:
    log = make_log(tmp_path, "fsync")
    before = len(fdatasyncs)
    log.append([b"a", b"b"])
    assert log.committed_offset == -1  # written, not committed before the sync
    log.sync()
    assert len(fdatasyncs) == before + 1
    assert log.committed_offset == 1
    assert log.durable_point() == log.commit_point()
    log.close()


def test_os_mode_commits_without_fdatasync(tmp_path: Path, fdatasyncs: list[int]) -> None:
    log = make_log(tmp_path, "os")
    before = len(fdatasyncs)
    for i in range(20):
        log.append([b"m%d" % i])
        log.sync()
    assert len(fdatasyncs) == before  # twenty commits, no fdatasync
    assert log.committed_offset == 19
    assert log.durable_point().next_offset < log.commit_point().next_offset
    assert records(log) == [b"m%d" % i for i in range(20)]  # readers see committed data
    log.sync_to_disk()
    assert len(fdatasyncs) == before + 1
    assert log.durable_point() == log.commit_point()
    log.append([b"last"])
    log.sync()
    log.close()  # close makes everything durable in either mode
    assert len(fdatasyncs) == before + 2
    reopened = StreamLog.open(log.stream_dir)
    assert records(reopened)[-1] == b"last"
    reopened.close()


def test_os_mode_roll_fdatasyncs_the_sealed_segment(tmp_path: Path, fdatasyncs: list[int]) -> None:
    log = make_log(tmp_path, "os", max_segment_chunks=2)
    before = len(fdatasyncs)
    log.append([b"a"])
    log.sync()
    log.append([b"b"])
    log.sync()
    assert len(fdatasyncs) == before
    log.append([b"c"])  # rolls: the sealed segment holds committed, not durable chunks
    assert len(fdatasyncs) == before + 1
    log.close()


def test_sync_mode_switches_at_runtime(tmp_path: Path, fdatasyncs: list[int]) -> None:
    log = make_log(tmp_path, "fsync")
    before = len(fdatasyncs)
    log.set_sync_mode("os")
    log.append([b"a"])
    log.sync()
    assert len(fdatasyncs) == before
    log.set_sync_mode("fsync")
    log.append([b"b"])
    log.sync()
    assert len(fdatasyncs) == before + 1
    assert log.durable_point() == log.commit_point()
    with pytest.raises(ValueError):
        log.set_sync_mode("sometimes")
    log.close()


def publish_op(messages: list[tuple[int, bytes]], done: Callable[[int], None]) -> _PublishOp:
    batch = decode_publish(memoryview(encode_publish(1, messages))[4:])
    return _PublishOp(batch, None, done, len(batch.entry_data()))


@pytest.mark.parametrize(("mode", "syncs_per_group"), [("fsync", 1), ("os", 0)])
def test_broker_group_commit_per_mode(
    tmp_path: Path, fdatasyncs: list[int], mode: str, syncs_per_group: int
) -> None:
    log = make_log(tmp_path, mode)
    record = StreamRecord("/", "s", "inc", 1, StreamSettings(sync=mode), 1)
    h = StreamHandle(record, log, None, ThreadPoolExecutor(1))  # type: ignore[arg-type]
    before = len(fdatasyncs)
    for g in range(5):
        ops = [publish_op([(g * 10 + k, b"x")], lambda code: None) for k in range(3)]
        result = h._write_group(ops)
        assert result.codes == [ResponseCode.OK] * 3
    assert len(fdatasyncs) - before == 5 * syncs_per_group
    assert log.committed_offset == 14  # confirmed means committed (readable) in both modes
    log.close()
    h.executor.shutdown()


def test_sync_mode_settings_are_validated() -> None:
    with pytest.raises(ConfigError):
        LogConfig(sync="never")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        StreamSettings(sync="fdatasync")
    with pytest.raises(ConfigError):
        LogSection(sync="disk").log_config(500_000_000, 256_000, 1 << 20)
    assert settings_changes({"x-tierlog-sync": "os"}) == {"sync": "os"}
    assert LogSection(sync="os").log_config(500_000_000, 256_000, 1 << 20).sync == "os"
    stream_wins = LogSection(sync="os").log_config(500_000_000, 256_000, 1 << 20, "fsync")
    assert stream_wins.sync == "fsync"
    assert StreamSettings.from_dict({}).sync is None  # older catalog entries: the server's
