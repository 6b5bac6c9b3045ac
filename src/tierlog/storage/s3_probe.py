"""The S3 store's start-up probe: does the server enforce create-only puts?

Servers that ignore ``If-None-Match: *`` would silently overwrite immutable fragments, so a
probe key is created twice (the second create must be refused) before the store is used;
any bad endpoint, credentials or bucket surfaces here too, with a clear error. The probe
object is deleted in any case, persisting through lost replies; a probe key left by a
process killed mid-probe (or a delete that kept failing) is removed by a later probe once it
is older than ``STALE_PROBE_S`` (younger ones may be another server's probe in flight).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from tierlog.logs import get_logger
from tierlog.storage.errors import (
    AlreadyExistsError,
    StorageError,
    TransientError,
    UnsupportedBackendError,
)

if TYPE_CHECKING:
    from tierlog.storage.s3_object_store import S3ObjectStore

STALE_PROBE_S = 600.0  # far longer than any start-up probe

log = get_logger(__name__)


def probe_create_only(store: S3ObjectStore) -> None:
    """Raise ``UnsupportedBackendError`` if a second create of one key succeeds, or the
    store's typed error (naming the store) if the probe cannot run at all."""
    from tierlog.storage.s3_object_store import PROBE_PREFIX

    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        try:
            _remove_stale_probes(store)
            store.put_if_absent(key, b"probe")
        except StorageError as exc:
            raise type(exc)(f"{store} unusable: {exc}") from exc
        try:
            store.put_if_absent(key, b"probe again")
        except AlreadyExistsError:
            return
        raise UnsupportedBackendError(
            f"{store} does not enforce create-only puts (If-None-Match: *): a second "
            "create of the same key succeeded. tierlog needs it to keep fragments "
            "immutable; use a server that supports conditional writes."
        )
    finally:
        _delete_probe(store, key)


def _delete_probe(store: S3ObjectStore, key: str, rounds: int = 3) -> None:
    """Delete the probe key, persisting through a few policy rounds (deletes are
    idempotent); if it still fails, a later probe removes it, and the real outcome of the
    probe is what the caller sees."""
    for attempt in range(1, rounds + 1):
        try:
            store.delete(key)
            return
        except TransientError as exc:
            if attempt == rounds:
                log.warning("probe_delete_failed", key=key, error=str(exc))
        except StorageError as exc:
            log.warning("probe_delete_failed", key=key, error=str(exc))
            return


def _remove_stale_probes(store: S3ObjectStore) -> None:
    cutoff = time.time() - STALE_PROBE_S
    stale = [
        m.key
        for m in store.probe_objects()
        if m.last_modified is not None and m.last_modified < cutoff
    ]
    if stale:
        store.delete_many(stale)
