"""Every failure of an upload or commit task reaches the tiering state machine (retried with
backoff) or halts the stream visibly; none is swallowed by the thread pool. The stream shows
as degraded while tasks keep failing, a watchdog reports tasks in flight too long, and the
filesystem store turns OS errors into typed storage errors."""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tierlog.storage.fs_object_store as fs_module
from tests.log_events import events
from tests.plugins.tiering_world import World
from tierlog.remote.keys import metadata_prefix
from tierlog.storage.errors import PermanentError, StorageError, TransientError
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.meta_store import MetaStore
from tierlog.tiering.task_health import TaskHealth


@pytest.fixture
def fs_world(tmp_path: Path, meta: MetaStore) -> Iterator[World]:
    w = World(tmp_path, FsObjectStore(tmp_path / "objects"), meta)
    yield w
    w.close()


def _raw_os_error(code: int) -> object:
    """An error factory for FaultyObjectStore that raises a raw ``OSError``, as the
    filesystem store used to when the disk filled up while staging an object."""

    def make(message: str) -> StorageError:
        return OSError(code, f"{message}: {errno.errorcode[code]}")  # type: ignore[return-value]

    return make


def test_raw_os_error_in_a_manifest_commit_is_retried_not_swallowed(fs_world: World) -> None:
    tierer = fs_world.tierer()
    tierer.start()
    fs_world.append(10)
    assert tierer.flush(timeout=10)
    manifests = metadata_prefix("", fs_world.record.incarnation)
    fs_world.store.fail_nth(
        "put_if_absent",
        1,
        times=2,
        key_prefix=manifests,
        error=_raw_os_error(errno.ENOSPC),  # type: ignore[arg-type]
    )
    fs_world.append(10)
    assert tierer.flush(timeout=10), "tiering stalled after a raw OSError in a commit"
    assert tierer.durable_next == fs_world.log.commit_point().next_offset
    assert fs_world.store.count("put_if_absent", "injected-before") == 2
    status = tierer.status()
    assert status["commit_failures"] == 2
    assert status["degraded"] is False  # cleared by the commit that succeeded
    assert tierer.halted is None


def test_unexpected_exception_in_an_upload_is_retried(fs_world: World) -> None:
    tierer = fs_world.tierer()
    tierer.start()

    def boom(message: str) -> StorageError:
        return RuntimeError(message)  # type: ignore[return-value]

    fs_world.store.fail_nth("put_if_absent", 1, times=3, error=boom)
    fs_world.append(20)
    assert tierer.flush(timeout=10)
    assert tierer.status()["upload_failures"] + tierer.status()["commit_failures"] == 3


def test_degraded_while_commits_keep_failing_then_clears(
    fs_world: World, caplog: pytest.LogCaptureFixture
) -> None:
    tierer = fs_world.tierer()
    tierer.start()
    fs_world.append(5)
    assert tierer.flush(timeout=10)
    manifests = metadata_prefix("", fs_world.record.incarnation)
    rule = fs_world.store.fail_randomly("put_if_absent", 1.0, key_prefix=manifests)
    caplog.set_level(logging.WARNING, logger="tierlog.tiering.health")
    fs_world.append(5)
    assert not tierer.flush(timeout=1.0)
    deadline = time.monotonic() + 10
    while not tierer.status()["degraded"] and time.monotonic() < deadline:
        time.sleep(0.05)  # a loaded machine may not have tried the commit yet
    status = tierer.status()
    assert status["degraded"] is True
    assert status["degraded_since"] is not None
    assert "injected fault" in str(status["last_error"])
    assert status["lag_seconds"] > 0
    assert events(caplog.records, "tiering_degraded")
    rule.probability = 0.0
    assert tierer.flush(timeout=10)
    status = tierer.status()
    assert status["degraded"] is False and status["last_error"] is None
    deadline = time.monotonic() + 10
    while tierer.lag_seconds != 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)  # chunks written after the flush target tier on the next turns
    assert tierer.lag_seconds == 0.0


