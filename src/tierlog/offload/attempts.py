"""In-flight offload attempts in the MetaStore: {attempt uuid, multipart upload id}.

An attempt is recorded *before* anything is uploaded and gets the multipart upload id right
after the upload is initiated, so after a crash at any step recovery knows which objects and
which upload to clean up. The record goes once the offload is committed (or cleaned up).
Only in-flight attempts live here: committed offloads are recorded in the manifest.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid as uuid_module
from dataclasses import dataclass

from tierlog.offload.errors import AttemptExistsError
from tierlog.offload.keys import attempt_key, attempts_prefix
from tierlog.storage.errors import AlreadyExistsError, NotFoundError
from tierlog.storage.meta_store import MetaStore, Versioned


@dataclass(frozen=True, slots=True)
class Attempt:
    stream_dir: str
    first_offset: int
    uuid: uuid_module.UUID
    upload_id: str | None
    started: float
    version: int  # the MetaStore version of the record

    @property
    def key(self) -> str:
        return attempt_key(self.stream_dir, self.first_offset, self.uuid)


def _encode(
    stream_dir: str, first: int, uuid: uuid_module.UUID, upload_id: str | None, started: float
) -> bytes:
    return json.dumps(
        {
            "stream_dir": stream_dir,
            "segment": first,
            "uuid": str(uuid),
            "upload_id": upload_id,
            "started": started,
        },
        sort_keys=True,
    ).encode()


def _decode(stored: Versioned) -> Attempt:
    value = json.loads(stored.value)
    return Attempt(
        value["stream_dir"],
        int(value["segment"]),
        uuid_module.UUID(value["uuid"]),
        value["upload_id"],
        float(value["started"]),
        stored.version,
    )


class AttemptLog:
    """The attempts of one stream."""

    def __init__(self, meta: MetaStore, stream_dir: str) -> None:
        self.meta = meta
        self.stream_dir = stream_dir

    def begin(self, first_offset: int, uuid: uuid_module.UUID) -> Attempt:
        """Record an attempt before its upload starts."""
        key = attempt_key(self.stream_dir, first_offset, uuid)
        started = time.time()
        try:
            stored = self.meta.create(
                key, _encode(self.stream_dir, first_offset, uuid, None, started)
            )
        except AlreadyExistsError:
            raise AttemptExistsError(
                f"offload attempt {uuid} of segment {first_offset} is already recorded"
            ) from None
        return _decode(stored)

    def set_upload_id(self, attempt: Attempt, upload_id: str) -> Attempt:
        value = _encode(
            self.stream_dir, attempt.first_offset, attempt.uuid, upload_id, attempt.started
        )
        stored = self.meta.put_if(attempt.key, value, attempt.version, 0)
        return _decode(stored)

    def clear(self, first_offset: int, uuid: uuid_module.UUID) -> None:
        """Forget an attempt (committed or cleaned up); clearing twice is not an error."""
        with contextlib.suppress(NotFoundError):
            self.meta.delete(attempt_key(self.stream_dir, first_offset, uuid))

    def list(self) -> list[Attempt]:
        return [_decode(v) for v in self.meta.list(attempts_prefix(self.stream_dir))]
