"""S3 configuration, the store factory, and the S3 backend's behaviour on bad setups:
invalid endpoints and credentials, servers that ignore If-None-Match, throttling and 5xx."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.plugins.seaweed import SeaweedServer
from tierlog.errors import ConfigError
from tierlog.storage.errors import (
    AlreadyExistsError,
    PermanentError,
    TransientError,
    UnsupportedBackendError,
)
from tierlog.storage.fs_object_store import FsObjectStore
from tierlog.storage.object_store import open_object_store
from tierlog.storage.retry import RetryPolicy
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_object_store import S3ObjectStore

# -- S3Config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bucket": "Bad_Bucket"},
        {"bucket": "ab"},
        {"bucket": "a..b"},
        {"bucket": "ok-bucket", "prefix": "/abs"},
        {"bucket": "ok-bucket", "prefix": "trailing/"},
        {"bucket": "ok-bucket", "prefix": "a/../b"},
        {"bucket": "ok-bucket", "endpoint": "127.0.0.1:8333"},
        {"bucket": "ok-bucket", "endpoint": "ftp://host"},
        {"bucket": "ok-bucket", "endpoint": "http://host:notaport"},
        {"bucket": "ok-bucket", "endpoint": "http://host/path"},
        {"bucket": "ok-bucket", "region": "US EAST"},
        {"bucket": "ok-bucket", "access_key_id": "only-the-id"},
        {"bucket": "ok-bucket", "max_concurrency": 0},
        {"bucket": "ok-bucket", "request_timeout_s": 0},
    ],
)
def test_invalid_config_is_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        S3Config(**kwargs)  # type: ignore[arg-type]


def test_config_from_env() -> None:
    env = {
        "TIERLOG_S3_BUCKET": "my-bucket",
        "TIERLOG_S3_PREFIX": "tier/one",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    config = S3Config.from_env(env, max_concurrency="4")
    assert config.bucket == "my-bucket" and config.prefix == "tier/one"
    assert config.endpoint == "http://127.0.0.1:9000" and config.allow_http
    assert config.region == "eu-west-1" and config.max_concurrency == 4
    assert "secret" not in repr(config)
    with pytest.raises(ConfigError, match="TIERLOG_S3_BUCKET"):
        S3Config.from_env({})
    with pytest.raises(ConfigError, match="max_concurrency"):
        S3Config.from_env(env, max_concurrency="many")
    with pytest.raises(ConfigError, match="unknown"):
        S3Config.from_env(env, colour="blue")


def test_config_from_uri() -> None:
    env = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}
    config = S3Config.from_uri(
        "s3://bucket-1/some/prefix?endpoint=http://127.0.0.1:8333&region=us-west-2", env
    )
    assert (config.bucket, config.prefix, config.region) == ("bucket-1", "some/prefix", "us-west-2")
    assert config.endpoint == "http://127.0.0.1:8333"
    assert config.access_key_id == "id"
    assert S3Config.from_uri("s3://bucket-1", {}).prefix == ""
    with pytest.raises(ConfigError, match="unknown S3 URI parameters"):
        S3Config.from_uri("s3://bucket-1?endpont=http://x", {})
    with pytest.raises(ConfigError):
        S3Config.from_uri("s3:///no-bucket", {})


# -- open_object_store -------------------------------------------------------------------------


def test_open_file_store(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}/objects")
    assert isinstance(store, FsObjectStore)
    store.put("x/y", b"1")
    assert open_object_store(f"file://{tmp_path}/objects").get("x/y") == b"1"


@pytest.mark.parametrize(
    "uri", ["file://relative/path", "file:///x?y=1", "gs://bucket", "nonsense", "s3://BAD"]
)
def test_open_bad_uri(uri: str) -> None:
    with pytest.raises(ConfigError):
        open_object_store(uri)


def test_fs_store_cannot_escape_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FsObjectStore(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link.d").symlink_to(outside)  # a directory planted by someone else
    from tierlog.storage.errors import InvalidKeyError

    with pytest.raises(InvalidKeyError, match="outside"):
        store.put("link/file", b"x")
    assert list(outside.iterdir()) == []


@pytest.mark.s3
def test_open_s3_store_with_env_credentials(
    seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    uri = f"s3://{seaweed.bucket}/factory?endpoint={seaweed.endpoint}&region={seaweed.region}"
    with open_object_store(uri, max_concurrency=4) as store:
        assert isinstance(store, S3ObjectStore)
        store.put("k", b"v")
        assert store.get("k") == b"v"
        store.delete("k")


# -- bad endpoints and credentials -------------------------------------------------------------


def _config(server: SeaweedServer, **overrides: object) -> S3Config:
    values: dict[str, object] = {
        "bucket": server.bucket,
        "prefix": "cfg",
        "endpoint": server.endpoint,
        "region": server.region,
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
        "connect_timeout_s": 2.0,
        "request_timeout_s": 10.0,
    }
    values.update(overrides)
    return S3Config(**values)  # type: ignore[arg-type]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.s3
def test_unreachable_endpoint_is_a_clear_transient_error(seaweed: SeaweedServer) -> None:
    config = _config(seaweed, endpoint=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(TransientError, match="unusable") as info:
        S3ObjectStore(config)
    assert len(str(info.value)) < 600  # a message, not a debug dump


@pytest.mark.s3
def test_wrong_credentials_are_a_clear_permanent_error(seaweed: SeaweedServer) -> None:
    with pytest.raises(PermanentError, match="access denied"):
        S3ObjectStore(_config(seaweed, secret_access_key="wrong-secret"))
    with pytest.raises(PermanentError, match="access denied"):
        S3ObjectStore(_config(seaweed, access_key_id="nobody", secret_access_key="x"))


# -- a misbehaving server, via a proxy in front of SeaweedFS -----------------------------------


class Proxy:
    """Forwards requests to SeaweedFS; ``rewrite`` may replace a response status (or answer
    without forwarding), to play a server that ignores If-None-Match, throttles or fails."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.requests: list[tuple[str, str, int]] = []
        self.rewrite: Callable[[str, dict[str, str], int | None], int | None] = (
            lambda method, headers, status: status
        )
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()}
                early = proxy.rewrite(self.command, headers, None)
                if early is not None:  # answer without forwarding
                    status, data, out_headers = early, b"<Error><Code>SlowDown</Code></Error>", {}
                else:
                    conn = http.client.HTTPConnection(
                        proxy.upstream.hostname, proxy.upstream.port, timeout=30
                    )
                    conn.request(self.command, self.path, body, headers)
                    response = conn.getresponse()
                    data = response.read()
                    out_headers = dict(response.getheaders())
                    status = proxy.rewrite(self.command, headers, response.status) or 502
                    conn.close()
                if status == 200 and not any(k.lower() == "etag" for k in out_headers):
                    out_headers["ETag"] = '"rewritten"'  # what a 200 PUT always carries
                proxy.requests.append((self.command, self.path, status))
                self.send_response(status)
                for k, v in out_headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[Proxy]:
    p = Proxy(seaweed.endpoint)
    try:
        yield p
    finally:
        p.close()


