"""The ObjectStore interface: what tierlog needs from S3-like storage.

Synchronous by design: backends release the GIL during I/O (obstore) or do plain
file I/O, so callers get concurrency from a thread pool; the asyncio server wraps
calls with ``asyncio.to_thread``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tierlog.storage.errors import InvalidKeyError

MAX_KEY_BYTES = 1024

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    key: str
    size: int
    etag: str | None = None
    last_modified: float | None = None  # seconds since the epoch


def validate_key(key: str) -> str:
    """Reject keys that are empty, too long, absolute or that could escape the store root."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError("object key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"object key longer than {MAX_KEY_BYTES} bytes: {key[:64]!r}...")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidKeyError(f"invalid object key {key!r}")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKeyError(f"invalid object key {key!r}: empty, '.' or '..' segment")
    return key


class MultipartUpload(ABC):
    """A multipart upload in progress. Part numbers start at 1; each part is exactly
    the bytes given (S3 requires every part but the last to be >= 5 MiB)."""

    key: str

    @abstractmethod
    def put_part(self, part_number: int, data: Buffer) -> None: ...

    @abstractmethod
    def complete(self) -> ObjectMeta: ...

    @abstractmethod
    def abort(self) -> None: ...


class ObjectStore(ABC):
    """put / create-only put / ranged get / head / list / delete / multipart."""

    @abstractmethod
    def put(self, key: str, data: Buffer) -> ObjectMeta:
        """Write (or overwrite) an object atomically."""

    @abstractmethod
    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        """Create an object; raise ``AlreadyExistsError`` if the key exists."""

    @abstractmethod
    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Whole object, or bytes ``[start, end)``; raise ``NotFoundError``."""

    @abstractmethod
    def get_suffix(self, key: str, length: int) -> bytes:
        """The last ``length`` bytes (all of them if the object is shorter)."""

    @abstractmethod
    def head(self, key: str) -> ObjectMeta: ...

    @abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix``, sorted by key, paginated lazily."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; deleting a missing key is not an error."""

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.delete(key)

    @abstractmethod
    def create_multipart(self, key: str) -> MultipartUpload: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
