"""Stream deletion cleanup: the durable queue's worker.

``Catalog.delete`` removes the catalog entry and enqueues a cleanup item in one
MetaStore transaction. ``run_stream_cleanups`` (run on start and whenever woken) takes
every pending item and, idempotently: deletes the incarnation's manifest pointer (so a
writer still tiering it gets a typed "stream deleted" error) and its key-index pointer,
every remote object under the incarnation's prefix (offloaded segments included), its
pending multipart uploads and in-flight offload records, consumer offsets kept in the
MetaStore, and the local stream directory; then writes the incarnation's tombstone (the
positive "deleted" answer cluster members act on) and completes the item. A crash anywhere just
means the next run repeats the remaining steps.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from tierlog.logs import get_logger
from tierlog.remote.catalog import Catalog
from tierlog.remote.consumer_offsets import ConsumerOffsets
from tierlog.remote.key_index_manifest import pointer_key as key_index_pointer_key
from tierlog.remote.keys import offload_attempts_prefix, stream_prefix
from tierlog.storage.errors import NotFoundError, UnsupportedBackendError
from tierlog.storage.object_store import ObjectStore

log = get_logger(__name__)

DELETE_BATCH = 1000


def clean_incarnation(
    catalog: Catalog, store: ObjectStore, prefix: str, incarnation: str, data_dir: str | None
) -> int:
    """Delete everything of one incarnation; returns how many objects went."""
    catalog.delete_pointer(incarnation)
    with contextlib.suppress(NotFoundError):
        catalog.meta.delete(key_index_pointer_key(incarnation))
    prefix_of_stream = stream_prefix(prefix, incarnation)
    with contextlib.suppress(UnsupportedBackendError):  # a store without multipart uploads
        for upload in list(store.list_multipart_uploads(prefix_of_stream)):
            store.abort_multipart(upload.key, upload.upload_id)
    for record in catalog.meta.list(offload_attempts_prefix(incarnation)):
        with contextlib.suppress(NotFoundError):
            catalog.meta.delete(record.key)
    ConsumerOffsets(catalog.meta).remove_all(incarnation)  # stored by read-only nodes
    removed = 0
    batch: list[str] = []
    for meta in store.list(prefix_of_stream):
        batch.append(meta.key)
        if len(batch) >= DELETE_BATCH:
            store.delete_many(batch)
            removed += len(batch)
            batch = []
    if batch:
        store.delete_many(batch)
        removed += len(batch)
    if data_dir is not None:
        local = os.path.join(data_dir, incarnation)
        if os.path.isdir(local):
            shutil.rmtree(local)
    return removed


def run_stream_cleanups(
    catalog: Catalog, store: ObjectStore, prefix: str = "", data_dir: str | None = None
) -> list[str]:
    """Finish every pending stream cleanup; returns the incarnations cleaned."""
    done = []
    for item, incarnation, _deleted_at in catalog.pending_cleanups():
        removed = clean_incarnation(catalog, store, prefix, incarnation, data_dir)
        catalog.mark_deleted(incarnation)  # in case the deleting node died before it did
        catalog.meta.complete(item)
        log.info("stream_cleanup_done", incarnation=incarnation, objects=removed)
        done.append(incarnation)
    return done
