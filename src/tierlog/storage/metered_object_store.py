"""An ObjectStore wrapper that records every request into the server's metrics:
count by operation and outcome, bytes each way, upload and GET latency, GET sizes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from tierlog.metrics import Metrics
from tierlog.storage.errors import StorageError
from tierlog.storage.object_store import (
    Buffer,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PendingUpload,
)

T = TypeVar("T")


class MeteredObjectStore(ObjectStore):
    """Counts every call as (op, outcome); outcome is "ok" or the error class name."""

    def __init__(self, inner: ObjectStore, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics
        requests = metrics.object_store_requests
        self._ok = {
            op: requests.labels(op=op, outcome="ok")
            for op in ("put", "put_if_absent", "get", "head", "list", "delete", "multipart")
        }

    def _count(self, op: str, call: Callable[[], T]) -> T:
        try:
            result = call()
        except StorageError as exc:
            self.metrics.object_store_requests.labels(op=op, outcome=type(exc).__name__).inc()
            raise
        self._ok[op].inc()
        return result

    def _upload(self, op: str, data: Buffer, call: Callable[[], ObjectMeta]) -> ObjectMeta:
        with self.metrics.upload_seconds.labels(op=op).time():
            meta = self._count(op, call)
        self.metrics.object_store_uploaded_bytes.inc(len(data))
        return meta

    def _get(self, call: Callable[[], T], size: Callable[[T], int]) -> T:
        metrics = self.metrics
        with metrics.remote_read_seconds.time():
            data = self._count("get", call)
        n = size(data)
        metrics.object_store_downloaded_bytes.inc(n)
        metrics.remote_get_bytes.observe(n)
        return data

    def put(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        return self._upload("put", data, lambda: self.inner.put(key, data, metadata=metadata))

    def put_if_absent(
        self, key: str, data: Buffer, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectMeta:
        call = lambda: self.inner.put_if_absent(key, data, metadata=metadata)  # noqa: E731
        return self._upload("put_if_absent", data, call)

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return self._get(lambda: self.inner.get(key, start, end), len)

    def get_view(self, key: str, start: int | None = None, end: int | None = None) -> memoryview:
        return self._get(lambda: self.inner.get_view(key, start, end), lambda v: v.nbytes)

    def get_suffix(self, key: str, length: int) -> bytes:
        return self._get(lambda: self.inner.get_suffix(key, length), len)

    def head(self, key: str) -> ObjectMeta:
        return self._count("head", lambda: self.inner.head(key))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectMeta]:
        self._ok["list"].inc()
        return self.inner.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self._count("delete", lambda: self.inner.delete(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._count("delete", lambda: self.inner.delete_many(keys))

    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        call = lambda: self.inner.create_multipart(key, metadata=metadata)  # noqa: E731
        return self._count("multipart", call)

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[PendingUpload]:
        return self._count("multipart", lambda: self.inner.list_multipart_uploads(prefix))

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self._count("multipart", lambda: self.inner.abort_multipart(key, upload_id))

    def close(self) -> None:
        self.inner.close()
