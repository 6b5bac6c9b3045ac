"""Reading the committed manifest: the pointer, then the root object it names.

A root named by the pointer may have been superseded and deleted (after the grace
period) between the two reads; the pointer has then moved on, so it is read again.
Every reader of the committed manifest (writer resolution, cross-tier reader, Spark
planning and jobs) goes through here.
"""

from __future__ import annotations

from tierlog.remote.catalog import Catalog, ManifestPointer
from tierlog.remote.keys import root_key
from tierlog.storage.errors import NotFoundError, TransientError
from tierlog.storage.object_store import ObjectStore

ROOT_READ_ATTEMPTS = 10


def read_committed_root(
    catalog: Catalog,
    store: ObjectStore,
    prefix: str,
    incarnation: str,
    attempts: int = ROOT_READ_ATTEMPTS,
) -> tuple[ManifestPointer | None, bytes | None]:
    """``(pointer, root bytes)``; ``(None, None)`` when the incarnation was deleted and
    ``(pointer, None)`` before its first commit. TransientError when the root keeps
    disappearing."""
    for _ in range(attempts):
        pointer = catalog.read_pointer(incarnation)
        if pointer is None or pointer.root_uid is None:
            return pointer, None
        try:
            return pointer, store.get(
                root_key(prefix, incarnation, bytes.fromhex(pointer.root_uid))
            )
        except NotFoundError:
            continue  # superseded and deleted under us: the pointer moved on
    raise TransientError(f"manifest root of {incarnation} keeps disappearing")
