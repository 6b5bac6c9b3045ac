"""The [store] retry settings, the retry observer's rate limit, and start-up retries."""

from __future__ import annotations

import logging
import random

import pytest

from tests.log_events import events
from tierlog.errors import ConfigError
from tierlog.server.config import load_config
from tierlog.storage.errors import PermanentError, StoreStartupTimeoutError, TransientError
from tierlog.storage.retry import RetryLog, RetryPolicy, error_kind
from tierlog.storage.startup import _until


def test_store_settings_from_file_and_environment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.toml"
    path.write_text("[store]\nmax_attempts = 3\nbase_delay_seconds = 0.5\n")
    config = load_config(str(path), {"TIERLOG_STORE_STARTUP_DEADLINE_SECONDS": "7"})
    policy = config.store.retry_policy()
    assert (policy.max_attempts, policy.base_delay_s, policy.max_delay_s) == (3, 0.5, 5.0)
    assert config.store.startup_deadline_seconds == 7.0


@pytest.mark.parametrize(
    "env",
    [
        {"TIERLOG_STORE_MAX_ATTEMPTS": "0"},
        {"TIERLOG_STORE_BASE_DELAY_SECONDS": "0"},
        {"TIERLOG_STORE_MAX_DELAY_SECONDS": "0.01"},
        {"TIERLOG_STORE_STARTUP_DEADLINE_SECONDS": "-1"},
        {"TIERLOG_STORE_NOPE": "1"},
    ],
)
def test_bad_store_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"(?i)store"):
        load_config(None, env)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, str]] = []

    def on_retry(self, op: str, key: str, attempt: int, kind: str, error: BaseException) -> None:
        self.calls.append((op, key, attempt, kind))


def test_policy_reports_each_retry_with_kind_and_gives_up() -> None:
    recorder = Recorder()
    sleeps: list[float] = []
    policy = RetryPolicy(
        max_attempts=3, observer=recorder, rng=random.Random(1), sleep=sleeps.append
    )

    def fail() -> None:
        raise TransientError("boom", kind="throttled")

    with pytest.raises(TransientError):
        policy.call(fail, op="get", key="k")
    assert recorder.calls == [("get", "k", 1, "throttled"), ("get", "k", 2, "throttled")]
    assert len(sleeps) == 2 and all(0 <= s <= 0.1 for s in sleeps)
    with pytest.raises(PermanentError):  # not retried, not reported
        policy.call(lambda: (_ for _ in ()).throw(PermanentError("no")), op="get")
    assert len(recorder.calls) == 2


def test_retry_warnings_are_rate_limited_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    retry_log = RetryLog(interval_s=3600.0, burst=3)
    caplog.set_level(logging.WARNING, logger="tierlog.storage.retry")
    for attempt in range(1, 101):
        retry_log.on_retry("put", "a/b", attempt, "server_error", TransientError("500"))
    retry_log.on_retry("get", "a/b", 1, "connection", TransientError("reset"))
    assert retry_log.snapshot() == {("put", "server_error"): 100, ("get", "connection"): 1}
    warnings = events(caplog.records, "object_store_retry")
    assert len(warnings) == 4  # a burst of 3 for put, 1 for get: a storm does not flood
    assert [(w["op"], w["kind"]) for w in warnings][-1] == ("get", "connection")


def test_error_kind_falls_back_to_the_message() -> None:
    assert error_kind(TransientError("x", kind="io")) == "io"
    assert error_kind(TransientError("operation timed out")) == "timeout"
    assert error_kind(TransientError("connection reset by peer")) == "connection"


def test_startup_retries_until_the_deadline_then_one_error() -> None:
    tries = {"n": 0}

    def flaky() -> None:
        tries["n"] += 1
        if tries["n"] < 4:
            raise TransientError("down")

    fast = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01, observer=None)
    _until(5.0, fast, "startup_probe", flaky)
    assert tries["n"] == 4

    def down() -> None:
        raise TransientError("still down")

    with pytest.raises(
        StoreStartupTimeoutError, match=r"still unusable after 0.2 s of retries: still down"
    ):
        _until(0.2, fast, "startup_probe", down)
    with pytest.raises(PermanentError, match="bad credentials"):  # at once, unchanged
        _until(
            5.0,
            fast,
            "startup_probe",
            lambda: (_ for _ in ()).throw(PermanentError("bad credentials")),
        )


def test_meta_store_start_up_waits_for_an_answer_then_gives_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    from tierlog.storage.startup import open_meta_store_for_startup

    fast = RetryPolicy(base_delay_s=0.01, max_delay_s=0.05, observer=None)
    meta = open_meta_store_for_startup(f"sqlite://{tmp_path}/meta.db", fast, 5.0)
    assert meta.get("anything") is None
    meta.close()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"etcd://user:pw@127.0.0.1:{port}/tl"
    with pytest.raises(StoreStartupTimeoutError) as info:
        open_meta_store_for_startup(uri, fast, 1.0)
    assert "still unusable after 1 s of retries" in str(info.value)
