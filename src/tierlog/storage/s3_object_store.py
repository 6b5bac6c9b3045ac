"""The S3 ObjectStore, on ``obstore`` (Rust object_store; releases the GIL during I/O).

- Create-only puts send ``If-None-Match: *``. Servers that ignore the header would silently
  overwrite immutable fragments, so the store probes at startup (create a probe key twice; the
  second must fail) and refuses to run with ``UnsupportedBackendError`` otherwise.
- obstore's own retries are switched off; ``RetryPolicy`` (backoff + full jitter) retries
  idempotent requests on throttling, 5xx, timeouts and connection errors. Create-only puts are
  not retried when the outcome is unknown (see ``put_if_absent``).
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
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from tierlog.errors import ConfigError
from tierlog.storage.errors import (
    AlreadyExistsError,
    InvalidKeyError,
    InvalidRangeError,
    NotFoundError,
    PermanentError,
    PreconditionFailedError,
    StorageError,
    TransientError,
    UnsupportedBackendError,
)
from tierlog.storage.object_store import (
    MAX_KEY_BYTES,
    MIN_PART_SIZE,
    Buffer,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PendingUpload,
    short_key,
    validate_key,
    validate_metadata,
    validate_part,
)
from tierlog.storage.retry import RetryPolicy
from tierlog.storage.s3_config import S3Config

T = TypeVar("T")

_STATUS = re.compile(r"status(?: code)?: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_REJECTED_STATUS = frozenset({429, 503})  # throttled: the request was refused, not applied
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


class _S3Failure(Exception):
    """A classified client failure: the typed error to raise plus the HTTP status if any."""

    def __init__(self, error: StorageError, status: int | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.status = status


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 300 else line[:300] + "..."


def _classify(exc: BaseException, what: str) -> _S3Failure:
    """Map an obstore / botocore exception to tierlog's typed errors."""
    if isinstance(exc, _S3Failure):
        return exc
    if isinstance(exc, StorageError):
        return _S3Failure(exc, None)
    text = str(exc)
    match = _STATUS.search(text)
    status = int(match.group(1)) if match else None
    code_match = _CODE.search(text)
    code = code_match.group(1) if code_match else None
    name = type(exc).__name__
    # botocore errors carry the status and code in the response
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", status)
        code = response.get("Error", {}).get("Code", code)
    detail = f"HTTP {status} {code}" if status else _first_line(text)
    if code in ("KeyTooLongError", "InvalidObjectName"):
        return _S3Failure(InvalidKeyError(f"{what}: rejected by the server ({detail})"), status)
    if code == "NoSuchBucket":
        return _S3Failure(PermanentError(f"{what}: bucket does not exist ({detail})"), status)
    if (
        isinstance(exc, FileNotFoundError)
        or name == "NotFoundError"
        or code in ("NoSuchKey", "NoSuchUpload")
        or status == 404
    ):
        return _S3Failure(NotFoundError(f"{what}: not found"), status or 404)
    if name == "AlreadyExistsError" or (status == 412 and "create" in what):
        return _S3Failure(AlreadyExistsError(f"{what}: already exists"), status)
    if name == "PreconditionError" or status == 412:
        return _S3Failure(PreconditionFailedError(f"{what}: precondition failed"), status)
    if name in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
        return _S3Failure(
            PermanentError(f"{what}: access denied, check S3 credentials ({detail})"), status
        )
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return _S3Failure(PermanentError(f"{what}: no S3 credentials ({text})"), None)
    if status is not None:
        if status in _RETRYABLE_STATUS:
            return _S3Failure(TransientError(f"{what}: {detail}"), status)
        if status == 409 and code in ("ConditionalRequestConflict", "OperationAborted"):
            return _S3Failure(TransientError(f"{what}: {detail}"), status)
        return _S3Failure(PermanentError(f"{what}: {detail}"), status)
    if isinstance(exc, ValueError | TypeError) and name not in ("GenericError",):
        return _S3Failure(PermanentError(f"{what}: {_first_line(text)}"), None)
    # no HTTP status: connection refused / reset, DNS, timeouts: worth retrying
    return _S3Failure(TransientError(f"{what}: {_first_line(text)}"), None)


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, _S3Failure) and isinstance(exc.error, TransientError)


