"""The S3 ObjectStore, on ``obstore`` (Rust object_store; releases the GIL during I/O).

- Create-only puts send ``If-None-Match: *``. Servers that ignore the header would silently
  overwrite immutable fragments, so the store probes at startup (create a probe key twice; the
  second must fail) and refuses to run with ``UnsupportedBackendError`` otherwise.
- obstore's own retries are switched off (``max_retries: 0``): object_store retries at the
  HTTP level with its own backoff and no report to us, and it cannot tell a create-only put
  whose reply was lost from a conflict. ``RetryPolicy`` (backoff + full jitter, bounded
  attempts and deadline, every retry reported) is the only retry layer, for every request;
  create-only puts resolve a lost reply by reading the object back (see ``put_if_absent``).
- A semaphore bounds the requests in flight per store.
- Multipart uploads with caller-chosen part boundaries use boto3 (imported lazily): obstore's
  Python API only exposes multipart inside ``put``, which cuts parts itself at a fixed
  ``chunk_size``; the offloader needs part N to be exactly the N-th block it hands over.
  Listing and aborting uploads left by a crash use boto3 too.
- User metadata travels as ``x-amz-meta-*`` headers: obstore ``attributes`` on puts, boto3
  ``Metadata`` on multipart initiation, and a HEAD through obstore's ``get(head=True)`` (whose
  result carries the attributes, unlike ``obstore.head``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from tierlog.errors import ConfigError
from tierlog.logs import get_logger
from tierlog.storage.errors import (
    AlreadyExistsError,
    InvalidKeyError,
    InvalidRangeError,
    NotFoundError,
    PermanentError,
)
from tierlog.storage.object_store import (
    MAX_KEY_BYTES,
    Buffer,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PendingUpload,
    short_key,
    validate_key,
    validate_metadata,
)
from tierlog.storage.retry import RetryPolicy
from tierlog.storage.s3_config import S3Config
from tierlog.storage.s3_errors import (
    S3Failure,
    classify,
    failure_kind,
    first_line,
    is_transient,
)

T = TypeVar("T")

LIST_PAGE_SIZE = 1000
DELETE_BATCH = 1000
PROBE_PREFIX = "_tierlog/probe/"
_STANDARD_ATTRIBUTES = frozenset(
    {
        "Content-Disposition",
        "Content-Encoding",
        "Content-Language",
        "Content-Type",
        "Cache-Control",
        "Storage-Class",
    }
)

log = get_logger(__name__)


def _past(key: str, prefix: str) -> bool:
    """``key`` sorts after every key starting with ``prefix`` both in byte order (AWS S3) and
    in directory-tree order, segment by segment (SeaweedFS lists that way)."""
    return key > prefix and key.split("/") > prefix.split("/")


class S3ObjectStore(ObjectStore):
    """Objects under ``{config.prefix}/`` in ``config.bucket``."""

    def __init__(
        self, config: S3Config, *, probe: bool = True, retry: RetryPolicy | None = None
    ) -> None:
        from datetime import timedelta

        from obstore.store import S3Store

        self.config = config
        self.retry = retry or RetryPolicy(max_attempts=config.max_attempts)
        self.resolved_creates = 0  # create-only puts whose lost reply was resolved as ours
        self._slots = threading.BoundedSemaphore(config.max_concurrency)
        self._boto: Any = None
        self._boto_lock = threading.Lock()
        options: dict[str, Any] = {
            "region": config.region,
            "virtual_hosted_style_request": config.virtual_hosted_style,
        }
        if config.endpoint:
            options["endpoint"] = config.endpoint
        if config.access_key_id is not None:
            options["access_key_id"] = config.access_key_id
            options["secret_access_key"] = config.secret_access_key
        if config.session_token is not None:
            options["session_token"] = config.session_token
        try:
            self._store = S3Store(
                config.bucket,
                prefix=config.prefix or None,
                client_options={
                    "allow_http": config.allow_http,
                    "connect_timeout": timedelta(seconds=config.connect_timeout_s),
                    "timeout": timedelta(seconds=config.request_timeout_s),
                    "pool_max_idle_per_host": str(config.max_concurrency),
                },
                retry_config={"max_retries": 0},
                **options,
            )
        except Exception as exc:
            raise ConfigError(f"cannot configure S3 store {self}: {first_line(str(exc))}") from exc
        if probe:
            self.probe_create_only()

    def __repr__(self) -> str:
        where = f" at {self.config.endpoint}" if self.config.endpoint else ""
        return f"S3ObjectStore(s3://{self.config.bucket}/{self.config.prefix}{where})"

    # -- plumbing -----------------------------------------------------------------------------

    def _request(self, what: str, operation: Callable[[], T]) -> T:
        """One request under the concurrency bound, failures classified."""
        with self._slots:
            try:
                return operation()
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                raise classify(exc, what) from exc

    def retried_call(
        self,
        what: str,
        operation: Callable[[], T],
        retryable: Callable[[BaseException], bool] = is_transient,
        *,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> T:
        """``_request`` retried under the policy; raises the typed error. ``what`` is
        "<operation> <key>": the retry report's op and key. Public for the multipart
        upload (``s3_multipart``), which calls S3 under the same policy."""
        op, _, key = what.partition(" ")
        try:
            return self.retry.call(
                lambda: self._request(what, operation),
                retryable,
                op=op,
                key=key,
                kind_of=failure_kind,
                on_failure=on_failure,
            )
        except S3Failure as failure:
            raise failure.error from failure.__cause__

    def probe_create_only(self) -> None:
        """Refuse to run on a server that ignores ``If-None-Match: *``, and surface bad
        endpoints, credentials or buckets now (see ``s3_probe``); leaves no probe object."""
        from tierlog.storage.s3_probe import probe_create_only

        probe_create_only(self)

    # -- ObjectStore --------------------------------------------------------------------------

    def put(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        import obstore

        self._check(key)
        attributes: Any = validate_metadata(metadata) or None
        result = self.retried_call(
            f"put {short_key(key)}",
            lambda: obstore.put(
                self._store,
                key,
                data,
                mode="overwrite",
                use_multipart=False,
                attributes=attributes,
            ),
        )
        return ObjectMeta(key, memoryview(data).nbytes, result["e_tag"])

    def put_if_absent(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        """Create-only put (``If-None-Match: *``), retried on every transient failure.

        A timeout, a dropped connection or a 500 may hide a write that took effect (a lost
        reply); the retry then meets ``AlreadyExistsError`` for what may be our own object.
        That answer is never taken blindly: after a transient failure the object is read
        back, and only the same bytes count as our write; anything else is a real conflict.
        """
        import obstore

        self._check(key)
        attributes: Any = validate_metadata(metadata) or None
        unsure = False

        def note(exc: BaseException) -> None:
            nonlocal unsure
            unsure = unsure or is_transient(exc)

        try:
            result = self.retried_call(
                f"create {short_key(key)}",
                lambda: obstore.put(
                    self._store,
                    key,
                    data,
                    mode="create",
                    use_multipart=False,
                    attributes=attributes,
                ),
                on_failure=note,
            )
        except AlreadyExistsError:
            if not unsure or not self._holds(key, data):
                raise
            meta = self.head(key)
            log.info("create_resolved_as_own_write", key=short_key(key))
            self.resolved_creates += 1
            return meta
        return ObjectMeta(key, memoryview(data).nbytes, result["e_tag"])

    def _holds(self, key: str, data: Buffer) -> bool:
        """Whether ``key`` holds exactly ``data`` (it may have vanished meanwhile: no)."""
        try:
            return self.get(key) == memoryview(data).cast("B")
        except NotFoundError:
            return False

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        import obstore

        self._check(key)
        what = f"get {short_key(key)}"
        if start is None and end is None:
            return self.retried_call(what, lambda: bytes(obstore.get(self._store, key).bytes()))
        lo = 0 if start is None else start
        if lo < 0 or (end is not None and end < 0):
            raise InvalidRangeError(f"negative byte range [{start}, {end})")
        if end is not None and end <= lo:
            self.head(key)  # an empty range still needs the object to exist
            return b""
        if end is None:
            options: Any = {"range": {"offset": lo}}
            fetch = lambda: bytes(obstore.get(self._store, key, options=options).bytes())  # noqa: E731
        else:
            fetch = lambda: bytes(obstore.get_range(self._store, key, start=lo, end=end))  # noqa: E731
        return self._get_range(what, fetch)

    def get_view(self, key: str, start: int | None = None, end: int | None = None) -> memoryview:
        """Zero-copy ranged get: a view of obstore's buffer (saves a copy per byte fetched)."""
        import obstore

        lo = 0 if start is None else start
        if end is None or lo < 0 or end <= lo:
            return memoryview(self.get(key, start, end))  # rare shapes: the general path
        self._check(key)
        what = f"get {short_key(key)}"
        fetch = lambda: memoryview(obstore.get_range(self._store, key, start=lo, end=end))  # noqa: E731
        try:
            return self.retried_call(what, fetch)
        except PermanentError as exc:
            if "HTTP 416" in str(exc):
                return memoryview(b"")
            raise

    def _get_range(self, what: str, fetch: Callable[[], bytes]) -> bytes:
        try:
            return self.retried_call(what, fetch)
        except PermanentError as exc:
            if "HTTP 416" in str(exc):  # range starts past the end: the object exists
                return b""
            raise

    def get_suffix(self, key: str, length: int) -> bytes:
        import obstore

        self._check(key)
        if length < 0:
            raise InvalidRangeError(f"negative suffix length {length}")
        if length == 0:
            self.head(key)
            return b""
        options: Any = {"range": {"suffix": length}}
        return self._get_range(
            f"get {short_key(key)}",
            lambda: bytes(obstore.get(self._store, key, options=options).bytes()),
        )

    def head(self, key: str) -> ObjectMeta:
        import obstore

        self._check(key)
        options: Any = {"head": True}
        result = self.retried_call(
            f"head {short_key(key)}", lambda: obstore.get(self._store, key, options=options)
        )
        meta = result.meta
        modified = meta.get("last_modified")
        user = {
            str(k).lower(): str(v)
            for k, v in result.attributes.items()
            if k not in _STANDARD_ATTRIBUTES
        }
        return ObjectMeta(
            key, meta["size"], meta.get("e_tag"), modified.timestamp() if modified else None, user
        )

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        """S3 lists by key prefix, but obstore by directory: list the prefix's directory and
        keep the contiguous run of keys that start with the prefix. A page that fails
        transiently is re-listed from the last key yielded.

        Order: AWS S3 sorts by bytes, SeaweedFS by directory tree (segment by segment); the two
        differ only where one key has '/' where another has a byte below '/' ('-', '.', ...).
        ``start_after`` on SeaweedFS also skips the keys below ``start_after/``."""
        if prefix:
            validate_key(prefix.rstrip("/") or "x")
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else None
        return self._list(prefix, directory, start_after)

    def probe_objects(self) -> Iterator[ObjectMeta]:
        """The create-only probe's objects (``s3_probe``), which ``list`` hides."""
        return self._list(PROBE_PREFIX, PROBE_PREFIX.rstrip("/"), None, probes=True)

    def _list(
        self, prefix: str, directory: str | None, offset: str | None, *, probes: bool = False
    ) -> Iterator[ObjectMeta]:
        import obstore

        attempt = 0
        matched = False
        while True:
            stream = obstore.list(
                self._store, prefix=directory, offset=offset or None, chunk_size=LIST_PAGE_SIZE
            )
            while True:
                try:
                    page = self._request(f"list {prefix!r}", partial(next, stream, None))
                except S3Failure as failure:
                    attempt += 1
                    if not is_transient(failure) or attempt >= self.retry.max_attempts:
                        raise failure.error from failure.__cause__
                    if self.retry.observer is not None:
                        self.retry.observer.on_retry(
                            "list", prefix, attempt, failure_kind(failure), failure.error
                        )
                    self.retry.sleep(self.retry.delay(attempt))
                    break  # re-list from the last key yielded
                if page is None:
                    return
                for meta in page:
                    key = meta["path"]
                    if not key.startswith(prefix):
                        if matched or _past(key, prefix):
                            return  # matching keys are contiguous in any server order
                        continue
                    matched = True
                    if key.startswith(PROBE_PREFIX) and not probes:
                        continue
                    offset = key
                    modified = meta.get("last_modified")
                    yield ObjectMeta(
                        key,
                        meta["size"],
                        meta.get("e_tag"),
                        modified.timestamp() if modified else None,
                    )

    def delete(self, key: str) -> None:
        import obstore

        self._check(key)
        with contextlib.suppress(NotFoundError):
            self.retried_call(f"delete {short_key(key)}", lambda: obstore.delete(self._store, key))

    def delete_many(self, keys: Iterable[str]) -> None:
        import obstore

        batch: list[str] = []
        for key in keys:
            batch.append(self._check(key))
            if len(batch) == DELETE_BATCH:
                self._delete_batch(obstore, batch)
                batch = []
        if batch:
            self._delete_batch(obstore, batch)

    def _delete_batch(self, obstore: Any, batch: Sequence[str]) -> None:
        keys = [*batch]
        with contextlib.suppress(NotFoundError):
            self.retried_call(f"delete {len(keys)} keys", lambda: obstore.delete(self._store, keys))

    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        from tierlog.storage.s3_multipart import S3MultipartUpload

        self._check(key)
        return S3MultipartUpload(self, key, validate_metadata(metadata))

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[PendingUpload]:
        from tierlog.storage.s3_multipart import list_pending_uploads

        if prefix:
            validate_key(prefix.rstrip("/") or "x")
        return list_pending_uploads(self, prefix)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self._check(key)
        client = self.boto_client()
        with contextlib.suppress(NotFoundError):
            self.retried_call(
                f"abort multipart {short_key(key)}",
                lambda: client.abort_multipart_upload(
                    Bucket=self.config.bucket, Key=self._full_key(key), UploadId=upload_id
                ),
            )

    # -- keys and the boto3 client (multipart only) ----------------------------------------

    def _check(self, key: str) -> str:
        """``validate_key``, plus S3's 1024-byte limit on the key including our prefix."""
        validate_key(key)
        if len(self._full_key(key).encode()) > MAX_KEY_BYTES:
            raise InvalidKeyError(
                f"object key {short_key(key)} is too long for S3 with prefix "
                f"{self.config.prefix!r} (> {MAX_KEY_BYTES} bytes in all)"
            )
        return key

    def _full_key(self, key: str) -> str:
        return f"{self.config.prefix}/{key}" if self.config.prefix else key

    def boto_client(self) -> Any:
        """A boto3 S3 client (thread-safe, created once) for the multipart calls."""
        with self._boto_lock:
            if self._boto is None:
                import boto3
                from botocore.config import Config

                c = self.config
                self._boto = boto3.client(
                    "s3",
                    endpoint_url=c.endpoint,
                    region_name=c.region,
                    aws_access_key_id=c.access_key_id,
                    aws_secret_access_key=c.secret_access_key,
                    aws_session_token=c.session_token,
                    config=Config(
                        retries={"max_attempts": 1, "mode": "standard"},
                        connect_timeout=c.connect_timeout_s,
                        read_timeout=c.request_timeout_s,
                        max_pool_connections=c.max_concurrency,
                        s3={"addressing_style": "virtual" if c.virtual_hosted_style else "path"},
                    ),
                )
            return self._boto

    def close(self) -> None:
        with self._boto_lock:
            if self._boto is not None:
                self._boto.close()
                self._boto = None
