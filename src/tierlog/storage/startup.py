"""Opening the outside stores at start-up so that a flaky store does not stop a start.

Each step (the object store's create-only probe, opening the MetaStore) is retried under the
store retry policy until it succeeds or the start-up deadline passes; transient failures
(including calls that ran out of their own retries) are logged as retries. When the deadline
passes the server gives up with one ``StartupError`` line naming the store's URI (without
credentials) and the last error. Configuration mistakes and permanent errors (bad
credentials, missing bucket, a server without conditional writes) fail at once.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from tierlog.errors import TierlogError
from tierlog.storage.errors import StorageError, TransientError
from tierlog.storage.meta_store import MetaStore, open_meta_store
from tierlog.storage.object_store import ObjectStore, open_object_store
from tierlog.storage.retry import RetryPolicy, retry_until


class StartupError(TierlogError):
    """A store stayed unusable for the whole start-up deadline."""


def redact(uri: str) -> str:
    """``uri`` without a password (etcd URIs may carry ``user:password@``)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def open_object_store_for_startup(uri: str, policy: RetryPolicy, deadline_s: float) -> ObjectStore:
    """Open the object store; on S3 run the create-only probe until it passes."""
    if urlsplit(uri).scheme == "s3":
        store = open_object_store(uri, retry=policy, probe=False)
        probe = getattr(store, "probe_create_only")  # noqa: B009 - S3 only
        try:
            _until(uri, deadline_s, policy, "startup_probe", probe)
        except BaseException:
            store.close()
            raise
        return store
    result: list[ObjectStore] = []
    _until(uri, deadline_s, policy, "startup_open", lambda: result.append(open_object_store(uri)))
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
        _until(uri, deadline_s, policy, "startup_meta", open_and_read)
    except BaseException:
        if result:
            result[0].close()
        raise
    return result[0]


READY_KEY = "tierlog-startup-check"
"""A key only ever read: a cheap round trip proving the MetaStore answers."""


def _until(uri: str, deadline_s: float, policy: RetryPolicy, what: str, step: object) -> None:
    try:
        retry_until(deadline_s, step, what=what, policy=policy)  # type: ignore[arg-type]
    except TransientError as exc:
        raise StartupError(
            f"{redact(uri)} still unusable after {deadline_s:g} s of retries: {exc}"
        ) from exc
    except StorageError as exc:
        raise StartupError(f"{redact(uri)}: {exc}") from exc
