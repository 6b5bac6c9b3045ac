"""The fault-injecting wrapper and the retry policy, over real backends."""

from __future__ import annotations

import contextlib
import random
import time

import pytest

from tests.faults.object_store import FaultyObjectStore, InjectedFault, OpRecord
from tierlog.storage.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermanentError,
    TransientError,
)
from tierlog.storage.object_store import ObjectStore
from tierlog.storage.retry import RetryPolicy


def test_nth_put_if_absent_fails_after_taking_effect(object_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(object_store, seed=1)
    faulty.fail_nth("put_if_absent", 3, after=True)
    faulty.put_if_absent("k1", b"1")
    faulty.put_if_absent("k2", b"2")
    with pytest.raises(TransientError):
        faulty.put_if_absent("k3", b"3")
    assert object_store.get("k3") == b"3"  # it landed although the caller saw an error
    with pytest.raises(AlreadyExistsError):  # the naive retry a caller must not trust
        faulty.put_if_absent("k3", b"3")
    faulty.put_if_absent("k4", b"4")  # only the 3rd failed
    assert [r.outcome for r in faulty.log] == [
        "ok",
        "ok",
        "injected-after:InjectedFault",
        "error:AlreadyExistsError",
        "ok",
    ]


def test_fault_before_has_no_effect(object_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(object_store)
    faulty.fail_nth("put", 1, times=2)
    for _ in range(2):
        with pytest.raises(InjectedFault):
            faulty.put("k", b"x")
    with pytest.raises(NotFoundError):
        object_store.head("k")
    faulty.put("k", b"x")
    assert faulty.count("put") == 3
    assert faulty.count("put", "injected-before") == 2


def test_custom_error_type_and_key_prefix(object_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(object_store)
    faulty.fail_nth("get", 1, key_prefix="secret/", error=PermanentError)
    object_store.put("open/a", b"a")
    object_store.put("secret/b", b"b")
    assert faulty.get("open/a") == b"a"
    with pytest.raises(PermanentError):
        faulty.get("secret/b")
    assert faulty.get("secret/b") == b"b"


def test_probability_faults_replay_under_a_seed(fs_store: ObjectStore) -> None:
    def run(seed: int) -> list[OpRecord]:
        faulty = FaultyObjectStore(fs_store, seed=seed)
        faulty.fail_randomly("head", 0.5)
        fs_store.put("h", b"x")
        for _ in range(40):
            with contextlib.suppress(InjectedFault):
                faulty.head("h")
        return faulty.log

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    failed = sum(r.outcome != "ok" for r in first)
    assert 5 < failed < 35


def test_counts_requests_by_kind(object_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(object_store)
    faulty.put("a/1", b"1")
    faulty.put("a/2", b"2")
    faulty.get("a/1")
    assert faulty.get_view("a/1", 0, 1) == b"1"
    faulty.get_suffix("a/2", 1)
    assert [m.key for m in faulty.list("a/")] == ["a/1", "a/2"]
    faulty.delete_many(["a/1", "a/2"])
    with pytest.raises(NotFoundError):
        faulty.get("a/1")
    assert faulty.count("put") == 2
    assert faulty.count("get") == 3
    assert faulty.count("get", "error:NotFoundError") == 1
    assert faulty.count("get_suffix") == faulty.count("list") == faulty.count("delete_many") == 1
    faulty.reset_log()
    assert faulty.count() == 0


def test_list_faults_before_and_after(fs_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(fs_store)
    fs_store.put("l/1", b"")
    fs_store.put("l/2", b"")
    faulty.fail_nth("list", 1)
    faulty.fail_nth("list", 2, after=True)
    with pytest.raises(InjectedFault):
        list(faulty.list("l/"))
    seen = []
    with pytest.raises(InjectedFault):
        for meta in faulty.list("l/"):
            seen.append(meta.key)
    assert seen == ["l/1", "l/2"]
    assert [m.key for m in faulty.list("l/")] == ["l/1", "l/2"]


def test_multipart_faults(fs_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(fs_store)
    faulty.fail_nth("put_part", 1)
    faulty.fail_nth("complete_multipart", 1, after=True)
    upload = faulty.create_multipart("mp")
    with pytest.raises(InjectedFault):
        upload.put_part(1, b"part")
    upload.put_part(1, b"part")
    with pytest.raises(InjectedFault):
        upload.complete()
    assert fs_store.get("mp") == b"part"  # completed although reported as failed
    assert faulty.count("put_part") == 2


def test_latency_and_throughput_slow_calls_down(fs_store: ObjectStore) -> None:
    faulty = FaultyObjectStore(fs_store)
    faulty.set_throughput(1_000_000)  # 100 KB => 0.1 s
    started = time.monotonic()
    faulty.put("slow", b"x" * 100_000)
    faulty.get("slow")
    slowed = time.monotonic() - started
    faulty.clear_faults()
    faulty.set_latency(0.05)
    started = time.monotonic()
    faulty.head("slow")
    assert time.monotonic() - started >= 0.05
    assert slowed >= 0.2


def test_probability_must_be_valid(fs_store: ObjectStore) -> None:
    with pytest.raises(ValueError):
        FaultyObjectStore(fs_store).fail_randomly("get", 1.5)


# -- retry policy ------------------------------------------------------------------------------


def _policy(**kw: object) -> tuple[RetryPolicy, list[float]]:
    sleeps: list[float] = []
    policy = RetryPolicy(rng=random.Random(3), sleep=sleeps.append, **kw)  # type: ignore[arg-type]
    return policy, sleeps


def test_retry_recovers_from_transient_errors() -> None:
    policy, sleeps = _policy(max_attempts=5, base_delay_s=0.1, max_delay_s=0.3)
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise TransientError("503")
        return "done"

    assert policy.call(flaky) == "done"
    assert len(sleeps) == 3
    assert all(0 <= s <= cap for s, cap in zip(sleeps, [0.1, 0.2, 0.3], strict=True))


def test_retry_gives_up_and_reraises() -> None:
    policy, sleeps = _policy(max_attempts=3)
    with pytest.raises(TransientError, match="always"):
        policy.call(lambda: (_ for _ in ()).throw(TransientError("always")))
    assert len(sleeps) == 2


def test_retry_never_retries_permanent_errors() -> None:
    policy, sleeps = _policy()
    with pytest.raises(PermanentError):
        policy.call(lambda: (_ for _ in ()).throw(PermanentError("403")))
    assert sleeps == []


def test_retry_respects_the_deadline() -> None:
    policy, sleeps = _policy(max_attempts=100, base_delay_s=10.0, max_delay_s=10.0, deadline_s=0.0)
    with pytest.raises(TransientError):
        policy.call(lambda: (_ for _ in ()).throw(TransientError("slow")))
    assert sleeps == [] or all(s == 0 for s in sleeps)


def test_jitter_is_seeded_and_capped() -> None:
    a = RetryPolicy(rng=random.Random(1), base_delay_s=1.0, max_delay_s=4.0)
    b = RetryPolicy(rng=random.Random(1), base_delay_s=1.0, max_delay_s=4.0)
    delays = [a.delay(n) for n in range(1, 10)]
    assert delays == [b.delay(n) for n in range(1, 10)]
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 1
