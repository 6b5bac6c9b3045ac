"""An ObjectStore wrapper that counts requests by operation and outcome (for metrics)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tierlog.storage.errors import StorageError
from tierlog.storage.object_store import Buffer, MultipartUpload, ObjectMeta, ObjectStore

T = TypeVar("T")


class MeteredObjectStore(ObjectStore):
    """Counts every call as (op, outcome); outcome is "ok" or the error class name."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.bytes_out = 0
        self.bytes_in = 0

    def _count(self, op: str, call: Callable[[], T]) -> T:
        try:
            result = call()
        except StorageError as exc:
            with self._lock:
                self.counts[(op, type(exc).__name__)] += 1
            raise
        with self._lock:
            self.counts[(op, "ok")] += 1
        return result

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)

    def put(self, key: str, data: Buffer) -> ObjectMeta:
        self.bytes_out += len(data)
        return self._count("put", lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: Buffer) -> ObjectMeta:
        self.bytes_out += len(data)
        return self._count("put_if_absent", lambda: self.inner.put_if_absent(key, data))

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        data = self._count("get", lambda: self.inner.get(key, start, end))
        self.bytes_in += len(data)
        return data

    def get_view(self, key: str, start: int | None = None, end: int | None = None) -> memoryview:
        data = self._count("get", lambda: self.inner.get_view(key, start, end))
        self.bytes_in += data.nbytes
        return data

    def get_suffix(self, key: str, length: int) -> bytes:
        data = self._count("get", lambda: self.inner.get_suffix(key, length))
        self.bytes_in += len(data)
        return data

    def head(self, key: str) -> ObjectMeta:
        return self._count("head", lambda: self.inner.head(key))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        with self._lock:
            self.counts[("list", "ok")] += 1
        return self.inner.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self._count("delete", lambda: self.inner.delete(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._count("delete", lambda: self.inner.delete_many(keys))

    def create_multipart(self, key: str) -> MultipartUpload:
        return self._count("multipart", lambda: self.inner.create_multipart(key))

    def close(self) -> None:
        self.inner.close()
