"""Opening the outside stores at start-up so that a flaky store does not stop a start.

Each step (the object store's create-only probe, opening the MetaStore) is retried under the
store retry policy until it succeeds or the start-up deadline passes; transient failures
(including calls that ran out of their own retries) are logged as retries. When the deadline
passes the step fails with ``StoreStartupTimeoutError`` naming the last error, which the
server turns into its one-line start-up error naming the store's URI (password redacted).
Configuration mistakes and permanent errors (bad credentials, missing bucket, a server
without conditional writes) fail at once, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from tierlog.storage.errors import StoreStartupTimeoutError, TransientError
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store
from tierlog.storage.retry import RetryPolicy, retry_until


def open_object_store_for_startup(uri: str, policy: RetryPolicy, deadline_s: float) -> ObjectStore:
    """Open the object store; on S3 run the create-only probe until it passes."""
    if urlsplit(uri).scheme == "s3":
        store = open_object_store(uri, retry=policy, probe=False)
        probe = getattr(store, "probe_create_only")  # noqa: B009 - S3 only
        try:
            _until(deadline_s, policy, "startup_probe", probe)
        except BaseException:
            store.close()
            raise
        return store
    result: list[ObjectStore] = []
    _until(deadline_s, policy, "startup_open", lambda: result.append(open_object_store(uri)))
    return result[0]


def open_meta_store_for_startup(uri: str, policy: RetryPolicy, deadline_s: float) -> MetaStore:
    """Open the MetaStore and wait until it answers a read (clients such as etcd's connect
    lazily, so opening alone proves nothing)."""
    result: list[MetaStore] = []

    def open_and_read() -> None:
        if not result:
            result.append(open_meta_store(uri))
        result[0].get(READY_KEY)

    try:
        _until(deadline_s, policy, "startup_meta", open_and_read)
    except BaseException:
        if result:
            result[0].close()
        raise
    return result[0]


READY_KEY = "tierlog-startup-check"
"""A key only ever read: a cheap round trip proving the MetaStore answers."""


def _until(deadline_s: float, policy: RetryPolicy, what: str, step: Callable[[], object]) -> None:
    try:
        retry_until(deadline_s, step, what=what, policy=policy)
    except TransientError as exc:
        raise StoreStartupTimeoutError(
            f"still unusable after {deadline_s:g} s of retries: {exc}"
        ) from exc
