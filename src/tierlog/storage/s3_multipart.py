"""Multipart uploads to S3 with caller-chosen part boundaries, on boto3.

obstore's Python API only exposes multipart inside ``put``, which cuts parts itself at a
fixed ``chunk_size``; the offloader needs part N to be exactly the N-th block it hands over.
Listing the uploads a crash left behind uses boto3 too. Every request goes through the
store's retry policy (``S3ObjectStore.retried_call``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from tierlog.storage.errors import NotFoundError, PermanentError
from tierlog.storage.object_store import (
    MIN_PART_SIZE,
    Buffer,
    InvalidRangeError,
    MultipartUpload,
    ObjectMeta,
    PendingUpload,
    short_key,
    validate_part,
)

if TYPE_CHECKING:
    from tierlog.storage.s3_object_store import S3ObjectStore


def list_pending_uploads(store: S3ObjectStore, prefix: str) -> Iterator[PendingUpload]:
    """Uploads initiated under ``prefix`` and neither completed nor aborted, sorted by key
    (ListMultipartUploads, page by page)."""
    client = store.boto_client()
    strip = len(store._full_key("")) if store.config.prefix else 0
    markers: dict[str, str] = {}
    found: list[PendingUpload] = []
    while True:
        page = store.retried_call(
            f"list_uploads {prefix!r}",
            partial(
                client.list_multipart_uploads,
                Bucket=store.config.bucket,
                Prefix=store._full_key(prefix),
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
        created = store.retried_call(
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
        result = self._store.retried_call(
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
            self._store.retried_call(f"complete multipart {short_key(self.key)}", complete_once)
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
            self._store.retried_call(
                f"abort multipart {short_key(self.key)}",
                lambda: self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self._full_key, UploadId=self.upload_id
                ),
            )
        self._done = True
