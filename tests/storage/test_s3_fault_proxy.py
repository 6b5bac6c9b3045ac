"""The S3 fault proxy itself, and the object store's retry policy through it: every fault kind
is retried (and reported with its kind), and a lost reply on a create-only put is resolved by
reading the object back."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from tests.log_events import events
from tests.plugins.s3_fault_proxy import KINDS, FaultProxy
from tests.plugins.seaweed import SeaweedServer
from tierlog.storage.errors import AlreadyExistsError, TransientError
from tierlog.storage.retry import RETRY_LOG, RetryPolicy
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore

pytestmark = pytest.mark.s3

FAST = RetryPolicy(max_attempts=6, base_delay_s=0.01, max_delay_s=0.05)


def proxied_store(seaweed: SeaweedServer, proxy: FaultProxy, **kw: object) -> S3ObjectStore:
    config = S3Config(
        bucket=seaweed.bucket,
        prefix=f"proxy/{uuid.uuid4().hex}",
        endpoint=proxy.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key,
        secret_access_key=seaweed.secret_key,
        request_timeout_s=5.0,
    )
    return S3ObjectStore(config, retry=kw.pop("retry", FAST), **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(seaweed: SeaweedServer, s3_fault_proxy: FaultProxy) -> Iterator[S3ObjectStore]:
    s = proxied_store(seaweed, s3_fault_proxy)
    yield s
    s.close()


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind_is_injected_and_ridden_out(
    store: S3ObjectStore, s3_fault_proxy: FaultProxy, kind: str
) -> None:
    proxy = s3_fault_proxy
    proxy.configure(delay_s=(0.05, 0.1))
    store.put("k", b"v" * 1000)
    before = RETRY_LOG.snapshot()
    proxy.inject_next(kind, lambda method, path: method == "GET")
    assert store.get("k") == b"v" * 1000
    assert proxy.injected[kind] == 1 and proxy.pending_one_shots() == 0
    retried = sum(RETRY_LOG.snapshot().values()) - sum(before.values())
    # delays and slow bodies are answered, only slower; the others cost one retry
    assert retried == (0 if kind in ("delay", "slow_body") else 1)


def test_503_answer_is_s3_slowdown_xml(store: S3ObjectStore, s3_fault_proxy: FaultProxy) -> None:
    import http.client

    s3_fault_proxy.inject_next("503")
    conn = http.client.HTTPConnection("127.0.0.1", s3_fault_proxy.port, timeout=5)
    conn.request("GET", "/anything")
    response = conn.getresponse()
    body = response.read().decode()
    assert response.status == 503
    assert "<Code>SlowDown</Code>" in body and "<Error>" in body


def test_rate_and_counts(store: S3ObjectStore, s3_fault_proxy: FaultProxy) -> None:
    s3_fault_proxy.configure(rate=0.3, kinds={"500": 1, "503": 1, "reset": 1}, delay_s=(0, 0.01))
    for i in range(30):
        store.put(f"r/{i}", b"x")
    s3_fault_proxy.off()
    assert s3_fault_proxy.total_injected() >= 3
    assert sorted(m.key for m in store.list("r/")) == sorted(f"r/{i}" for i in range(30))


def test_lost_reply_on_create_is_resolved_as_own_write(
    store: S3ObjectStore, s3_fault_proxy: FaultProxy
) -> None:
    s3_fault_proxy.inject_next("lost_reply", lambda method, path: method == "PUT")
    store.put_if_absent("once", b"payload")
    assert s3_fault_proxy.injected["lost_reply"] == 1
    assert store.resolved_creates == 1
    assert store.get("once") == b"payload"
    # someone else's bytes behind a lost reply stay a conflict
    store.put("theirs", b"theirs")
    s3_fault_proxy.inject_next("reset", lambda method, path: method == "PUT")
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent("theirs", b"mine")


def test_retried_fault_logs_a_structured_warning(
    store: S3ObjectStore, s3_fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    RETRY_LOG.configure(interval_s=60.0, burst=2)
    try:
        caplog.set_level(logging.WARNING, logger="tierlog.storage.retry")
        store.put("w", b"x")
        for _ in range(4):
            s3_fault_proxy.inject_next("503", lambda method, path: method == "HEAD")
        store.head("w")
        records = events(caplog.records, "object_store_retry")
        assert len(records) == 2  # rate-limited: 4 retries, a burst of 2 logged
        first = records[0]
        assert (first["op"], first["kind"], first["attempt"]) == ("head", "throttled", "1")
        assert "w" in first["key"]
        assert "HTTP 503" in first["error"]
        assert first["level"] == "warning"
    finally:
        RETRY_LOG.configure(interval_s=10.0, burst=5)


def test_outage_longer_than_the_policy_surfaces_transient(
    seaweed: SeaweedServer, s3_fault_proxy: FaultProxy
) -> None:
    store = proxied_store(
        seaweed, s3_fault_proxy, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01)
    )
    s3_fault_proxy.configure(rate=1.0, kinds={"reset": 1})
    with pytest.raises(TransientError) as info:
        store.get("missing")
    assert info.value.kind == "connection"
    store.close()


def _probe_keys(store: S3ObjectStore) -> list[str]:
    return [m.key for m in store.probe_objects()]


def test_probe_leaves_no_object_after_lost_replies(
    seaweed: SeaweedServer, s3_fault_proxy: FaultProxy
) -> None:
    store = proxied_store(seaweed, s3_fault_proxy, probe=False)
    s3_fault_proxy.inject_next("lost_reply", lambda method, path: method == "PUT")
    s3_fault_proxy.inject_next("lost_reply", lambda method, path: method == "POST")  # delete
    store.probe_create_only()
    assert s3_fault_proxy.injected["lost_reply"] == 2
    assert _probe_keys(store) == []
    store.close()


def test_probe_removes_stale_probe_objects(
    seaweed: SeaweedServer, s3_fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tierlog.storage.s3_object_store as s3_module
    import tierlog.storage.s3_probe as s3_probe

    store = proxied_store(seaweed, s3_fault_proxy, probe=False)
    store.put(f"{s3_module.PROBE_PREFIX}left-by-a-killed-start", b"probe")
    store.probe_create_only()  # young probe keys may be another start's: kept
    assert len(_probe_keys(store)) == 1
    monkeypatch.setattr(s3_probe, "STALE_PROBE_S", -1.0)
    store.probe_create_only()
    assert _probe_keys(store) == []
    store.close()