def test_watchdog_reports_a_task_in_flight_too_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    health = TaskHealth("s", stall_seconds=5.0, clock=lambda: now[0])
    token = health.started("commit 7")
    now[0] = 4.0
    assert health.check_stalls() == []
    now[0] = 6.0
    with caplog.at_level(logging.ERROR, logger="tierlog.tiering.health"):
        assert health.check_stalls() == ["commit 7"]
        assert health.check_stalls() == []  # once per task
    (stalled,) = events(caplog.records, "tiering_task_stalled")
    assert stalled["task"] == "commit 7" and stalled["level"] == "error"
    assert health.status()["stalled_tasks"] == 1
    health.finished(token)
    assert health.status()["tasks_in_flight"] == 0


def test_watchdog_runs_in_the_tierer(fs_world: World) -> None:
    """A commit hung in the store is reported by the tierer's own loop."""
    release = threading.Event()
    store = fs_world.store
    inner_put = store.inner.put_if_absent
    manifests = metadata_prefix("", fs_world.record.incarnation)

    def hang(key: str, data: object, *, metadata: dict[str, str] | None = None) -> object:
        if key.startswith(manifests) and not release.is_set():
            release.wait(10)
        return inner_put(key, data, metadata=metadata)  # type: ignore[arg-type]

    tierer = fs_world.tierer()
    tierer.task_health.stall_seconds = 0.3
    tierer.start()
    store.inner.put_if_absent = hang  # type: ignore[method-assign]
    try:
        fs_world.append(10)
        assert not tierer.flush(timeout=1.5)
        assert tierer.status()["stalled_tasks"] >= 1
    finally:
        release.set()
    assert tierer.flush(timeout=10)


@pytest.mark.parametrize(
    ("code", "typed"),
    [(errno.ENOSPC, TransientError), (errno.EIO, TransientError), (errno.EACCES, PermanentError)],
)
def test_fs_store_maps_os_errors_while_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, typed: type[StorageError]
) -> None:
    store = FsObjectStore(tmp_path / "objects")

    def fail(fd: int, data: object) -> None:
        raise OSError(code, "injected")

    monkeypatch.setattr(fs_module, "_write_all", fail)
    for put in (store.put, store.put_if_absent):
        with pytest.raises(typed) as info:
            put("a/b", b"x")
        assert "a/b" in str(info.value)
    assert list((tmp_path / "objects" / "staging").iterdir()) == []  # no temp file left
    monkeypatch.undo()
    store.put_if_absent("a/b", b"x")
    assert store.get("a/b") == b"x"


def test_degraded_until_every_failing_kind_of_task_succeeds() -> None:
    health = TaskHealth("s")
    health.failed("commit", "HTTP 503")
    health.failed("upload", "reset")
    health.succeeded("upload")  # uploads recover while commits still fail
    assert health.degraded and health.status()["last_error"] == "reset"
    health.succeeded("commit")
    assert not health.degraded and health.status()["last_error"] is None


def test_untyped_error_after_the_pointer_put_applied_is_resolved_not_deposed(
    tmp_path: Path, fs_world: World
) -> None:
    """A raw exception from the MetaStore after the conditional put took effect: the pointer
    is re-read and the commit counts; a blind retry would see "the manifest moved" and halt."""
    from tierlog.storage.meta_store import Versioned
    from tierlog.storage.sqlite_meta_store import SqliteMetaStore

    class BreakingMeta(SqliteMetaStore):
        armed = False

        def put_if(self, key: str, value: bytes, expected_version: int, epoch: int) -> Versioned:
            result = super().put_if(key, value, expected_version, epoch)
            if self.armed and key.startswith("pointer/"):
                BreakingMeta.armed = False
                raise RuntimeError("driver bug after the write")
            return result

    meta = BreakingMeta(str(tmp_path / "meta.db"))
    tierer = fs_world.tierer(meta=meta)
    tierer.start()
    fs_world.append(5)
    assert tierer.flush(timeout=10)
    BreakingMeta.armed = True
    fs_world.append(5)
    assert tierer.flush(timeout=10)
    assert not BreakingMeta.armed and tierer.halted is None
    assert tierer.durable_next == fs_world.log.commit_point().next_offset
    meta.close()
