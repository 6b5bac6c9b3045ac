"""The ObjectStore interface: what tierlog needs from S3-like storage.

Synchronous by design: backends release the GIL during I/O (obstore) or do plain
file I/O, so callers get concurrency from a thread pool; the asyncio server wraps
calls with ``asyncio.to_thread``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tierlog.errors import ConfigError
from tierlog.storage.errors import (
    InvalidKeyError,
    InvalidMetadataError,
    InvalidRangeError,
    UnsupportedBackendError,
)

MAX_KEY_BYTES = 1024
MAX_SEGMENT_BYTES = 250  # between slashes: a file name (fs backend, SeaweedFS filer)
MIN_PART_SIZE = 5 * 1024 * 1024  # S3: every multipart part but the last
MAX_PART_NUMBER = 10_000
MAX_METADATA_BYTES = 2048  # S3: user metadata, keys and values together

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    key: str
    size: int
    etag: str | None = None
    last_modified: float | None = None  # seconds since the epoch
    metadata: Mapping[str, str] | None = None  # user metadata: filled in by ``head`` only


@dataclass(frozen=True, slots=True)
class PendingUpload:
    """A multipart upload that was initiated and neither completed nor aborted."""

    key: str
    upload_id: str
    initiated: float | None = None  # seconds since the epoch


_METADATA_KEY = re.compile(r"[a-z0-9][a-z0-9-]*")


def validate_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """User metadata as a plain dict, or ``InvalidMetadataError``. Keys are lowercase ASCII
    letters, digits and '-' (S3 servers lowercase keys; these survive every backend
    unchanged), values printable ASCII, at most 2 KiB in all (S3's limit)."""
    if metadata is None:
        return {}
    checked: dict[str, str] = {}
    total = 0
    for key, value in metadata.items():
        if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
            raise InvalidMetadataError(
                f"user metadata key {key!r}: use lowercase letters, digits and '-'"
            )
        if not isinstance(value, str) or not all(" " <= c <= "~" for c in value):
            raise InvalidMetadataError(f"user metadata {key!r}: value must be printable ASCII")
        total += len(key) + len(value)
        checked[key] = value
    if total > MAX_METADATA_BYTES:
        raise InvalidMetadataError(f"user metadata of {total} bytes > {MAX_METADATA_BYTES}")
    return checked


def clamp_range(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """``[start, end)`` clamped to an object of ``size`` bytes, like slicing: a range past the
    end is empty, never an error. Negative bounds are rejected (use ``get_suffix``)."""
    lo = 0 if start is None else start
    hi = size if end is None else end
    if lo < 0 or hi < 0:
        raise InvalidRangeError(f"negative byte range [{start}, {end})")
    hi = min(hi, size)
    return (lo, hi) if lo < hi else (lo, lo)


def validate_part(part_number: int, data_len: int) -> None:
    if not 1 <= part_number <= MAX_PART_NUMBER:
        raise InvalidRangeError(f"part number {part_number} outside 1..{MAX_PART_NUMBER}")
    if data_len == 0:
        raise InvalidRangeError(f"part {part_number} is empty")


def short_key(key: str) -> str:
    """A key for error messages: quoted, and cut in the middle if long."""
    return repr(key) if len(key) <= 120 else repr(key[:60] + "..." + key[-50:])


def validate_key(key: str) -> str:
    """Reject keys that are empty, too long (in all or between slashes), absolute or that
    could escape the store root. The same rules on every backend keep keys portable."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError("object key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"object key longer than {MAX_KEY_BYTES} bytes: {short_key(key)}")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidKeyError(f"invalid object key {key!r}")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKeyError(f"invalid object key {short_key(key)}: empty, '.' or '..' segment")
    if any(len(p.encode()) > MAX_SEGMENT_BYTES for p in parts):
        raise InvalidKeyError(
            f"object key {short_key(key)} has a segment longer than {MAX_SEGMENT_BYTES} bytes"
        )
    return key


class MultipartUpload(ABC):
    """A multipart upload in progress. Part numbers start at 1; each part is exactly
    the bytes given (S3 requires every part but the last to be >= 5 MiB)."""

    key: str
    upload_id: str  # what ``list_multipart_uploads`` reports and ``abort_multipart`` takes

    @abstractmethod
    def put_part(self, part_number: int, data: Buffer) -> None:
        """Upload (or re-upload) part ``part_number``: exactly these bytes."""

    @abstractmethod
    def complete(self) -> ObjectMeta:
        """Join the uploaded parts in part-number order into the object (overwriting).
        Raise ``InvalidRangeError`` if no part was uploaded or a part other than the last
        is smaller than ``MIN_PART_SIZE`` (enforced on every backend, as S3 does)."""

    @abstractmethod
    def abort(self) -> None:
        """Drop the upload and its parts; nothing becomes visible."""


class ObjectStore(ABC):
    """put / create-only put / ranged get / head / list / delete / multipart."""

    @abstractmethod
    def put(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        """Write (or overwrite) an object atomically, with user ``metadata`` (see
        ``validate_metadata``) that ``head`` returns."""

    @abstractmethod
    def put_if_absent(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        """Create an object; raise ``AlreadyExistsError`` if the key exists.

        Never retried internally when the outcome is unknown (a timeout may hide a success,
        and a retry would then report ``AlreadyExistsError`` for our own write): such
        failures surface as ``TransientError`` and the caller resolves them, e.g. by reading
        the object back and adopting it if it holds the expected bytes."""

    @abstractmethod
    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Whole object, or bytes ``[start, end)`` clamped like a slice (a range past the end
        gives ``b""``); raise ``NotFoundError`` if the key does not exist."""

    def get_view(self, key: str, start: int | None = None, end: int | None = None) -> memoryview:
        """Like ``get``, as a read-only buffer that backends may hand over without copying
        (S3: the client's own buffer). For hot read paths that parse with ``memoryview`` /
        ``struct``; use ``get`` when real ``bytes`` are needed."""
        return memoryview(self.get(key, start, end))

    @abstractmethod
    def get_suffix(self, key: str, length: int) -> bytes:
        """The last ``length`` bytes (all of them if the object is shorter); ``NotFoundError``."""

    @abstractmethod
    def head(self, key: str) -> ObjectMeta:
        """Size, etag and user metadata of an object; raise ``NotFoundError``."""

    @abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix`` and sorts after ``start_after``, sorted by
        key, fetched lazily page by page.

        Sorted means byte order on the filesystem and AWS S3, directory-tree order (segment
        by segment) on SeaweedFS; they differ only where one key has '/' where another has a
        byte below '/' (such as '-' or '.'), so callers must not rely on the order of such
        keys relative to each other."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; deleting a missing key is not an error."""

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.delete(key)

    @abstractmethod
    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        """Initiate a multipart upload; the object gets ``metadata`` once completed."""

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[PendingUpload]:
        """Uploads initiated under ``prefix`` and neither completed nor aborted (to clean up
        after crashes), sorted by key."""
        raise UnsupportedBackendError(f"{type(self).__name__} cannot list multipart uploads")

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abort the upload ``upload_id`` of ``key``, dropping its parts; aborting an upload
        that no longer exists (completed or aborted) is not an error."""
        raise UnsupportedBackendError(f"{type(self).__name__} cannot abort multipart uploads")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_object_store(uri: str, **options: Any) -> ObjectStore:
    """Open a store from a URI.

    ``file:///abs/path`` is the filesystem backend; ``s3://bucket/prefix?endpoint=...&region=...``
    the S3 backend (credentials from ``options`` or ``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY``; see ``S3Config.from_uri``). Backends are imported lazily so the
    filesystem default does not need the S3 client installed.
    """
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(f"file store URI must be file:///absolute/path, got {uri!r}")
        if parts.query:
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            raise ConfigError(f"file store URI takes no query parameters, got {query}")
        from tierlog.storage.fs_object_store import FsObjectStore

        return FsObjectStore(unquote(parts.path), **options)
    if parts.scheme == "s3":
        from tierlog.storage.s3_config import S3Config
        from tierlog.storage.s3_object_store import S3ObjectStore

        store_options = {k: options.pop(k) for k in list(options) if k in _S3_STORE_OPTIONS}
        return S3ObjectStore(S3Config.from_uri(uri, **options), **store_options)
    raise ConfigError(f"unsupported object store URI {uri!r}: use file:///path or s3://bucket")


_S3_STORE_OPTIONS = frozenset({"probe", "retry"})