def _fast_retry() -> RetryPolicy:
    return RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


@pytest.mark.s3
def test_server_ignoring_if_none_match_is_refused(seaweed: SeaweedServer, proxy: Proxy) -> None:
    # every precondition failure is reported as success, as by a server without the feature
    proxy.rewrite = lambda method, headers, status: 200 if status == 412 else status
    with pytest.raises(UnsupportedBackendError, match="If-None-Match"):
        S3ObjectStore(_config(seaweed, endpoint=proxy.endpoint))
    proxy.rewrite = lambda method, headers, status: status
    S3ObjectStore(_config(seaweed, endpoint=proxy.endpoint))  # the real server passes


@pytest.mark.s3
def test_throttled_requests_are_retried(seaweed: SeaweedServer, proxy: Proxy) -> None:
    store = S3ObjectStore(_config(seaweed, endpoint=proxy.endpoint), retry=_fast_retry())
    store.put("throttle/k", b"data")
    throttled = {"left": 2}

    def throttle(method: str, headers: dict[str, str], status: int | None) -> int | None:
        if status is None and throttled["left"] > 0:
            throttled["left"] -= 1
            return 503
        return status

    proxy.rewrite = throttle
    proxy.requests.clear()
    assert store.get("throttle/k") == b"data"
    assert [r[2] for r in proxy.requests] == [503, 503, 200]
    throttled["left"] = 2  # create-only puts are retried too: a 503 means "not applied"
    store.put_if_absent("throttle/new", b"x")
    assert store.get("throttle/new") == b"x"
    throttled["left"] = 10  # more than the policy allows
    with pytest.raises(TransientError):
        store.head("throttle/k")


@pytest.mark.s3
def test_ambiguous_create_is_resolved_by_reading_back(seaweed: SeaweedServer, proxy: Proxy) -> None:
    store = S3ObjectStore(_config(seaweed, endpoint=proxy.endpoint), retry=_fast_retry())
    lost = {"left": 1}

    def lose_reply(method: str, headers: dict[str, str], status: int | None) -> int | None:
        if status == 200 and method == "PUT" and lost["left"] > 0:
            lost["left"] -= 1
            return 500  # the write landed, the client hears a server error
        return status

    proxy.rewrite = lose_reply
    proxy.requests.clear()
    store.put_if_absent("ambiguous/k", b"landed")  # retry meets 412, read-back: our bytes
    assert [r[2] for r in proxy.requests][:2] == [500, 412]
    assert store.resolved_creates == 1
    assert store.get("ambiguous/k") == b"landed"
    # without a lost reply first, AlreadyExists is a plain conflict (no read-back)
    proxy.requests.clear()
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent("ambiguous/k", b"landed")
    assert len(proxy.requests) == 1
    # a lost reply, then someone else's bytes under the key: a conflict, never adopted
    store.put("ambiguous/theirs", b"theirs")
    lost["left"] = 1

    def fail_first(method: str, headers: dict[str, str], status: int | None) -> int | None:
        if status is None and method == "PUT" and lost["left"] > 0:
            lost["left"] -= 1
            return 500
        return status

    proxy.rewrite = fail_first
    with pytest.raises(AlreadyExistsError):
        store.put_if_absent("ambiguous/theirs", b"mine")
    assert store.get("ambiguous/theirs") == b"theirs"
    proxy.rewrite = lose_reply
    lost["left"] = 10
    proxy.requests.clear()
    with pytest.raises(TransientError):  # overwrites are idempotent: retried, then give up
        store.put("ambiguous/other", b"x")
    assert len(proxy.requests) == 4


@pytest.mark.s3
def test_concurrency_is_bounded(seaweed: SeaweedServer, proxy: Proxy) -> None:
    store = S3ObjectStore(_config(seaweed, endpoint=proxy.endpoint, max_concurrency=2))
    store.put("bound/k", b"x")
    active = {"now": 0, "max": 0}
    lock = threading.Lock()
    gate = threading.Event()

    def count(method: str, headers: dict[str, str], status: int | None) -> int | None:
        if status is None:
            with lock:
                active["now"] += 1
                active["max"] = max(active["max"], active["now"])
            gate.wait(0.2)
            with lock:
                active["now"] -= 1
        return status

    proxy.rewrite = count
    threads = [threading.Thread(target=store.get, args=("bound/k",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert active["max"] == 2