def _is_rejected(exc: BaseException) -> bool:
    return _is_transient(exc) and isinstance(exc, _S3Failure) and exc.status in _REJECTED_STATUS


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
            raise ConfigError(f"cannot configure S3 store {self}: {_first_line(str(exc))}") from exc
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
                raise _classify(exc, what) from exc

    def _call(
        self,
        what: str,
        operation: Callable[[], T],
        retryable: Callable[[BaseException], bool] = _is_transient,
    ) -> T:
        """``_request`` retried under the policy; raises the typed error."""
        try:
            return self.retry.call(lambda: self._request(what, operation), retryable)
        except _S3Failure as failure:
            raise failure.error from failure.__cause__

    def probe_create_only(self) -> None:
        """Refuse to run on a server that ignores ``If-None-Match: *`` (and surface bad
        endpoints, credentials or buckets now, with a clear error, not at the first upload)."""
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            self.put_if_absent(key, b"probe")
        except StorageError as exc:
            raise type(exc)(f"{self} unusable: {exc}") from exc
        try:
            try:
                self.put_if_absent(key, b"probe again")
            except AlreadyExistsError:
                return
            raise UnsupportedBackendError(
                f"{self} does not enforce create-only puts (If-None-Match: *): a second "
                "create of the same key succeeded. tierlog needs it to keep fragments "
                "immutable; use a server that supports conditional writes."
            )
        finally:
            self.delete(key)

    # -- ObjectStore --------------------------------------------------------------------------

    def put(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        import obstore

        self._check(key)
        attributes: Any = validate_metadata(metadata) or None
        result = self._call(
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
        """Create-only put (``If-None-Match: *``).

        Only retried when the server refused the request outright (429 / 503 throttling).
        A timeout, a dropped connection or a 500 may hide a write that took effect; a retry
        would then fail with ``AlreadyExistsError`` for our own object, which is worse than
        admitting we do not know. Those surface as ``TransientError``: the caller reads the
        key back and decides (the tiering adoption rule does exactly that).
        """
        import obstore

        self._check(key)
        attributes: Any = validate_metadata(metadata) or None
        result = self._call(
            f"create {short_key(key)}",
            lambda: obstore.put(
                self._store,
                key,
                data,
                mode="create",
                use_multipart=False,
                attributes=attributes,
            ),
            _is_rejected,
        )
        return ObjectMeta(key, memoryview(data).nbytes, result["e_tag"])

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        import obstore

        self._check(key)
        what = f"get {short_key(key)}"
        if start is None and end is None:
            return self._call(what, lambda: bytes(obstore.get(self._store, key).bytes()))
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
            return self._call(what, fetch)
        except PermanentError as exc:
            if "HTTP 416" in str(exc):
                return memoryview(b"")
            raise

    def _get_range(self, what: str, fetch: Callable[[], bytes]) -> bytes:
        try:
            return self._call(what, fetch)
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
        result = self._call(
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

    def _list(self, prefix: str, directory: str | None, offset: str | None) -> Iterator[ObjectMeta]:
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
                except _S3Failure as failure:
                    attempt += 1
                    if not _is_transient(failure) or attempt >= self.retry.max_attempts:
                        raise failure.error from failure.__cause__
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
                    if key.startswith(PROBE_PREFIX):
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
            self._call(f"delete {short_key(key)}", lambda: obstore.delete(self._store, key))

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
            self._call(f"delete {len(keys)} keys", lambda: obstore.delete(self._store, keys))

    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        self._check(key)
        return S3MultipartUpload(self, key, validate_metadata(metadata))

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[PendingUpload]:
        if prefix:
            validate_key(prefix.rstrip("/") or "x")
        client = self.boto_client()
        strip = len(self._full_key("")) if self.config.prefix else 0
        markers: dict[str, str] = {}
        found: list[PendingUpload] = []
        while True:
            page = self._call(
                f"list multipart uploads {prefix!r}",
                partial(
                    client.list_multipart_uploads,
                    Bucket=self.config.bucket,
                    Prefix=self._full_key(prefix),
                    **markers,
                ),
            )
            for upload in page.get("Uploads", []):
                initiated = upload.get("Initiated")
                found.append(
                    PendingUpload(
                        upload["Key"][strip:],
                        upload["UploadId"],
                        initiated.timestamp() if initiated else None,
                    )
                )
            if not page.get("IsTruncated"):
                break
            markers = {
                "KeyMarker": page.get("NextKeyMarker", ""),
                "UploadIdMarker": page.get("NextUploadIdMarker", ""),
            }
        found.sort(key=lambda u: (u.key, u.upload_id))
        return iter(found)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self._check(key)
        client = self.boto_client()
        with contextlib.suppress(NotFoundError):
            self._call(
                f"abort multipart {short_key(key)}",
                lambda: client.abort_multipart_upload(
                    Bucket=self.config.bucket, Key=self._full_key(key), UploadId=upload_id
                ),
            )

    # -- boto3, for multipart only ------------------------------------------------------------

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


class S3MultipartUpload(MultipartUpload):
    """CreateMultipartUpload / UploadPart / CompleteMultipartUpload, one part per call."""

    def __init__(self, store: S3ObjectStore, key: str, metadata: dict[str, str]) -> None:
        self.key = key
        self._store = store
        self._client = store.boto_client()
        self._bucket = store.config.bucket
        self._full_key = store._full_key(key)
        self._parts: dict[int, tuple[str, int]] = {}  # part number -> (etag, size)
        self._lock = threading.Lock()
        self._done = False
        created = store._call(
            f"create multipart {short_key(key)}",
            lambda: self._client.create_multipart_upload(
                Bucket=self._bucket, Key=self._full_key, Metadata=metadata
            ),
        )
        self.upload_id: str = created["UploadId"]

    def _check_open(self) -> None:
        if self._done:
            raise PermanentError(
                f"multipart upload of {short_key(self.key)} was completed or aborted"
            )

    def put_part(self, part_number: int, data: Buffer) -> None:
        """Upload part ``part_number`` as exactly ``data``; retried (re-sending the same part
        is idempotent)."""
        size = memoryview(data).nbytes
        validate_part(part_number, size)
        self._check_open()
        body = data if isinstance(data, bytes) else bytes(data)
        result = self._store._call(
            f"upload part {part_number} of {short_key(self.key)}",
            lambda: self._client.upload_part(
                Bucket=self._bucket,
                Key=self._full_key,
                UploadId=self.upload_id,
                PartNumber=part_number,
                Body=body,
            ),
        )
        with self._lock:
            self._parts[part_number] = (result["ETag"], size)

    def complete(self) -> ObjectMeta:
        self._check_open()
        with self._lock:
            numbers = sorted(self._parts)
            parts = [{"ETag": self._parts[n][0], "PartNumber": n} for n in numbers]
            sizes = [self._parts[n][1] for n in numbers]
        if not parts:
            raise InvalidRangeError(f"multipart upload of {short_key(self.key)} has no parts")
        for n, size in zip(numbers[:-1], sizes[:-1], strict=True):
            if size < MIN_PART_SIZE:
                raise InvalidRangeError(
                    f"part {n} of {short_key(self.key)} is smaller than {MIN_PART_SIZE} bytes"
                )
        attempts = 0

        def complete_once() -> Any:
            nonlocal attempts
            attempts += 1
            return self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self._full_key,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": parts},
            )

        try:
            self._store._call(f"complete multipart {short_key(self.key)}", complete_once)
        except NotFoundError:
            # NoSuchUpload after a retry: an earlier, ambiguous attempt completed it
            meta = self._store.head(self.key)
            if attempts < 2 or meta.size != sum(sizes):
                raise
        self._done = True
        return self._store.head(self.key)

    def abort(self) -> None:
        if self._done:
            return
        with contextlib.suppress(NotFoundError):
            self._store._call(
                f"abort multipart {short_key(self.key)}",
                lambda: self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self._full_key, UploadId=self.upload_id
                ),
            )
        self._done = True
