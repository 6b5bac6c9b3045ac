"""The stream catalog: which incarnation of each stream is live, and its settings.

One API over the MetaStore used by the tierer, the server and the Spark source.

Keys:

* ``catalog/{vhost}/{name}`` (both percent-encoded): JSON ``{incarnation, created_ns,
  settings}``. The incarnation is the stream directory string
  ``{vhost}_{name}_{created-ns}``, which is also the stream's object-store prefix, so
  a deleted and re-created stream can never see the old incarnation's objects.
* ``pointer/{incarnation}``: the manifest pointer ``{root uid, epoch}``, created with
  the stream and only ever updated by epoch-checked conditional puts.
* Deleting a stream deletes its catalog key and enqueues a ``stream-cleanup`` item for
  the incarnation in the same MetaStore transaction.
* ``deleted/{incarnation}``: the tombstone of a deleted incarnation (JSON
  ``{deleted_at}``), written after the catalog key is gone (by ``delete``, and again by
  the cleanup worker before it completes the item, in case the deleting node died in
  between). It is the positive answer cluster members need before they remove their
  local copy (``server.deleted_streams``): the absence of a catalog key alone could also
  mean a MetaStore that is not this cluster's. Kept for good (a few dozen bytes per
  deleted stream), so a node that was down for any time still gets the answer.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tierlog.errors import TierlogError
from tierlog.log.names import stream_dir_name
from tierlog.remote.errors import CorruptPointerError, StreamExistsError, StreamNotFoundError
from tierlog.remote.settings import (
    StreamSettings,
    check_new_settings,
    check_tier_mode_unchanged,
)
from tierlog.storage.errors import AlreadyExistsError, NotFoundError, VersionConflictError
from tierlog.storage.meta_store import CleanupItem, MetaStore

CLEANUP_QUEUE = "stream-cleanup"


@dataclass(frozen=True, slots=True)
class StreamRecord:
    vhost: str
    name: str
    incarnation: str
    created_ns: int
    settings: StreamSettings
    version: int


@dataclass(frozen=True, slots=True)
class ManifestPointer:
    """Which root object is the committed manifest, written under which epoch.

    ``sealed``: the stream was created encrypted and has stayed so, so the root, every
    branch and every offloaded segment index its manifest names must be sealed; readers
    refuse a plaintext one put in their place (a downgrade by someone with bucket access
    only: the pointer lives in the MetaStore). Set when the stream is created, kept by each
    commit while the stream is encrypted, dropped for good once it is not. Absent from the
    pointers of other streams, which are unchanged."""

    root_uid: str | None
    epoch: int
    version: int
    sealed: bool = False

    def encode(self) -> bytes:
        body: dict[str, object] = {"root": self.root_uid, "epoch": self.epoch}
        if self.sealed:
            body["sealed"] = True
        return json.dumps(body).encode()

    @staticmethod
    def decode(value: bytes, version: int) -> ManifestPointer:
        try:
            data = json.loads(value)
            root = data["root"]
            if root is not None:
                bytes.fromhex(root)
            sealed = data.get("sealed", False)
            if not isinstance(sealed, bool):
                raise TypeError(f"sealed is {sealed!r}")
            return ManifestPointer(root, int(data["epoch"]), version, sealed)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptPointerError(
                f"manifest pointer (version {version}) does not decode: {exc}"
            ) from exc


def catalog_key(vhost: str, name: str) -> str:
    return f"catalog/{quote(vhost, safe='')}/{quote(name, safe='')}"


def pointer_key(incarnation: str) -> str:
    return f"pointer/{quote(incarnation, safe='')}"


def deleted_key(incarnation: str) -> str:
    return f"deleted/{quote(incarnation, safe='')}"


class Catalog:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def create(
        self,
        vhost: str,
        name: str,
        settings: StreamSettings | None = None,
        created_ns: int | None = None,
    ) -> StreamRecord:
        settings = settings or StreamSettings()
        created_ns = created_ns if created_ns is not None else time.time_ns()
        incarnation = stream_dir_name(vhost, name, created_ns)  # validates both names
        if self.meta.get(catalog_key(vhost, name)) is not None:
            raise StreamExistsError(f"stream {name!r} already exists in vhost {vhost!r}")
        # Pointer first: an orphaned pointer (crash in between) is harmless, a catalog
        # entry without its pointer is not.
        # created encrypted: every manifest object it will ever name is sealed (the flag
        # stays while the stream stays encrypted, see ``ManifestPointer.sealed``)
        empty = ManifestPointer(None, 0, 0, sealed=settings.encryption != "none")
        with contextlib.suppress(AlreadyExistsError):
            self.meta.create(pointer_key(incarnation), empty.encode(), epoch=0)
        body = {
            "vhost": vhost,
            "name": name,
            "incarnation": incarnation,
            "created_ns": created_ns,
            "settings": settings.to_dict(),
        }
        try:
            stored = self.meta.create(catalog_key(vhost, name), json.dumps(body).encode())
        except AlreadyExistsError as exc:
            raise StreamExistsError(f"stream {name!r} already exists in vhost {vhost!r}") from exc
        return self._record(stored.value, stored.version)

    @staticmethod
    def _record(value: bytes, version: int) -> StreamRecord:
        data: dict[str, Any] = json.loads(value)
        return StreamRecord(
            vhost=data["vhost"],
            name=data["name"],
            incarnation=data["incarnation"],
            created_ns=int(data["created_ns"]),
            settings=StreamSettings.from_dict(data["settings"]),
            version=version,
        )

    def get(self, vhost: str, name: str) -> StreamRecord | None:
        stored = self.meta.get(catalog_key(vhost, name))
        return None if stored is None else self._record(stored.value, stored.version)

    def require(self, vhost: str, name: str) -> StreamRecord:
        record = self.get(vhost, name)
        if record is None:
            raise StreamNotFoundError(f"no stream {name!r} in vhost {vhost!r}")
        return record

    def list(self) -> list[StreamRecord]:
        return [self._record(v.value, v.version) for v in self.meta.list("catalog/")]

    def update_settings(self, vhost: str, name: str, **changes: Any) -> StreamRecord:
        """Change settings with a version-checked write (retried on a racing update)."""
        for _ in range(16):
            record = self.require(vhost, name)
            check_tier_mode_unchanged(record.settings, changes)
            settings = record.settings.updated(**changes)
            check_new_settings(settings)
            body = {
                "vhost": vhost,
                "name": name,
                "incarnation": record.incarnation,
                "created_ns": record.created_ns,
                "settings": settings.to_dict(),
            }
            try:
                stored = self.meta.put_if(
                    catalog_key(vhost, name), json.dumps(body).encode(), record.version, 0
                )
            except VersionConflictError:
                continue
            return self._record(stored.value, stored.version)
        raise VersionConflictError(f"settings of {name!r} keep changing under us")

    def delete(self, vhost: str, name: str) -> StreamRecord:
        """Remove the stream and, in the same transaction, enqueue its cleanup."""
        record = self.require(vhost, name)
        payload = json.dumps({"incarnation": record.incarnation, "deleted_at": time.time()})
        try:
            self.meta.delete(
                catalog_key(vhost, name),
                expected_version=record.version,
                cleanup=(CLEANUP_QUEUE, payload.encode()),
            )
        except NotFoundError as exc:
            raise StreamNotFoundError(f"no stream {name!r} in vhost {vhost!r}") from exc
        # after the catalog key is gone, never before (a tombstone of a live stream would
        # make its members drop their copies); if this write fails the cleanup worker
        # writes it before completing the item, so the deletion itself stands
        with contextlib.suppress(TierlogError, OSError):
            self.mark_deleted(record.incarnation)
        return record

    def mark_deleted(self, incarnation: str) -> None:
        """Write the tombstone of a deleted incarnation (idempotent). Call it only once
        the incarnation's catalog key is gone."""
        payload = json.dumps({"deleted_at": time.time()}).encode()
        with contextlib.suppress(AlreadyExistsError):
            self.meta.create(deleted_key(incarnation), payload)

    def is_deleted(self, incarnation: str) -> bool:
        """Whether ``incarnation`` was deleted (its tombstone exists): a positive answer,
        never guessed from a missing catalog key. MetaStore errors propagate."""
        return self.meta.get(deleted_key(incarnation)) is not None

    def pending_cleanups(self) -> builtins.list[tuple[CleanupItem, str, float]]:
        """(item, incarnation, deleted_at) for every stream still being cleaned up."""
        out = []
        for item in self.meta.pending(CLEANUP_QUEUE):
            data = json.loads(item.payload)
            out.append((item, str(data["incarnation"]), float(data["deleted_at"])))
        return out

    # --- the manifest pointer -------------------------------------------------------
    def read_pointer(self, incarnation: str) -> ManifestPointer | None:
        """The committed pointer, or None when the incarnation was deleted."""
        stored = self.meta.get(pointer_key(incarnation))
        return None if stored is None else ManifestPointer.decode(stored.value, stored.version)

    def put_pointer(
        self,
        incarnation: str,
        root_uid: str,
        epoch: int,
        expected_version: int,
        *,
        sealed: bool = False,
    ) -> int:
        """Conditional put (version unchanged, stored epoch <= epoch); the new version.

        Raises VersionConflictError, EpochFencedError, KeyDeletedError (stream deleted)."""
        value = ManifestPointer(root_uid, epoch, 0, sealed).encode()
        return self.meta.put_if(pointer_key(incarnation), value, expected_version, epoch).version

    def delete_pointer(self, incarnation: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.meta.delete(pointer_key(incarnation))
